#include "driver/driver_api.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>

#include "vmm/error.hpp"

namespace vmm::driver {
namespace {

struct loaded_driver {
  entry_points entries;
  int version = 0;
  std::string failure;  // empty when the driver loaded and initialised
};

using get_proc_address_fn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                         CUdriverProcAddressQueryResult*);

loaded_driver load() {
  loaded_driver driver;
  // Kept open for the life of the process: entry points must outlive every static object.
  void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* reason = ::dlerror();
    driver.failure = fmt::format("the CUDA driver (libcuda.so.1) could not be loaded: {}",
                                 reason != nullptr ? reason : "unknown reason");
    return driver;
  }
  auto get_proc = reinterpret_cast<get_proc_address_fn>(::dlsym(library, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    driver.failure = "the CUDA driver is too old: libcuda.so.1 has no cuGetProcAddress_v2 (needs CUDA 12.0+)";
    return driver;
  }
  // A missing or too-new entry point stays null; check() names it when it is called.
#define VMM_DRIVER_FETCH(name, pinned)                                                        \
  {                                                                                           \
    void* fn = nullptr;                                                                       \
    CUdriverProcAddressQueryResult status{};                                                  \
    if (get_proc(#name, &fn, pinned, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS && \
        status == CU_GET_PROC_ADDRESS_SUCCESS)                                                \
      driver.entries.name = reinterpret_cast<decltype(driver.entries.name)>(fn);              \
  }
  VMM_DRIVER_ENTRY_POINTS(VMM_DRIVER_FETCH)
#undef VMM_DRIVER_FETCH

  if (driver.entries.cuInit == nullptr || driver.entries.cuDriverGetVersion == nullptr) {
    driver.failure = "the CUDA driver does not provide cuInit/cuDriverGetVersion";
    return driver;
  }
  driver.entries.cuDriverGetVersion(&driver.version);
  if (CUresult result = driver.entries.cuInit(0); result != CUDA_SUCCESS) {
    const char* name = nullptr;
    if (driver.entries.cuGetErrorName != nullptr) driver.entries.cuGetErrorName(result, &name);
    driver.failure = fmt::format("cuInit failed: {} (driver version {}){}",
                                 name != nullptr ? name : fmt::format("CUresult {}", +result), driver.version,
                                 result == CUDA_ERROR_NO_DEVICE ? ": no GPU is present" : "");
  }
  return driver;
}

const loaded_driver& instance() {
  static const loaded_driver driver = load();
  return driver;
}

}  // namespace

const entry_points& api() {
  const loaded_driver& driver = instance();
  if (!driver.failure.empty()) throw driver_unavailable(0, driver.failure);
  return driver.entries;
}

bool available(std::string* why) noexcept {
  try {
    const loaded_driver& driver = instance();
    if (why != nullptr) *why = driver.failure;
    return driver.failure.empty();
  } catch (...) {
    if (why != nullptr) *why = "the CUDA driver could not be loaded";
    return false;
  }
}

std::string error_name(CUresult result) noexcept {
  try {
    const char* name = nullptr;
    const loaded_driver& driver = instance();
    if (driver.entries.cuGetErrorName != nullptr) driver.entries.cuGetErrorName(result, &name);
    return name != nullptr ? std::string(name) : fmt::format("CUresult {}", +result);
  } catch (...) {
    return "CUresult ?";
  }
}

void throw_error(CUresult result, const std::string& call_and_arguments) {
  std::string message = fmt::format("{} failed: {}", call_and_arguments, error_name(result));
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      throw out_of_memory(std::move(message));
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_DEVICE:
      throw invalid_argument(message);
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
      throw driver_unavailable(result, std::move(message));
    default:
      throw driver_error(result, std::move(message));
  }
}

void throw_missing(const char* name) {
  throw driver_unavailable(
      CUDA_ERROR_NOT_FOUND,
      fmt::format("the CUDA driver (version {}) is too old for {}: the pinned version of this "
                  "entry point is not provided",
                  instance().version, name));
}

}  // namespace vmm::driver
