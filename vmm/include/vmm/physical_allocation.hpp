#pragma once
/// @file
/// A piece of physical memory (cuMemCreate / memfd), not yet at any address.
///
///     auto gpu = vmm::provider_for(vmm::location::device(0));
///     vmm::physical_allocation memory(gpu, 64 << 20);   // memory; no address yet
///     vmm::unique_fd fd = memory.export_fd();            // for another process, which calls
///     //   vmm::physical_allocation::import_fd(its_gpu_provider, received_fd, 64 << 20)
///     vmm::address_range range(gpu, 64 << 20);
///     vmm::mapping mapped(memory, range.address(), vmm::access_mode::read_write);
///
/// Physical memory and addresses are apart, as the driver keeps them: the same allocation
/// may be mapped at several addresses (vmm::mapping, vmm::chunk_view) and in several
/// processes. Most code takes its physical memory from a vmm::chunk_pool instead of making
/// it here, because creating and destroying memory costs the driver tens of microseconds a
/// handle.
///
/// Imported memory and export. The CUDA driver refuses to export a handle that the process
/// imported (cuMemExportToShareableHandle returns CUDA_ERROR_INVALID_VALUE), so memory that
/// must travel on from an importer (a client offering it back to a restarted vmm-store
/// daemon, a daemon serving what it was offered) is imported with import_fd(provider,
/// unique_fd, size): the allocation keeps the descriptor it came from, and export_fd() hands
/// out a duplicate of it, asking no driver. The cost is one open descriptor per such
/// allocation for as long as it lives, counted against the process's RLIMIT_NOFILE; import
/// with a borrowed fd where nothing will be exported again.

#include <cstddef>
#include <memory>

#include "vmm/provider.hpp"
#include "vmm/provider_owned.hpp"
#include "vmm/unique_fd.hpp"

namespace vmm {

/// Owns a physical memory handle; destroys it on destruction (and on move assignment), as
/// reset() does. Mappings of it stay valid after that (the memory lives until its last
/// mapping goes). Move-only.
class physical_allocation {
 public:
  /// An empty allocation.
  physical_allocation() noexcept = default;
  /// Creates at least `size` bytes (rounded up to the granularity), committed now.
  /// @throws vmm::invalid_argument size is 0 or the provider is null.
  /// @throws vmm::out_of_memory the memory is not there.
  physical_allocation(std::shared_ptr<memory_provider> provider, std::size_t size);
  /// Imports `size` bytes of physical memory from an fd made by export_fd(), possibly in
  /// another process. The caller keeps `fd`.
  /// @throws vmm::invalid_argument the fd is not such memory, or the size does not match.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error the import failed.
  [[nodiscard]] static physical_allocation import_fd(std::shared_ptr<memory_provider> provider, int fd,
                                                     std::size_t size);
  /// Imports as above, and keeps `fd` (closed with the allocation, or at once if the
  /// import fails), so that export_fd() works where the provider cannot export imported
  /// memory (see the file comment).
  /// @throws vmm::invalid_argument the fd is not such memory, or the size does not match.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error the import failed.
  [[nodiscard]] static physical_allocation import_fd(std::shared_ptr<memory_provider> provider, unique_fd fd,
                                                     std::size_t size);
  /// Takes ownership of a handle of `size` bytes obtained outside the provider (vmm::ipc
  /// imports fabric handles through the driver): see memory_provider::adopt().
  /// @throws vmm::invalid_argument the provider is null or the size is not a multiple of
  ///         the granularity; the handle is then still the caller's.
  [[nodiscard]] static physical_allocation adopt(std::shared_ptr<memory_provider> provider,
                                                 physical_handle handle, std::size_t size);

  /// The handle (0 when empty).
  [[nodiscard]] physical_handle get() const noexcept { return held_.value(); }
  /// Size in bytes (a multiple of the granularity).
  [[nodiscard]] std::size_t size() const noexcept { return held_.size(); }
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept { return held_.provider(); }
  /// Whether this holds a handle.
  explicit operator bool() const noexcept { return provider() != nullptr; }
  /// Exports the memory as a new file descriptor (send it to another process): a duplicate
  /// (F_DUPFD_CLOEXEC) of the kept descriptor when this was imported keeping it, else the
  /// provider's export.
  /// @throws vmm::invalid_argument the memory cannot be exported, or this is empty.
  /// @throws vmm::os_error the duplicate failed (EMFILE: the process's descriptor limit,
  ///         RLIMIT_NOFILE, is reached).
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error the provider's export failed.
  [[nodiscard]] unique_fd export_fd() const;
  /// Whether this keeps the descriptor it was imported from (export_fd() duplicates it).
  [[nodiscard]] bool keeps_descriptor() const noexcept { return static_cast<bool>(descriptor_); }
  /// Gives up ownership of the handle: the caller must destroy it through the provider. A
  /// kept descriptor is closed.
  physical_handle release() noexcept {
    descriptor_.reset();
    return held_.release();
  }
  /// Destroys the handle now and becomes empty, closing a kept descriptor. A destroy the
  /// provider refuses is reported (never thrown) and tried again at the next
  /// collect_retired(), unless the provider does not hold the handle at all (it was
  /// destroyed behind this owner's back): that is reported and given up, since the number
  /// may name a later allocation by then.
  void reset() noexcept {
    held_.reset();
    descriptor_.reset();
  }

 private:
  physical_allocation(std::shared_ptr<memory_provider> provider, physical_handle handle,
                      std::size_t size) noexcept;
  // Always true: a handle the provider refuses to destroy goes to the retirement list.
  static bool destroy(const std::shared_ptr<memory_provider>& provider, physical_handle handle,
                      std::size_t size) noexcept;

  detail::provider_owned<physical_handle, &physical_allocation::destroy> held_;
  unique_fd descriptor_;  // the fd the memory was imported from, when kept (-1: none)
};

}  // namespace vmm
