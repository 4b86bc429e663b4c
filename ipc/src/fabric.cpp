// Fabric handles (vmm/ipc/fabric.hpp): a part of sharing that calls the driver directly.
// Memory whose provider offers no fabric handles (host memory, or a GPU without the fabric)
// is refused with the provider's reason.

#include <vmm/ipc/fabric.hpp>

#include <fmt/format.h>

#include <vmm/detail/driver_sharing.hpp>

#include "gpu_context.hpp"

namespace vmm::ipc {

fabric_handle export_fabric(const physical_allocation& memory) {
  if (!memory) throw invalid_argument("export_fabric: the allocation is empty");
  const memory_provider& provider = *memory.provider();
  if (provider.capabilities().export_kind != handle_kind::fabric)
    throw invalid_argument(fmt::format("export_fabric: {} memory has no fabric handles: {}",
                                       to_string(provider.capabilities().where),
                                       provider.capabilities().fabric_unavailable_reason));
  fabric_handle result;
  result.bytes = detail::export_fabric_handle(context_device(provider), memory.get(), memory.size());
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
  const std::uint64_t imported = detail::import_fabric_handle(context_device(*provider), handle.bytes, size);
  try {
    return physical_allocation::adopt(provider, imported, size);
  } catch (...) {
    detail::release_allocation_handle(imported);
    throw;
  }
}

}  // namespace vmm::ipc
