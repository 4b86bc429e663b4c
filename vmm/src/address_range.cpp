#include "vmm/address_range.hpp"

#include <utility>

#include "cleanup.hpp"
#include "vmm/error.hpp"

namespace vmm {
namespace {

std::shared_ptr<memory_provider> require(std::shared_ptr<memory_provider> provider) {
  if (provider == nullptr) throw invalid_argument("address_range: the provider is null");
  return provider;
}

}  // namespace

address_range::address_range(std::shared_ptr<memory_provider> provider, std::size_t size,
                             std::size_t alignment)
    : provider_(require(std::move(provider))),
      size_(size == 0 ? 0 : round_up(size, provider_->granularity())) {
  address_ = provider_->allocate_range(size_, alignment);
}

address_range::address_range(address_range&& other) noexcept
    : provider_(std::move(other.provider_)),
      address_(std::exchange(other.address_, 0)),
      size_(std::exchange(other.size_, 0)) {}

address_range& address_range::operator=(address_range&& other) noexcept {
  if (this != &other) {
    if (!reset()) release();  // given up: the failure was reported
    provider_ = std::move(other.provider_);
    address_ = std::exchange(other.address_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

address_range::~address_range() {
  if (!reset()) release();  // given up: the failure was reported
}

std::uintptr_t address_range::release() noexcept {
  provider_.reset();
  size_ = 0;
  return std::exchange(address_, 0);
}

bool address_range::reset() noexcept {
  if (address_ != 0) {
    bool freed = false;
    detail::cleanup("address_range: free", [&] {
      provider_->free_range(address_, size_);
      freed = true;
    });
    if (!freed) return false;  // still ours: a later reset() tries again
  }
  provider_.reset();
  address_ = 0;
  size_ = 0;
  return true;
}

}  // namespace vmm
