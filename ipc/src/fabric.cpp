// Fabric handles (vmm/ipc/fabric.hpp): a part of sharing that calls the driver directly.
// Memory whose provider offers no fabric handles (host memory, or a GPU without the fabric)
// is refused with the provider's reason.

#include <vmm/ipc/fabric.hpp>

#include <fmt/format.h>

#include <cstring>

#include "driver/device.hpp"
#include "driver/driver_api.hpp"
#include "gpu_context.hpp"

namespace vmm::ipc {

fabric_handle export_fabric(const physical_allocation& memory) {
  if (!memory) throw invalid_argument("export_fabric: the allocation is empty");
  const memory_provider& provider = *memory.provider();
  if (provider.capabilities().export_kind != handle_kind::fabric)
    throw invalid_argument(fmt::format("export_fabric: {} memory has no fabric handles: {}",
                                       to_string(provider.capabilities().where),
                                       provider.capabilities().fabric_unavailable_reason));
  const int device = context_device(provider);
  driver::primary_context context(device);
  driver::scoped_context current(context.get());
  CUmemFabricHandle exported{};
  VMM_DRIVER_CHECK(
      cuMemExportToShareableHandle,
      [&] {
        return fmt::format("cuMemExportToShareableHandle(size={}, fabric) on gpu {}", memory.size(), device);
      },
      static_cast<void*>(&exported), CUmemGenericAllocationHandle{memory.get()}, CU_MEM_HANDLE_TYPE_FABRIC,
      0ULL);
  fabric_handle result;
  static_assert(sizeof exported == sizeof result.bytes);
  std::memcpy(result.bytes.data(), &exported, sizeof exported);
  return result;
}

physical_allocation import_fabric(const std::shared_ptr<memory_provider>& provider,
                                  const fabric_handle& handle, std::size_t size) {
  require_provider(provider, "import_fabric");
  if (size == 0 || size % provider->capabilities().granularity != 0)
    throw invalid_argument(
        fmt::format("import_fabric: size {} is not a non-zero multiple of the "
                    "granularity {}",
                    size, provider->capabilities().granularity));
  if (provider->capabilities().export_kind != handle_kind::fabric)
    throw invalid_argument(fmt::format("import_fabric: {} memory cannot take fabric handles here: {}",
                                       to_string(provider->capabilities().where),
                                       provider->capabilities().fabric_unavailable_reason));
  const int device = context_device(*provider);
  CUmemFabricHandle imported_from{};
  std::memcpy(&imported_from, handle.bytes.data(), sizeof imported_from);
  driver::primary_context context(device);
  driver::scoped_context current(context.get());
  CUmemGenericAllocationHandle imported = 0;
  VMM_DRIVER_CHECK(
      cuMemImportFromShareableHandle,
      [&] { return fmt::format("cuMemImportFromShareableHandle(fabric, size={}) on gpu {}", size, device); },
      &imported, static_cast<void*>(&imported_from), CU_MEM_HANDLE_TYPE_FABRIC);
  try {
    return physical_allocation::adopt(provider, imported, size);
  } catch (...) {
    (void)driver::try_call(driver::api().cuMemRelease, imported);
    throw;
  }
}

}  // namespace vmm::ipc
