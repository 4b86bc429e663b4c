#pragma once
/// @file
/// The parts of the pybind11 module vmm._vmm that live in their own source files.

#include <pybind11/pybind11.h>

namespace vmm_python {

/// GrowableBuffer (buffer protocol on host memory, DLPack) and the DLPack capsule maker.
void bind_buffers(pybind11::module_& m);

}  // namespace vmm_python
