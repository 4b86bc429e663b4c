#pragma once
// The driver entry points the benchmarks' raw baselines call by hand (what a user without
// vmm would write), fetched once through the CUDA runtime (cudaGetDriverEntryPointByVersion,
// pinned to the CUDA 12.0 ABI of each function), so that nothing links libcuda.

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

namespace vmm::bench {

struct raw_driver_calls {
  decltype(&cuGetErrorName) get_error_name = nullptr;
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) get_allocation_granularity = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemAddressReserve) address_reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
};

// The entry points, fetched on first use. Throws Failure (the program's error type) naming
// the entry point the driver lacks.
template <class Failure>
const raw_driver_calls& raw_driver() {
  static const raw_driver_calls calls = [] {
    auto fetch = [](auto& fn, const char* symbol) {
      void* address = nullptr;
      cudaDriverEntryPointQueryResult status{};
      const cudaError_t result =
          cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &status);
      if (result != cudaSuccess || status != cudaDriverEntryPointSuccess || address == nullptr)
        throw Failure(std::string("the driver has no entry point ") + symbol + " (" +
                      cudaGetErrorName(result) + ", status " + std::to_string(static_cast<int>(status)) +
                      ")");
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(address);
    };
    raw_driver_calls c;
    fetch(c.get_error_name, "cuGetErrorName");
    fetch(c.device_get, "cuDeviceGet");
    fetch(c.device_get_attribute, "cuDeviceGetAttribute");
    fetch(c.get_allocation_granularity, "cuMemGetAllocationGranularity");
    fetch(c.create, "cuMemCreate");
    fetch(c.release, "cuMemRelease");
    fetch(c.address_reserve, "cuMemAddressReserve");
    fetch(c.address_free, "cuMemAddressFree");
    fetch(c.map, "cuMemMap");
    fetch(c.set_access, "cuMemSetAccess");
    fetch(c.unmap, "cuMemUnmap");
    return c;
  }();
  return calls;
}

// "CUDA_ERROR_OUT_OF_MEMORY", or the number when the driver cannot name it.
template <class Failure>
std::string raw_driver_error_name(CUresult result) {
  const char* name = nullptr;
  if (raw_driver<Failure>().get_error_name(result, &name) != CUDA_SUCCESS || name == nullptr)
    return "CUresult " + std::to_string(static_cast<int>(result));
  return name;
}

}  // namespace vmm::bench
