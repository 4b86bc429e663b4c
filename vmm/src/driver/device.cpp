#include "driver/device.hpp"

#include <fmt/format.h>

#include "driver/driver_api.hpp"
#include "vmm/error.hpp"

namespace vmm::driver {

int device_count() {
  int count = 0;
  VMM_DRIVER_CHECK(
      cuDeviceGetCount, [] { return std::string("cuDeviceGetCount()"); }, &count);
  if (count == 0) throw driver_unavailable(CUDA_ERROR_NO_DEVICE, "the CUDA driver sees no GPU");
  return count;
}

CUdevice device_at(int ordinal) {
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count)
    throw invalid_argument(
        fmt::format("unknown device {}: this machine has {} GPU{}", ordinal, count, count == 1 ? "" : "s"));
  CUdevice device = 0;
  VMM_DRIVER_CHECK(
      cuDeviceGet, [&] { return fmt::format("cuDeviceGet(ordinal={})", ordinal); }, &device, ordinal);
  return device;
}

int attribute(CUdevice_attribute which, CUdevice device) {
  int value = 0;
  VMM_DRIVER_CHECK(
      cuDeviceGetAttribute,
      [&] { return fmt::format("cuDeviceGetAttribute(attribute={}, device={})", +which, device); }, &value,
      which, device);
  return value;
}

CUmemLocation memory_location(const location& where) {
  CUmemLocation result{};
  switch (where.kind) {
    case memory_kind::device:
      result.type = CU_MEM_LOCATION_TYPE_DEVICE;
      result.id = where.id;
      break;
    case memory_kind::pinned_host:
    case memory_kind::os_host:
      result.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      result.id = where.id;
      break;
  }
  return result;
}

CUmemAllocationProp allocation_properties(const location& where, bool exportable) {
  CUmemAllocationProp properties{};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location = memory_location(where);
  properties.requestedHandleTypes =
      exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return properties;
}

std::size_t granularity(const CUmemAllocationProp& properties, CUmemAllocationGranularity_flags flag) {
  std::size_t value = 0;
  VMM_DRIVER_CHECK(
      cuMemGetAllocationGranularity,
      [&] {
        return fmt::format("cuMemGetAllocationGranularity(location type={}, id={}, flag={})",
                           +properties.location.type, properties.location.id, +flag);
      },
      &value, &properties, flag);
  return value;
}

primary_context::primary_context(int ordinal) : device_(device_at(ordinal)) {
  VMM_DRIVER_CHECK(
      cuDevicePrimaryCtxRetain, [&] { return fmt::format("cuDevicePrimaryCtxRetain(device={})", ordinal); },
      &context_, device_);
}

primary_context::~primary_context() {
  if (try_call(api().cuDevicePrimaryCtxRelease, device_) != CUDA_SUCCESS)
    report_cleanup_failure("cuDevicePrimaryCtxRelease failed");
}

scoped_context::scoped_context(CUcontext context) {
  VMM_DRIVER_CHECK(
      cuCtxGetCurrent, [] { return std::string("cuCtxGetCurrent()"); }, &previous_);
  if (previous_ != context) {
    VMM_DRIVER_CHECK(
        cuCtxSetCurrent, [] { return std::string("cuCtxSetCurrent()"); }, context);
    changed_ = true;
  }
}

scoped_context::~scoped_context() {
  if (changed_ && try_call(api().cuCtxSetCurrent, previous_) != CUDA_SUCCESS)
    report_cleanup_failure("cuCtxSetCurrent failed while restoring the previous context");
}

}  // namespace vmm::driver
