#pragma once
/// @file
/// What the driver, the GPUs and the host offer: the table vmm-info prints.
///
///     vmm::system_capabilities caps = vmm::query_capabilities();   // never throws
///     if (!caps.driver_loaded) std::printf("no GPU memory: %s\n", caps.driver_problem.c_str());
///     for (const vmm::device_capabilities& gpu : caps.devices)
///       std::printf("%s: granularity %zu, fd export %d\n", gpu.name.c_str(),
///                   gpu.device_granularity.minimum, gpu.posix_fd_supported);
///
/// fabric_supported is the device attribute only: whether fabric handles can really be
/// created (an IMEX channel) is probed once when a GPU's provider is made, and
/// provider_capabilities::export_kind says the outcome. Code that has a provider asks it.

#include <cstddef>
#include <string>
#include <vector>

namespace vmm {

/// Allocation granularity for one location (0 where unsupported).
struct granularity_info {
  std::size_t minimum = 0;
  std::size_t recommended = 0;
};

/// One GPU's VMM capabilities.
struct device_capabilities {
  int ordinal = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  std::size_t total_memory = 0;
  bool vmm_supported = false;
  bool posix_fd_supported = false;  ///< handles exportable as POSIX file descriptors
  bool fabric_supported = false;    ///< the attribute; creating fabric handles may still need IMEX
  bool host_numa_vmm_supported = false;
  int host_numa_id = -1;  ///< the host NUMA node nearest the GPU, -1 if none
  granularity_info device_granularity;
  granularity_info host_numa_granularity;
};

/// Everything at once. Never throws for a missing driver or GPU: driver_loaded says.
struct system_capabilities {
  bool driver_loaded = false;
  std::string driver_problem;  ///< why not, when !driver_loaded
  int driver_version = 0;      ///< e.g. 13000 for CUDA 13.0
  std::vector<device_capabilities> devices;
  std::vector<std::vector<bool>> peer_access;  ///< peer_access[a][b]: a can access b's memory
  std::size_t os_page_size = 0;
  granularity_info os_host_granularity;   ///< what provider_for(location::os_host()) uses
  std::size_t os_host_commit_budget = 0;  ///< the bytes it commits at most (see os_host_options)
};

/// The CUDA driver version (e.g. 13000).
/// @throws vmm::driver_unavailable there is no usable driver.
[[nodiscard]] int driver_version();
/// The number of GPUs (0 never: no GPU is driver_unavailable).
/// @throws vmm::driver_unavailable there is no usable driver or GPU.
[[nodiscard]] int device_count();
/// One GPU's capabilities.
/// @throws vmm::invalid_argument unknown ordinal. @throws vmm::driver_unavailable no driver.
[[nodiscard]] device_capabilities query_device(int ordinal);
/// Whether GPU `accessor` can access memory of GPU `owner` (true when they are the same).
/// @throws vmm::invalid_argument unknown ordinal. @throws vmm::driver_unavailable no driver.
[[nodiscard]] bool can_access_peer(int accessor, int owner);
/// Whether the CUDA driver loads and sees a GPU; never throws. `why` receives the reason.
[[nodiscard]] bool gpu_available(std::string* why = nullptr) noexcept;
/// The whole table; never throws for a missing driver or GPU.
[[nodiscard]] system_capabilities query_capabilities();

}  // namespace vmm
