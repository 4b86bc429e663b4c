// vmm-info: prints what the driver, each GPU and the host providers offer for virtual
// memory management. On a machine without a GPU it says so in one line and exits 0.

#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "vmm/capabilities.hpp"
#include "vmm/provider.hpp"

namespace {

std::string mib(std::size_t bytes) {
  return bytes == 0 ? std::string("-") : fmt::format("{} MiB", static_cast<double>(bytes) / (1 << 20));
}

const char* yes_no(bool value) { return value ? "yes" : "no"; }

}  // namespace

int main() try {
  const vmm::system_capabilities caps = vmm::query_capabilities();
  fmt::print("os host provider: page size {} B, granularity {}, commit budget {:.1f} GiB "
             "(memfd + mmap, no CUDA)\n",
             caps.os_page_size, mib(caps.os_host_granularity.minimum),
             static_cast<double>(caps.os_host_commit_budget) / (1u << 30));
  if (!caps.driver_loaded) {
    fmt::print("no GPU: {}\n", caps.driver_problem);
    return 0;
  }
  fmt::print("CUDA driver {}.{}, {} GPU(s)\n", caps.driver_version / 1000,
             (caps.driver_version % 1000) / 10, caps.devices.size());
  for (const vmm::device_capabilities& d : caps.devices) {
    fmt::print("gpu {}: {} (sm_{}{}), {:.1f} GiB\n", d.ordinal, d.name, d.compute_capability_major,
               d.compute_capability_minor, static_cast<double>(d.total_memory) / (1u << 30));
    fmt::print("  vmm {} | posix fd {} | fabric attribute {} | host-numa vmm {} (node {})\n",
               yes_no(d.vmm_supported), yes_no(d.posix_fd_supported), yes_no(d.fabric_supported),
               yes_no(d.host_numa_vmm_supported), d.host_numa_id);
    fmt::print("  granularity: device min {} rec {} | pinned host min {} rec {}\n",
               mib(d.device_granularity.minimum), mib(d.device_granularity.recommended),
               mib(d.host_numa_granularity.minimum), mib(d.host_numa_granularity.recommended));
    if (d.vmm_supported) {
      // What sharing will use: fabric handles only where creating one works (an IMEX channel).
      const vmm::provider_capabilities& offered =
          vmm::provider_for(vmm::location::device(d.ordinal))->capabilities();
      const std::string& why_not = offered.fabric_unavailable_reason;
      fmt::print("  export: {}{}\n", vmm::to_string(offered.export_kind),
                 why_not.empty() ? std::string() : fmt::format(" (no fabric: {})", why_not));
    }
  }
  if (caps.devices.size() > 1) {
    fmt::print("peer access (row can access column):\n     ");
    for (std::size_t b = 0; b < caps.devices.size(); ++b) fmt::print(" gpu{}", b);
    fmt::print("\n");
    for (std::size_t a = 0; a < caps.devices.size(); ++a) {
      fmt::print("gpu{} ", a);
      for (std::size_t b = 0; b < caps.devices.size(); ++b)
        fmt::print(" {:>4}", caps.peer_access[a][b] ? "yes" : "no");
      fmt::print("\n");
    }
  }
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "vmm-info: %s\n", error.what());
  return 1;
}
