#include "vmm/mapping.hpp"

#include <utility>

#include "vmm/detail/cleanup.hpp"
#include "vmm/error.hpp"

namespace vmm {

mapping::mapping(const physical_allocation& memory, std::uintptr_t address) {
  if (!memory) throw invalid_argument("mapping: the physical allocation is empty");
  memory.provider()->map(address, memory.size(), memory.get());
  held_ = {memory.provider(), address, memory.size()};
}

// Both public constructors delegate to the one above, so that once it has mapped, a throw
// from set_access runs ~mapping and unmaps: nothing is left behind.
mapping::mapping(const physical_allocation& memory, std::uintptr_t address,
                 std::span<const access_grant> grants)
    : mapping(memory, address) {
  if (!grants.empty()) provider()->set_access(address, size(), grants);
}

mapping::mapping(const physical_allocation& memory, std::uintptr_t address, access_mode mode)
    : mapping(memory, address) {
  set_access(mode);
}

void mapping::set_access(access_mode mode) {
  if (provider() == nullptr) throw invalid_argument("mapping: set_access on an empty mapping");
  provider()->set_access(address(), size(), provider()->capabilities().grants(mode));
}

bool mapping::unmap(const std::shared_ptr<memory_provider>& provider, std::uintptr_t address,
                    std::size_t size) noexcept {
  return detail::cleanup("mapping: unmap", [&] { provider->unmap(address, size); });
}

}  // namespace vmm
