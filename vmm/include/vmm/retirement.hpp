#pragma once
/// @file
/// Memory that objects stopped using in stream order, unmapped once the streams pass.
///
///     {
///       vmm::chunk_view view = vmm::alias(buffer, 0, n, vmm::access_mode::read_only, stream);
///       kernel<<<grid, block, 0, stream.get()>>>(view.data());
///     }                            // returns at once: the kernel may still read the view
///     vmm::collect_retired(true);  // waits for `stream`, then unmaps the view's range
///
/// cuMemUnmap does not wait for kernels that still use a range, so nothing in vmm unmaps
/// memory that queued work may still touch. Destroying a view, a striped buffer, an imported
/// buffer or a growable buffer (and shrinking one) does not block the host either: the
/// object records an event on each stream it was used with and hands its mappings, its
/// address range and its chunks to the process's retirement list. They are unmapped, freed
/// and given back to their pools once every event has passed: at the next call to
/// collect_retired(), whenever a chunk pool is about to create fresh memory, and (waiting)
/// before a chunk pool reports out of memory. Host memory's events are always done, so on
/// the OS provider all of this happens at once, before the destructor returns.
///
/// An unmap or a free that the driver or the OS refuses (ENOMEM from an munmap that would
/// split a mapping past vm.max_map_count, say) is reported and tried again at every later
/// collection: until it succeeds the memory stays mapped, the range stays allocated and
/// the chunks stay out of their pools, and then they go as if nothing had happened. The same
/// holds for a range unmapped at once (vmm/mapped_range.hpp) whose unmap fails.

#include <cstddef>

namespace vmm {

/// Unmaps and gives back what was retired and whose streams have passed; with `wait`,
/// first blocks until every retirement's streams have passed. Thread-safe. An unmap or
/// free that fails is reported (report_cleanup_failure) and tried again by a later call.
/// @throws vmm::driver_error waiting for or querying a stream's point failed.
void collect_retired(bool wait = false);

/// Retirements still waiting for their streams, or to be unmapped or freed again. Throws
/// nothing but std::system_error from a broken mutex.
[[nodiscard]] std::size_t retired_count();

}  // namespace vmm
