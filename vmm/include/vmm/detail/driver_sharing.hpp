#pragma once
// The driver calls that sharing between processes makes (vmm::ipc's fabric handles and
// interprocess events), over the core's one driver table: vmm::ipc asks for them here and
// never touches libcuda itself. Each runs in the primary context of GPU `device` and names
// the driver's handles as plain bytes and integers, so that no cuda.h type crosses.
//
// Internal (vmm/detail/): installed for vmm::ipc, which builds on it, and not part of vmm's
// interface: it may change in any release without notice.

#include <array>
#include <cstddef>
#include <cstdint>

namespace vmm::detail {

// The 64 bytes the driver names a fabric handle (CUmemFabricHandle) or an interprocess
// event (CUipcEventHandle) by.
using driver_handle_bytes = std::array<std::byte, 64>;

// cuMemExportToShareableHandle of `allocation` (a CUmemGenericAllocationHandle of `size`
// bytes, made with fabric handles) as a fabric handle.
// Throws driver_unavailable without a driver; driver_error (or out_of_memory,
// invalid_argument) when the driver refuses.
[[nodiscard]] driver_handle_bytes export_fabric_handle(int device, std::uint64_t allocation,
                                                       std::size_t size);

// cuMemImportFromShareableHandle of the fabric handle `handle` (`size` bytes): the
// allocation handle, which the caller owns (release_allocation_handle). Throws as above.
[[nodiscard]] std::uint64_t import_fabric_handle(int device, const driver_handle_bytes& handle,
                                                 std::size_t size);

// cuMemRelease of an allocation handle that nothing adopted; never throws (a cleanup path).
void release_allocation_handle(std::uint64_t allocation) noexcept;

// An event another process can open: the CUevent (as stream_executor's event_handle) and
// the bytes that name it.
struct interprocess_event_made {
  std::uint64_t event = 0;
  driver_handle_bytes handle{};
};

// cuEventCreate(INTERPROCESS | DISABLE_TIMING) and cuIpcGetEventHandle; destroys the event
// again when the second fails. Throws as above.
[[nodiscard]] interprocess_event_made create_interprocess_event(int device);

// cuIpcOpenEventHandle of `handle`: the CUevent, as stream_executor's event_handle. Throws
// as above.
[[nodiscard]] std::uint64_t open_interprocess_event(int device, const driver_handle_bytes& handle);

}  // namespace vmm::detail
