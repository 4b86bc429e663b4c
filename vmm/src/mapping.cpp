#include "vmm/mapping.hpp"

#include <utility>

#include "cleanup.hpp"
#include "vmm/error.hpp"

namespace vmm {

mapping::mapping(const physical_allocation& memory, std::uintptr_t address) {
  if (!memory) throw invalid_argument("mapping: the physical allocation is empty");
  memory.provider()->map(address, memory.size(), memory.get());
  provider_ = memory.provider();
  address_ = address;
  size_ = memory.size();
}

// Both public constructors delegate to the one above, so that once it has mapped, a throw
// from set_access runs ~mapping and unmaps: nothing is left behind.
mapping::mapping(const physical_allocation& memory, std::uintptr_t address,
                 std::span<const access_grant> grants)
    : mapping(memory, address) {
  if (!grants.empty()) provider_->set_access(address_, size_, grants);
}

mapping::mapping(const physical_allocation& memory, std::uintptr_t address, access_mode mode)
    : mapping(memory, address) {
  set_access(mode);
}

mapping::mapping(mapping&& other) noexcept
    : provider_(std::move(other.provider_)),
      address_(std::exchange(other.address_, 0)),
      size_(std::exchange(other.size_, 0)) {}

mapping& mapping::operator=(mapping&& other) noexcept {
  if (this != &other) {
    reset();
    provider_ = std::move(other.provider_);
    address_ = std::exchange(other.address_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

mapping::~mapping() {
  if (!reset()) release();  // given up: the failure was reported
}

void mapping::set_access(access_mode mode) {
  if (provider_ == nullptr) throw invalid_argument("mapping: set_access on an empty mapping");
  provider_->set_access(address_, size_, mode);
}

std::uintptr_t mapping::release() noexcept {
  provider_.reset();
  size_ = 0;
  return std::exchange(address_, 0);
}

bool mapping::reset() noexcept {
  if (provider_ == nullptr) return true;
  bool unmapped = false;
  detail::cleanup("mapping: unmap", [&] {
    provider_->unmap(address_, size_);
    unmapped = true;
  });
  if (!unmapped) return false;  // still ours: a later reset() tries again
  provider_.reset();
  address_ = 0;
  size_ = 0;
  return true;
}

}  // namespace vmm
