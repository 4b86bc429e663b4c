#pragma once
/// @file
/// One vmm::memory_resource per device for PyTorch, CuPy and the Python package: the C++
/// core under both the C interface of vmm_torch.h (what torch's CUDAPluggableAllocator
/// loads) and the pybind11 module vmm._vmm. Both are compiled into the same shared
/// library, so they act on the same resources.
///
/// Every function here throws vmm's exceptions (vmm/error.hpp); the C interface turns them
/// into status codes and a kept message, pybind11 into Python exceptions.
///
/// Rules. A device's resource is made on first use and never destroyed (tensors are freed
/// while the interpreter shuts down, after static destructors may have run). Settings apply
/// to resources made later only, so configure() refuses once any exists. While a device's
/// resource sleeps, an allocation on it is refused and a free is kept for the wake that
/// wakes every tag; sleep waits for the calls already inside the resource on other threads.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "vmm/memory_resource.hpp"
#include "vmm/unique_fd.hpp"
#include "vmm_torch.h"

namespace vmm_python {

/// Settings of the resources made from now on (vmm::memory_resource_properties).
struct resource_settings {
  /// The most physical memory a resource reserves (0: the device's memory).
  std::size_t max_size = 0;
  /// Reserved bytes above which a free gives idle pages back at once (max: never).
  std::size_t release_threshold = std::numeric_limits<std::size_t>::max();
  /// The most idle memory a resource learns to keep, a share of its peak from 0 to 1 (0:
  /// vmm's default).
  double headroom = 0;
  /// The pages of large requests (memory_resource_properties::large_page_size; 0: vmm's
  /// default, 16 times the granularity).
  std::size_t large_page_size = 0;
};

/// The number of devices a process may use (device ordinals are below it).
inline constexpr int max_devices = 64;

/// `size` bytes on `device`, usable by work on `stream` from now on, tagged with the
/// calling thread's tag; nullptr for size 0. A failure is counted in the statistics.
/// @throws vmm::invalid_argument a device out of range, or the resource is asleep.
/// @throws vmm::out_of_memory the resource or the device has no memory left.
/// @throws vmm::driver_error, vmm::os_error the driver or the OS failed.
void* allocate(std::size_t size, int device, CUstream_st* stream);

/// Frees in stream order what allocate() returned (kept for the wake while asleep).
/// @throws vmm::invalid_argument the device has no resource or the pointer is not its own
///         (counted as a bad deallocation; nothing changes).
/// @throws vmm::driver_error, vmm::os_error the driver or the OS failed.
void deallocate(void* ptr, std::size_t size, int device, CUstream_st* stream);

/// Sets the settings of the resources made from now on.
/// @throws vmm::invalid_argument a resource exists already, or the headroom is not in [0, 1].
void configure(const resource_settings& settings);

/// Makes every later "device" plain host memory of the OS provider (for tests without a GPU).
/// @throws vmm::invalid_argument a resource exists already.
void use_host_memory();

/// Whether use_host_memory() is in effect.
[[nodiscard]] bool uses_host_memory() noexcept;

/// Sets the calling thread's tag for its later allocations; returns the previous one.
std::uint32_t set_tag(std::uint32_t tag) noexcept;
/// The calling thread's tag.
[[nodiscard]] std::uint32_t current_tag() noexcept;

/// The figures of `device`'s resource (made if there is none yet).
/// @throws vmm::invalid_argument a device out of range.
/// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error making the resource failed.
[[nodiscard]] vmm_torch_statistics statistics_of(int device);

/// Sets the high-water marks to the current values. Throws as statistics_of.
void reset_peak(int device);

/// Waits for the device, gives idle pages back until at most `bytes_to_keep` are reserved,
/// then the chunk pool's idle memory and kept host copies. Throws as statistics_of.
void trim(int device, std::size_t bytes_to_keep);

/// Puts `device`'s resource to sleep, saving the allocations of `offload` to pinned host
/// memory and dropping the rest.
/// @throws vmm::invalid_argument a device out of range, or asleep already (nothing changed).
/// @throws vmm::out_of_memory the host copies could not be had (nothing changed).
/// @throws vmm::driver_error, vmm::os_error the driver or the OS failed (nothing changed).
void sleep(int device, std::span<const std::uint32_t> offload);

/// Wakes the tags `tags` (empty: all) of `device`'s resource; once every tag is awake, the
/// frees kept during the sleep are done. keep_host_copies: see vmm::after_wake.
/// @throws vmm::invalid_argument a device out of range, or not asleep (nothing changed).
/// @throws vmm::out_of_memory the memory is not there (the tags still sleep).
/// @throws vmm::driver_error, vmm::os_error the driver or the OS failed.
void wake(int device, std::span<const std::uint32_t> tags, bool keep_host_copies);

/// Whether some tag of `device` sleeps (false for a device without a resource or out of range).
[[nodiscard]] bool asleep(int device) noexcept;

/// The devices that have a resource, ascending.
[[nodiscard]] std::vector<int> devices();

/// The physical pages under a live allocation of `device`'s resource, for sharing them
/// (vmm::memory_resource::pages_of).
/// @throws vmm::invalid_argument a device out of range or without a resource, or `ptr` is not
///         a live allocation of `bytes` bytes of it.
[[nodiscard]] vmm::memory_resource::allocation_pages pages_of(int device, const void* ptr, std::size_t bytes);

/// A lease on the live allocation of `bytes` bytes at `ptr` for processes it is shared with:
/// the write end of a pipe they hold while they map the memory. A free of the allocation is
/// held until every copy of every lease on it is closed (receiver_leases.hpp).
/// @throws vmm::invalid_argument as pages_of().
/// @throws vmm::os_error no pipe could be made.
[[nodiscard]] vmm::unique_fd lease_allocation(int device, const void* ptr, std::size_t bytes);
/// Frees held for receivers now (count and bytes), after completing those whose receivers
/// have all let go.
struct held_frees {
  std::size_t frees = 0;
  std::size_t bytes = 0;
};
/// @throws vmm::invalid_argument a device out of range.
/// @throws vmm::driver_error, vmm::os_error completing a free failed.
[[nodiscard]] held_frees held_for_receivers(int device);
/// Whether `ptr` lies in an address range of `device`'s resource (false without a resource).
[[nodiscard]] bool owns(int device, const void* ptr) noexcept;

/// One allocation or free recorded while the history is on (record_history()).
struct history_event {
  bool allocate = false;  ///< an allocation, or a free (requested: it completes in stream order)
  int device = 0;
  std::uint32_t tag = 0;
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;  ///< the CUstream, 0 for the default stream
  std::uint64_t time_ns = 0;  ///< std::chrono::system_clock, since the epoch
  std::string context;        ///< what the context hook returned (the caller's stack), or empty
};

/// Called on the allocating or freeing thread for each recorded event, to describe its
/// caller (the Python module gives the Python stack). Must not throw.
using history_context_hook = std::string (*)() noexcept;

/// Starts recording (clearing what was recorded) with at most `max_entries` events kept
/// (the oldest dropped first), or stops (enabled false; what was recorded stays). `hook`
/// may be null.
/// @throws vmm::invalid_argument max_entries is 0 while enabling.
void record_history(bool enabled, std::size_t max_entries, history_context_hook hook);

/// The events recorded, oldest first.
/// @throws std::bad_alloc no memory for the copy.
[[nodiscard]] std::vector<history_event> history();

/// How messages name `device`: "gpu N", or "device N (host memory, for tests)".
[[nodiscard]] std::string name_of(int device);

}  // namespace vmm_python
