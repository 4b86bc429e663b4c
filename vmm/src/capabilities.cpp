#include "vmm/capabilities.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <array>

#include "driver/device.hpp"
#include "driver/driver_api.hpp"
#include "vmm/error.hpp"
#include "vmm/location.hpp"
#include "vmm/provider.hpp"

namespace vmm {

int driver_version() {
  int version = 0;
  VMM_DRIVER_CHECK(
      cuDriverGetVersion, [] { return std::string("cuDriverGetVersion()"); }, &version);
  return version;
}

int device_count() {
  return driver::device_count();
}

bool gpu_available(std::string* why) noexcept {
  if (!driver::available(why)) return false;
  try {
    (void)device_count();
    return true;
  } catch (const std::exception& error) {
    if (why != nullptr) *why = error.what();
    return false;
  }
}

device_capabilities query_device(int ordinal) {
  const CUdevice device = driver::device_at(ordinal);
  device_capabilities result;
  result.ordinal = ordinal;
  std::array<char, 256> name{};
  VMM_DRIVER_CHECK(
      cuDeviceGetName, [&] { return fmt::format("cuDeviceGetName(device={})", ordinal); }, name.data(),
      static_cast<int>(name.size()), device);
  result.name = name.data();
  VMM_DRIVER_CHECK(
      cuDeviceTotalMem, [&] { return fmt::format("cuDeviceTotalMem(device={})", ordinal); },
      &result.total_memory, device);
  result.compute_capability_major = driver::attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  result.compute_capability_minor = driver::attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  result.vmm_supported =
      driver::attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) != 0;
  result.posix_fd_supported =
      driver::attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device) != 0;
  result.fabric_supported = driver::attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, device) != 0;
  result.host_numa_vmm_supported =
      driver::attribute(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) != 0;
  result.host_numa_id = driver::attribute(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device);
  auto granularities = [](const location& where) {
    const CUmemAllocationProp properties = driver::allocation_properties(where, false);
    return granularity_info{driver::granularity(properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                            driver::granularity(properties, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)};
  };
  if (result.vmm_supported) result.device_granularity = granularities(location::device(ordinal));
  if (result.host_numa_vmm_supported)
    result.host_numa_granularity =
        granularities(location::pinned_host(result.host_numa_id < 0 ? 0 : result.host_numa_id));
  return result;
}

bool can_access_peer(int accessor, int owner) {
  const CUdevice a = driver::device_at(accessor);
  const CUdevice b = driver::device_at(owner);
  if (accessor == owner) return true;
  int can = 0;
  VMM_DRIVER_CHECK(
      cuDeviceCanAccessPeer,
      [&] { return fmt::format("cuDeviceCanAccessPeer(device={}, peer={})", accessor, owner); }, &can, a, b);
  return can != 0;
}

system_capabilities query_capabilities() {
  system_capabilities result;
  result.os_page_size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto os = provider_for(location::os_host());
  result.os_host_granularity = {os->capabilities().granularity, os->capabilities().recommended_granularity};
  result.os_host_commit_budget = os->capabilities().physical_memory_size;
  if (!gpu_available(&result.driver_problem)) {
    if (driver::available()) result.driver_version = driver_version();
    return result;
  }
  result.driver_loaded = true;
  result.driver_version = driver_version();
  const int count = device_count();
  for (int ordinal = 0; ordinal < count; ++ordinal) result.devices.push_back(query_device(ordinal));
  result.peer_access.assign(static_cast<std::size_t>(count),
                            std::vector<bool>(static_cast<std::size_t>(count)));
  for (int a = 0; a < count; ++a)
    for (int b = 0; b < count; ++b)
      result.peer_access[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] = can_access_peer(a, b);
  return result;
}

}  // namespace vmm
