#pragma once
/// @file
/// The C structures of the DLPack exchange format (dmlc/dlpack, include/dlpack/dlpack.h,
/// ABI of version 0.8, unversioned DLManagedTensor), as a consumer such as
/// torch.from_dlpack, cupy.from_dlpack or numpy.from_dlpack reads them from a PyCapsule
/// named "dltensor". Only what vmm exports is listed; the layout is the specification's.

#include <cstdint>

namespace vmm_python::dlpack {

/// DLDeviceType.
enum device_type : std::int32_t { cpu = 1, cuda = 2, cuda_host = 3 };

/// DLDataTypeCode.
enum type_code : std::uint8_t {
  int_code = 0,
  uint_code = 1,
  float_code = 2,
  bfloat_code = 4,
  complex_code = 5,
  bool_code = 6
};

/// DLDevice.
struct device {
  std::int32_t device_type;
  std::int32_t device_id;
};

/// DLDataType.
struct data_type {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

/// DLTensor.
struct tensor {
  void* data;
  device where;
  std::int32_t ndim;
  data_type dtype;
  std::int64_t* shape;
  std::int64_t* strides;  ///< null: compact, row-major
  std::uint64_t byte_offset;
};

/// DLManagedTensor: the consumer calls deleter(self) once it no longer needs the memory.
struct managed_tensor {
  tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(managed_tensor* self);
};

}  // namespace vmm_python::dlpack
