#pragma once
/// @file
/// Physical memory mapped at an address, with its access set.
///
///     const std::size_t g = provider->capabilities().granularity;
///     vmm::address_range range(provider, 2 * g);
///     vmm::physical_allocation a(provider, g), b(provider, g);
///     const std::span<const vmm::access_grant> none;     // map now, set access later
///     vmm::mapping first(a, range.address(), none), second(b, range.address() + g, none);
///     provider->set_access(range.address(), 2 * g,
///     provider->capabilities().grants(vmm::access_mode::read_write));

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "vmm/physical_allocation.hpp"
#include "vmm/provider.hpp"
#include "vmm/provider_owned.hpp"

namespace vmm {

/// Maps a whole physical allocation at an address inside a reservation and sets its access;
/// unmaps on destruction. The mapping does not own the allocation: the allocation may be
/// released first, and the memory lives on until this unmaps it. Move-only.
///
/// Unmapping is immediate: destroy a mapping only once no queued GPU work uses it
/// (cuMemUnmap does not wait for running kernels).
class mapping {
 public:
  mapping() noexcept = default;
  /// Maps `memory` at `address` and grants `mode` to the provider's default accessors.
  /// A failure to set access unmaps again: nothing is left behind.
  /// @throws vmm::invalid_argument the address is unaligned, not reserved, already mapped,
  ///         or the provider differs from the allocation's.
  /// @throws vmm::driver_error, vmm::os_error the map or the access was refused.
  mapping(const physical_allocation& memory, std::uintptr_t address, access_mode mode);
  /// Maps `memory` at `address` and applies `grants` (an empty span: no access yet; the
  /// caller sets it later over a larger range, one call for many mappings).
  /// @throws as the constructor above; also vmm::invalid_argument a grant cannot be given.
  mapping(const physical_allocation& memory, std::uintptr_t address, std::span<const access_grant> grants);

  /// The first address (0 when empty).
  [[nodiscard]] std::uintptr_t address() const noexcept { return held_.value(); }
  [[nodiscard]] void* data() const noexcept { return reinterpret_cast<void*>(address()); }
  [[nodiscard]] std::size_t size() const noexcept { return held_.size(); }
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept { return held_.provider(); }
  /// Changes the access of the whole mapping.
  void set_access(access_mode mode);
  /// Gives up ownership: the caller must unmap [address(), address() + size()).
  std::uintptr_t release() noexcept { return held_.release(); }
  /// Unmaps now and becomes empty. Returns false when the unmap failed (the failure is
  /// reported, not thrown): the mapping then still owns the range, and a later reset()
  /// tries again; the destructor and a move assignment try once more and then give up.
  /// While memory could not be unmapped, whoever owns it must not hand it to anyone else.
  bool reset() noexcept { return held_.reset(); }

 private:
  mapping(const physical_allocation& memory, std::uintptr_t address);  // maps, no access
  static bool unmap(const std::shared_ptr<memory_provider>& provider, std::uintptr_t address,
                    std::size_t size) noexcept;

  detail::provider_owned<std::uintptr_t, &mapping::unmap> held_;
};

}  // namespace vmm
