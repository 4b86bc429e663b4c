#pragma once
/// @file
/// Frees held for receivers: an allocation shared with other processes (vmm.share of a
/// tensor) stays out of its resource until every process that received it has let go.
///
/// Each share of an allocation makes a lease: a pipe whose write end travels with the handle
/// and whose read end stays here. Receivers keep the write end while they map the memory
/// (vmm.open's mapping holds it) and close it when they let go, or the kernel closes it when
/// they exit, however they exit. The read end reports end-of-file (POLLHUP) once no process
/// holds a write end: the lease has ended. A free of an allocation with a lease that has not
/// ended is held, with its stream, and done (in the same stream order) at a later allocate,
/// free, statistics or trim call once all its leases have ended. Nothing polls in the
/// background: a process that never calls vmm again keeps the held memory until it exits.
///
/// Thread-safe. The fast path of a free or an allocation reads one atomic counter.
#include <atomic>
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "vmm/stream_ref.hpp"
#include "vmm/unique_fd.hpp"

namespace vmm_python {

/// A free of `size` bytes at `ptr`, to be done on `stream`.
struct pending_free {
  void* ptr;
  std::size_t size;
  vmm::stream_ref stream;
};

class receiver_leases {
 public:
  /// A new lease on the allocation at `ptr`: the write end, for the receivers (close-on-exec).
  /// @throws vmm::os_error no pipe could be made.
  [[nodiscard]] vmm::unique_fd lease(const void* ptr);

  /// Called by a free: true if some lease on `ptr` has not ended, and then the free is kept
  /// to be done later (released()); false if the caller frees now (the ended leases are gone).
  /// @throws std::bad_alloc no memory to keep the free (nothing changed: free it now).
  bool hold(const pending_free& free);

  /// The kept frees whose leases have all ended, in the order they were kept, removed here.
  /// @throws std::bad_alloc no memory for the result (nothing removed).
  [[nodiscard]] std::vector<pending_free> released();

  /// Whether any allocation has a lease or a kept free (the fast path's check).
  [[nodiscard]] bool any() const noexcept { return entries_.load(std::memory_order_acquire) != 0; }

  /// Frees kept now, and their bytes.
  struct held_figures {
    std::size_t frees = 0;
    std::size_t bytes = 0;
  };
  [[nodiscard]] held_figures held() const;

 private:
  // Whether no process holds the write end of the lease's pipe any more.
  static bool ended(const vmm::unique_fd& read_end) noexcept;
  void recount() noexcept;

  mutable std::mutex mutex_;
  std::unordered_map<const void*, std::vector<vmm::unique_fd>> leases_;  // read ends, by allocation
  std::vector<pending_free> kept_;
  std::atomic<std::size_t> entries_{0};  // leases_.size() + kept_.size()
};

}  // namespace vmm_python
