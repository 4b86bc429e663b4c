#pragma once
/// @file
/// The parts of the pybind11 module vmm._vmm that live in their own source files.

#include <pybind11/pybind11.h>

namespace vmm_python {

/// Binds GrowableBuffer (buffer protocol on host memory, DLPack), ImportedBuffer and
/// share_buffer (vmm.share / vmm.open), and the DLPack capsule maker into `m`.
/// @throws pybind11::error_already_set a binding could not be added.
void bind_buffers(pybind11::module_& m);

/// Closes the descriptors the module's exporter keeps for pages that are gone (after a
/// trim gave pages back; vmm::ipc::exporter::purge).
/// @throws std::system_error a broken mutex.
void purge_shared_exports();

}  // namespace vmm_python
