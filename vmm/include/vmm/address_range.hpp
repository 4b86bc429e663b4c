#pragma once
/// @file
/// A reserved range of virtual addresses (cuMemAddressReserve / mmap PROT_NONE).

#include <cstddef>
#include <cstdint>
#include <memory>

#include "vmm/provider.hpp"

namespace vmm {

/// Owns a reservation of virtual address space; frees it on destruction. Nothing in it is
/// accessible until physical memory is mapped (vmm::mapping) and access is set.
/// Move-only. Destroy every mapping in the range first: freeing a range with mappings in
/// it is refused (and reported, from the destructor).
class address_range {
 public:
  /// An empty range (no reservation).
  address_range() noexcept = default;
  /// Reserves at least `size` bytes (rounded up to the provider's granularity), aligned to
  /// `alignment` (0: the granularity).
  /// @throws vmm::invalid_argument size is 0, the provider is null, or the alignment is bad.
  /// @throws vmm::out_of_memory no address space of that size is left.
  address_range(std::shared_ptr<memory_provider> provider, std::size_t size,
                std::size_t alignment = 0);
  address_range(address_range&& other) noexcept;
  address_range& operator=(address_range&& other) noexcept;
  address_range(const address_range&) = delete;
  address_range& operator=(const address_range&) = delete;
  ~address_range();

  /// The first address, or 0 when empty.
  [[nodiscard]] std::uintptr_t get() const noexcept { return address_; }
  /// The first address as a pointer.
  [[nodiscard]] void* data() const noexcept { return reinterpret_cast<void*>(address_); }
  /// The reserved size in bytes (a multiple of the granularity).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// The provider the range came from (null when empty).
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept { return provider_; }
  /// Gives up ownership: the caller must free [get(), get() + size()) through the provider.
  std::uintptr_t release() noexcept;
  /// Frees the range now (reporting, not throwing, on failure) and becomes empty.
  void reset() noexcept;

 private:
  std::shared_ptr<memory_provider> provider_;
  std::uintptr_t address_ = 0;
  std::size_t size_ = 0;
};

}  // namespace vmm
