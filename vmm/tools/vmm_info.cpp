// vmm-info: prints what the driver, each GPU and the host providers offer for virtual
// memory management. On a machine without a GPU it says so in one line and exits 0.

#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/provider.hpp"

namespace {

std::string mib(std::size_t bytes) {
  return bytes == 0 ? std::string("-") : fmt::format("{} MiB", static_cast<double>(bytes) / (1 << 20));
}

const char* yes_no(bool value) {
  return value ? "yes" : "no";
}

// Whether NCCL can register this GPU's vmm memory (ncclCommRegister). NCCL finds the
// physical segments under a registered buffer and exports each with its own handle type
// (a POSIX fd), so every chunk must have been created exportable: vmm's driver provider
// asks for POSIX-fd handles exactly when the GPU supports them. And buffers must start on
// the recommended granularity, while vmm's page is the minimum one: the two must agree.
std::string nccl_registration(const vmm::device_capabilities& d, const vmm::provider_capabilities* offered) {
  std::vector<std::string> why_not;
  if (!d.vmm_supported) why_not.emplace_back("the GPU does not support virtual memory management");
  if (!d.posix_fd_supported)
    why_not.emplace_back(
        "no POSIX-fd handles (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0), "
        "so vmm creates its chunks unexportable");
  else if (offered != nullptr && offered->export_kind == vmm::handle_kind::none)
    why_not.emplace_back("vmm's provider cannot export this memory");
  if (offered != nullptr && offered->granularity != offered->recommended_granularity)
    why_not.emplace_back(
        fmt::format("vmm's page is the minimum granularity ({}), not the recommended one ({})",
                    mib(offered->granularity), mib(offered->recommended_granularity)));
  if (why_not.empty())
    return fmt::format("yes (VMM, POSIX-fd handles requested on every chunk, granularity {} = recommended)",
                       mib(offered != nullptr ? offered->granularity : d.device_granularity.minimum));
  std::string text = "no: " + why_not.front();
  for (std::size_t i = 1; i < why_not.size(); ++i) text += "; " + why_not[i];
  return text;
}

}  // namespace

int main() try {
  const vmm::system_capabilities caps = vmm::query_capabilities();
  fmt::print(
      "os host provider: page size {} B, granularity {}, commit budget {:.1f} GiB "
      "(memfd + mmap, no CUDA)\n",
      caps.os_page_size, mib(caps.os_host_granularity.minimum),
      static_cast<double>(caps.os_host_commit_budget) / (1u << 30));
  if (!caps.driver_loaded) {
    fmt::print("no GPU: {}\n", caps.driver_problem);
    return 0;
  }
  fmt::print("CUDA driver {}.{}, {} GPU(s)\n", caps.driver_version / 1000, (caps.driver_version % 1000) / 10,
             caps.devices.size());
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
      fmt::print("  nccl registration: {}\n", nccl_registration(d, &offered));
    } else {
      fmt::print("  nccl registration: {}\n", nccl_registration(d, nullptr));
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
