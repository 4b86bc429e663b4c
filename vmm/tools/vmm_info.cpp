// vmm-info: prints what the driver, each GPU and the host providers offer for virtual
// memory management, as text or (--json) as JSON whose fields docs/tools.md lists. On a
// machine without a GPU it says so and exits 0.

#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/provider.hpp"

namespace {

using json = nlohmann::ordered_json;

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

// What one GPU offers, with what vmm's provider makes of it (where the GPU supports VMM).
struct gpu_report {
  const vmm::device_capabilities& device;
  const vmm::provider_capabilities* offered = nullptr;
  [[nodiscard]] std::string nccl() const { return nccl_registration(device, offered); }
};

std::vector<gpu_report> gpus_of(const vmm::system_capabilities& caps) {
  std::vector<gpu_report> gpus;
  for (const vmm::device_capabilities& d : caps.devices)
    gpus.push_back({d, d.vmm_supported ? &vmm::provider_for(vmm::location::device(d.ordinal))->capabilities()
                                       : nullptr});
  return gpus;
}

json granularity(const vmm::granularity_info& g) {
  return {{"minimum", g.minimum}, {"recommended", g.recommended}};
}

// The capability table as JSON: docs/tools.md lists the fields, which stay stable (new ones
// may be added, none renamed).
json as_json(const vmm::system_capabilities& caps) {
  json gpus = json::array();
  for (const gpu_report& gpu : gpus_of(caps)) {
    const vmm::device_capabilities& d = gpu.device;
    json entry = {
        {"ordinal", d.ordinal},
        {"name", d.name},
        {"compute_capability", fmt::format("{}.{}", d.compute_capability_major, d.compute_capability_minor)},
        {"total_memory", d.total_memory},
        {"vmm_supported", d.vmm_supported},
        {"posix_fd_supported", d.posix_fd_supported},
        {"fabric_supported", d.fabric_supported},
        {"host_numa_vmm_supported", d.host_numa_vmm_supported},
        {"host_numa_id", d.host_numa_id},
        {"device_granularity", granularity(d.device_granularity)},
        {"host_numa_granularity", granularity(d.host_numa_granularity)},
        {"export", gpu.offered != nullptr ? json(vmm::to_string(gpu.offered->export_kind)) : json()},
        {"fabric_unavailable_reason",
         gpu.offered != nullptr && !gpu.offered->fabric_unavailable_reason.empty()
             ? json(gpu.offered->fabric_unavailable_reason)
             : json()},
        {"nccl_registration", gpu.nccl()}};
    gpus.push_back(std::move(entry));
  }
  return {{"vmm_version", vmm::version().text},
          {"os_host",
           {{"page_size", caps.os_page_size},
            {"granularity", granularity(caps.os_host_granularity)},
            {"commit_budget", caps.os_host_commit_budget}}},
          {"driver",
           {{"loaded", caps.driver_loaded},
            {"problem", caps.driver_loaded ? json() : json(caps.driver_problem)},
            {"version", caps.driver_loaded ? json(caps.driver_version) : json()}}},
          {"gpus", std::move(gpus)},
          {"peer_access", caps.peer_access}};
}

void print_text(const vmm::system_capabilities& caps) {
  fmt::print(
      "os host provider: page size {} B, granularity {}, commit budget {:.1f} GiB "
      "(memfd + mmap, no CUDA)\n",
      caps.os_page_size, mib(caps.os_host_granularity.minimum),
      static_cast<double>(caps.os_host_commit_budget) / (1u << 30));
  if (!caps.driver_loaded) {
    fmt::print("no GPU: {}\n", caps.driver_problem);
    return;
  }
  fmt::print("CUDA driver {}.{}, {} GPU(s)\n", caps.driver_version / 1000, (caps.driver_version % 1000) / 10,
             caps.devices.size());
  for (const gpu_report& gpu : gpus_of(caps)) {
    const vmm::device_capabilities& d = gpu.device;
    fmt::print("gpu {}: {} (sm_{}{}), {:.1f} GiB\n", d.ordinal, d.name, d.compute_capability_major,
               d.compute_capability_minor, static_cast<double>(d.total_memory) / (1u << 30));
    fmt::print("  vmm {} | posix fd {} | fabric attribute {} | host-numa vmm {} (node {})\n",
               yes_no(d.vmm_supported), yes_no(d.posix_fd_supported), yes_no(d.fabric_supported),
               yes_no(d.host_numa_vmm_supported), d.host_numa_id);
    fmt::print("  granularity: device min {} rec {} | pinned host min {} rec {}\n",
               mib(d.device_granularity.minimum), mib(d.device_granularity.recommended),
               mib(d.host_numa_granularity.minimum), mib(d.host_numa_granularity.recommended));
    if (gpu.offered != nullptr) {
      // What sharing will use: fabric handles only where creating one works (an IMEX channel).
      const std::string& why_not = gpu.offered->fabric_unavailable_reason;
      fmt::print("  export: {}{}\n", vmm::to_string(gpu.offered->export_kind),
                 why_not.empty() ? std::string() : fmt::format(" (no fabric: {})", why_not));
    }
    fmt::print("  nccl registration: {}\n", gpu.nccl());
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
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app(
      "Prints what the CUDA driver, each GPU and the host providers offer for virtual memory management "
      "(docs/tools.md). Without a GPU it says why and exits 0.\n"
      "Exit status: 0 done, 1 an error, 2 a bad option.",
      "vmm-info");
  vmm::tools::prepare(app);
  bool as_json_output = false;
  app.add_flag("--json", as_json_output,
               "Print the table as JSON instead of text (default: text; docs/tools.md lists the fields)");
  if (const auto status = vmm::tools::parse(app, argc, argv)) return *status;
  const vmm::system_capabilities caps = vmm::query_capabilities();
  if (as_json_output)
    std::cout << as_json(caps).dump(2, ' ', false, json::error_handler_t::replace) << '\n';
  else
    print_text(caps);
  return vmm::tools::exit_done;
} catch (const std::exception& error) {
  std::fprintf(stderr, "vmm-info: %s\n", error.what());
  return vmm::tools::exit_error;
}
