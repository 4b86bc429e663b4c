#pragma once
// The only code that touches libcuda. libcuda.so.1 is opened at run time with dlopen and
// every entry point is fetched once through cuGetProcAddress with the version pinned below:
// the version whose signature cuda.h declares for that name. Nothing links libcuda, so a
// machine without a driver runs the rest of the library (the OS provider) unharmed; asking
// for the driver there throws vmm::driver_unavailable saying what is missing.

#include <cuda.h>

#include <string>

#include "fault_injection.hpp"

namespace vmm::driver {

// (name, pinned CUDA version). Keep it sorted by topic; every entry point vmm uses is here.
#define VMM_DRIVER_ENTRY_POINTS(X)         \
  X(cuInit, 2000)                          \
  X(cuDriverGetVersion, 2020)              \
  X(cuGetErrorName, 6000)                  \
  X(cuGetErrorString, 6000)                \
  X(cuDeviceGetCount, 2000)                \
  X(cuDeviceGet, 2000)                     \
  X(cuDeviceGetName, 2000)                 \
  X(cuDeviceGetAttribute, 2000)            \
  X(cuDeviceTotalMem, 3020)                \
  X(cuDeviceCanAccessPeer, 4000)           \
  X(cuDevicePrimaryCtxRetain, 7000)        \
  X(cuDevicePrimaryCtxRelease, 11000)      \
  X(cuCtxGetCurrent, 4000)                 \
  X(cuCtxSetCurrent, 4000)                 \
  X(cuCtxSynchronize, 2000)                \
  X(cuMemGetInfo, 3020)                    \
  X(cuMemAddressReserve, 10020)            \
  X(cuMemAddressFree, 10020)               \
  X(cuMemCreate, 10020)                    \
  X(cuMemRelease, 10020)                   \
  X(cuMemMap, 10020)                       \
  X(cuMemUnmap, 10020)                     \
  X(cuMemSetAccess, 10020)                 \
  X(cuMemGetAllocationGranularity, 10020)  \
  X(cuMemExportToShareableHandle, 10020)   \
  X(cuMemImportFromShareableHandle, 10020) \
  X(cuMemHostRegister, 6050)               \
  X(cuMemHostUnregister, 4000)             \
  X(cuMemcpyAsync, 4000)                   \
  X(cuMemsetD8Async, 3020)                 \
  X(cuStreamCreate, 2000)                  \
  X(cuStreamDestroy, 4000)                 \
  X(cuStreamSynchronize, 2000)             \
  X(cuStreamWaitEvent, 3020)               \
  X(cuEventCreate, 2000)                   \
  X(cuEventDestroy, 4000)                  \
  X(cuEventRecord, 2000)                   \
  X(cuEventQuery, 2000)                    \
  X(cuEventSynchronize, 2000)              \
  X(cuIpcGetEventHandle, 4010)             \
  X(cuIpcOpenEventHandle, 4010)

#define VMM_DRIVER_CHECK(name, describe, ...) \
  ::vmm::driver::check(::vmm::driver::api().name, #name, describe __VA_OPT__(, ) __VA_ARGS__)

// One typed pointer per entry point; null where the driver lacks it (too old).
struct entry_points {
#define VMM_DRIVER_DECLARE(name, version) decltype(&::name) name = nullptr;
  VMM_DRIVER_ENTRY_POINTS(VMM_DRIVER_DECLARE)
#undef VMM_DRIVER_DECLARE
};

// The loaded driver, initialised (cuInit) on first use.
// Throws vmm::driver_unavailable when libcuda.so.1 cannot be opened, lacks
// cuGetProcAddress, or cuInit fails (no GPU: CUDA_ERROR_NO_DEVICE).
const entry_points& api();

// Whether api() would succeed; never throws. The reason is stored in *why when it fails.
bool available(std::string* why = nullptr) noexcept;

// "CUDA_ERROR_OUT_OF_MEMORY" (or "CUresult 12345" when the driver cannot name it).
std::string error_name(CUresult result) noexcept;

// Throws the vmm exception that fits `result` (out_of_memory for
// CUDA_ERROR_OUT_OF_MEMORY, invalid_argument for CUDA_ERROR_INVALID_VALUE /
// INVALID_DEVICE, driver_error otherwise) with "<call> failed: <name> (<what>)".
[[noreturn]] void throw_error(CUresult result, const std::string& call_and_arguments);

// Throws driver_unavailable: "the driver (version N) is too old for <name>".
[[noreturn]] void throw_missing(const char* name);

// Calls an entry point that may be missing (driver too old): the one place every driver
// call goes through, so a test can make the Nth of them fail (fault_injection.hpp).
template <class Fn, class... Args>
CUresult try_call(Fn* entry, Args... args) noexcept {
  if (entry == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (int injected = 0; detail::fault::fail_here(detail::fault::driver, injected))
    return static_cast<CUresult>(injected);
  return entry(args...);
}

// The throwing form: checks that the entry point exists and that the call succeeded.
// `describe` builds the "call(arguments)" text only when an error is thrown.
template <class Fn, class Describe, class... Args>
void check(Fn* entry, const char* name, Describe&& describe, Args... args) {
  if (entry == nullptr) throw_missing(name);
  if (CUresult result = try_call(entry, args...); result != CUDA_SUCCESS) throw_error(result, describe());
}

}  // namespace vmm::driver
