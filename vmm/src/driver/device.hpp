#pragma once
// Device-level helpers over the driver: ordinal checks, allocation properties,
// granularity queries, and primary contexts.

#include <cuda.h>

#include <cstddef>

#include "vmm/location.hpp"

namespace vmm::driver {

// Number of GPUs the driver sees (at least 1). Throws driver_unavailable when there is no
// driver or no GPU.
int device_count();

// Throws vmm::invalid_argument naming `ordinal` and the device count when it is out of range.
CUdevice device_at(int ordinal);

int attribute(CUdevice_attribute attribute, CUdevice device);

// The allocation properties vmm uses for memory at `where` (device or pinned_host).
// `exportable` requests POSIX-fd handles (device memory only; host memory cannot be).
CUmemAllocationProp allocation_properties(const location& where, bool exportable);

// cuMemGetAllocationGranularity for `properties`.
std::size_t granularity(const CUmemAllocationProp& properties, CUmemAllocationGranularity_flags flag);

// CUmemLocation of an accessor: a device, or the host (HOST_NUMA) for host locations.
CUmemLocation memory_location(const location& where);

// A retained primary context; released on destruction.
class primary_context {
 public:
  explicit primary_context(int ordinal);
  primary_context(const primary_context&) = delete;
  primary_context& operator=(const primary_context&) = delete;
  ~primary_context();
  [[nodiscard]] CUcontext get() const noexcept { return context_; }

 private:
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

// Makes `context` current on this thread for the guard's life, restoring the previous one.
class scoped_context {
 public:
  explicit scoped_context(CUcontext context);
  scoped_context(const scoped_context&) = delete;
  scoped_context& operator=(const scoped_context&) = delete;
  ~scoped_context();

 private:
  CUcontext previous_ = nullptr;
  bool changed_ = false;
};

}  // namespace vmm::driver
