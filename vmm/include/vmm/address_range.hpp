#pragma once
/// @file
/// A range of virtual addresses, owned (cuMemAddressReserve / mmap PROT_NONE).
///
///     vmm::address_range range(vmm::provider_for(vmm::location::device(0)), 1 << 30);
///     vmm::physical_allocation memory(range.provider(), 2 << 20);
///     vmm::mapping mapped(memory, range.address(), vmm::access_mode::read_write);
///     use(mapped.data());   // unmapped, then the range freed, as the objects go

#include <cstddef>
#include <cstdint>
#include <memory>

#include "vmm/provider.hpp"
#include "vmm/provider_owned.hpp"

namespace vmm {

/// Owns a range of virtual address space (memory_provider::allocate_range); frees it on
/// destruction. Nothing in it is accessible until physical memory is mapped (vmm::mapping)
/// and access is set. Move-only. Destroy every mapping in the range first: freeing a range
/// with mappings in it is refused (and reported, from the destructor and a move assignment,
/// which then give the addresses up).
class address_range {
 public:
  /// An empty range.
  address_range() noexcept = default;
  /// Allocates at least `size` bytes of addresses (rounded up to the provider's
  /// granularity), aligned to `alignment` (0: the granularity).
  /// @throws vmm::invalid_argument size is 0, the provider is null, or the alignment is bad.
  /// @throws vmm::out_of_memory no address space of that size is left.
  address_range(std::shared_ptr<memory_provider> provider, std::size_t size, std::size_t alignment = 0);

  /// The first address, or 0 when empty.
  [[nodiscard]] std::uintptr_t address() const noexcept { return held_.value(); }
  /// The first address as a pointer.
  [[nodiscard]] void* data() const noexcept { return reinterpret_cast<void*>(address()); }
  /// The size in bytes (a multiple of the granularity).
  [[nodiscard]] std::size_t size() const noexcept { return held_.size(); }
  /// The provider the range came from (null when empty).
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept { return held_.provider(); }
  /// Gives up ownership: the caller must free [address(), address() + size()) through the
  /// provider.
  std::uintptr_t release() noexcept { return held_.release(); }
  /// Frees the range now and becomes empty. Returns false when the free failed (the
  /// failure is reported, not thrown): the range then still owns the addresses, and a later
  /// reset() tries again; the destructor tries once more and then gives up.
  bool reset() noexcept { return held_.reset(); }

 private:
  static bool free_range(const std::shared_ptr<memory_provider>& provider, std::uintptr_t address,
                         std::size_t size) noexcept;

  detail::provider_owned<std::uintptr_t, &address_range::free_range> held_;
};

}  // namespace vmm
