// The driver calls of sharing between processes (vmm/detail/driver_sharing.hpp).

#include "vmm/detail/driver_sharing.hpp"

#include <fmt/format.h>

#include <cstring>

#include "driver/device.hpp"
#include "driver/driver_api.hpp"

namespace vmm::detail {

driver_handle_bytes export_fabric_handle(int device, std::uint64_t allocation, std::size_t size) {
  driver::primary_context context(device);
  driver::scoped_context current(context.get());
  CUmemFabricHandle exported{};
  VMM_DRIVER_CHECK(
      cuMemExportToShareableHandle,
      [&] { return fmt::format("cuMemExportToShareableHandle(size={}, fabric) on gpu {}", size, device); },
      static_cast<void*>(&exported), CUmemGenericAllocationHandle{allocation}, CU_MEM_HANDLE_TYPE_FABRIC,
      0ULL);
  driver_handle_bytes result;
  static_assert(sizeof exported == sizeof result);
  std::memcpy(result.data(), &exported, sizeof exported);
  return result;
}

std::uint64_t import_fabric_handle(int device, const driver_handle_bytes& handle, std::size_t size) {
  CUmemFabricHandle imported_from{};
  static_assert(sizeof imported_from == sizeof handle);
  std::memcpy(&imported_from, handle.data(), sizeof imported_from);
  driver::primary_context context(device);
  driver::scoped_context current(context.get());
  CUmemGenericAllocationHandle imported = 0;
  VMM_DRIVER_CHECK(
      cuMemImportFromShareableHandle,
      [&] { return fmt::format("cuMemImportFromShareableHandle(fabric, size={}) on gpu {}", size, device); },
      &imported, static_cast<void*>(&imported_from), CU_MEM_HANDLE_TYPE_FABRIC);
  return imported;
}

void release_allocation_handle(std::uint64_t allocation) noexcept {
  (void)driver::try_call(driver::api().cuMemRelease, CUmemGenericAllocationHandle{allocation});
}

interprocess_event_made create_interprocess_event(int device) {
  driver::primary_context context(device);
  driver::scoped_context current(context.get());
  CUevent event = nullptr;
  VMM_DRIVER_CHECK(
      cuEventCreate,
      [&] { return fmt::format("cuEventCreate(INTERPROCESS | DISABLE_TIMING) on gpu {}", device); }, &event,
      static_cast<unsigned>(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
  CUipcEventHandle exported{};
  if (const CUresult result = driver::try_call(driver::api().cuIpcGetEventHandle, &exported, event);
      result != CUDA_SUCCESS) {
    (void)driver::try_call(driver::api().cuEventDestroy, event);
    driver::throw_error(result, fmt::format("cuIpcGetEventHandle() on gpu {}", device));
  }
  interprocess_event_made made;
  static_assert(sizeof exported == sizeof made.handle);
  std::memcpy(made.handle.data(), &exported, sizeof exported);
  made.event = reinterpret_cast<std::uint64_t>(event);
  return made;
}

std::uint64_t open_interprocess_event(int device, const driver_handle_bytes& handle) {
  CUipcEventHandle opened{};
  static_assert(sizeof opened == sizeof handle);
  std::memcpy(&opened, handle.data(), sizeof opened);
  driver::primary_context context(device);
  driver::scoped_context current(context.get());
  CUevent event = nullptr;
  VMM_DRIVER_CHECK(
      cuIpcOpenEventHandle, [&] { return fmt::format("cuIpcOpenEventHandle() on gpu {}", device); }, &event,
      opened);
  return reinterpret_cast<std::uint64_t>(event);
}

}  // namespace vmm::detail
