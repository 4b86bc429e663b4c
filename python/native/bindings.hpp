#pragma once
/// @file
/// The parts of the pybind11 module vmm._vmm that live in their own source files.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vmm/location.hpp"

namespace vmm_python {

/// Binds GrowableBuffer (buffer protocol on host memory, DLPack), ImportedBuffer and
/// share_buffer (vmm.share / vmm.open), and the DLPack capsule maker into `m`.
/// @throws pybind11::error_already_set a binding could not be added.
void bind_buffers(pybind11::module_& m);

/// Closes the descriptors the module's exporter keeps for pages that are gone (after a
/// trim gave pages back; vmm::ipc::exporter::purge).
/// @throws std::system_error a broken mutex.
void purge_shared_exports();

/// Binds the vmm-store client and daemon (vmm.store) into `m`.
/// @throws pybind11::error_already_set a binding could not be added.
void bind_store(pybind11::module_& m);

/// "os_host", "pinned_host" or "pinned_host:NODE", "cuda" or "cuda:ORDINAL" as a location.
/// @throws vmm::invalid_argument any other text, naming it.
vmm::location parse_location(std::string_view text);
/// The name parse_location reads back.
std::string name_of(const vmm::location& where);
/// (DLDeviceType, device id) of memory at `where`.
std::pair<int, int> dlpack_device_of(const vmm::location& where);
/// A DLPack capsule over [data, data + product(shape) * bits / 8) of `owner`'s memory, which
/// it holds until the consumer is done.
/// @throws vmm::invalid_argument bits is not a whole number of bytes, or an extent is negative.
/// @throws pybind11::error_already_set the capsule could not be made.
pybind11::capsule dlpack_capsule(pybind11::object owner, std::uintptr_t data,
                                 const std::vector<std::int64_t>& shape, std::uint8_t code, std::uint8_t bits,
                                 std::pair<int, int> device);

}  // namespace vmm_python
