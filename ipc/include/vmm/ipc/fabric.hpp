#pragma once
/// @file
/// Fabric handles: physical GPU memory named by 64 plain bytes, valid across an NVLink
/// domain where an IMEX channel exists (CU_MEM_HANDLE_TYPE_FABRIC).
///
///     auto gpu = vmm::provider_for(vmm::location::device(0));
///     if (gpu->capabilities().export_kind == vmm::handle_kind::fabric) {
///       vmm::ipc::fabric_handle name = vmm::ipc::export_fabric(chunk.memory());
///       // ... the bytes travel in a message; in the other process:
///       vmm::physical_allocation memory = vmm::ipc::import_fabric(gpu, name, size);
///     }
///
/// Whether a GPU's memory is created with fabric handles is decided once, when its
/// provider is made (provider_capabilities::export_kind and fabric_unavailable_reason say
/// which and why not); vmm::ipc's exporter then uses them, and POSIX fds otherwise.

#include <vmm/physical_allocation.hpp>
#include <vmm/provider.hpp>

#include <array>
#include <cstddef>
#include <memory>

namespace vmm::ipc {

/// The 64 bytes that name physical memory to another process through the fabric
/// (CUmemFabricHandle). Plain bytes: they travel in a message, not as a file descriptor.
struct fabric_handle {
  std::array<std::byte, 64> bytes{};
  friend bool operator==(const fabric_handle&, const fabric_handle&) = default;
};

/// Exports `memory` as a fabric handle.
/// @throws vmm::invalid_argument the memory is empty, or its provider's export_kind is not
///         fabric (the message carries fabric_unavailable_reason).
/// @throws vmm::driver_error the export failed.
[[nodiscard]] fabric_handle export_fabric(const physical_allocation& memory);

/// Imports `size` bytes of physical memory from a fabric handle, possibly of another
/// process or node, as memory of `provider` (a GPU provider whose export_kind is fabric).
/// @throws vmm::invalid_argument the provider is null, fabric handles are not available
///         here, or the size is not a multiple of the granularity.
/// @throws vmm::driver_error the driver refused the handle (CUDA_ERROR_NOT_PERMITTED: this
///         process has no access to the exporter's IMEX channel).
[[nodiscard]] physical_allocation import_fabric(const std::shared_ptr<memory_provider>& provider,
                                                const fabric_handle& handle, std::size_t size);

}  // namespace vmm::ipc
