#include "vmm/address_range.hpp"

#include <utility>

#include "vmm/detail/cleanup.hpp"
#include "vmm/error.hpp"

namespace vmm {
namespace {

std::shared_ptr<memory_provider> require(std::shared_ptr<memory_provider> provider) {
  if (provider == nullptr) throw invalid_argument("address_range: the provider is null");
  return provider;
}

}  // namespace

address_range::address_range(std::shared_ptr<memory_provider> provider, std::size_t size,
                             std::size_t alignment) {
  provider = require(std::move(provider));
  size = size == 0 ? 0 : round_up(size, provider->capabilities().granularity);
  const std::uintptr_t address = provider->allocate_range(size, alignment);
  held_ = {std::move(provider), address, size};
}

bool address_range::free_range(const std::shared_ptr<memory_provider>& provider, std::uintptr_t address,
                               std::size_t size) noexcept {
  return detail::cleanup("address_range: free", [&] { provider->free_range(address, size); });
}

}  // namespace vmm
