// The second process of tests/ipc/ipc_sharing_test.cpp. It talks to the test over the Unix
// socket it inherits as descriptor 3 (tests/helpers/ipc_peer_protocol.hpp).
//
// Usage: ipc_peer <os_host|device|pinned_host> <granularity, 0: the default provider> <mode> [args]
// Modes (each imports with vmm::ipc::imported_buffer::receive unless it says otherwise):
//   import <rw|ro>    import, report what it sees, exit
//   follow <rounds>   import and report; then per round: receive a growth manifest, map
//                     the tail, report (the address must not change)
//   write_read_only   import read-only, report, then write to the import: report
//                     write_faulted when the write faults (SIGSEGV on the host, a driver
//                     error on the GPU), write_succeeded otherwise
//   hold              import and report; wait for "go" (the exporter drops everything
//                     meanwhile); report again
//   die               import and report; then kill itself with SIGKILL
//   consume <rounds>  import; then per round, as a vmm::ipc::handoff_consumer: acquire,
//                     read, release, report
//   cycles <n>        n times: import, report the sampled checksum of [0, size) (the first
//                     cycle_sample_bytes of every granularity block), destroy the import;
//                     then report its own descriptor counts (peer_fd_report)
//   export <seed> <chunks> <none|truncate|extra_fd|missing_fd|wrong_size>
//                     the other way round: export a buffer of <chunks> chunks holding
//                     pattern(seed) (corrupting the manifest as asked), wait for "go" or for
//                     the test to close the socket, then exit
// Exit status: 0 when the mode completed, 2 on bad usage, 1 on any error (printed).

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "../memory_io.hpp"
#include "../process_resources.hpp"
#include "ipc_peer_protocol.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/ipc/exporter.hpp"
#include "vmm/ipc/handoff.hpp"
#include "vmm/ipc/importer.hpp"
#include "vmm/retirement.hpp"

namespace {

using vmm::testing::peer_report;
using vmm::testing::peer_status;

vmm::location parse_location(const std::string& name) {
  if (name == "os_host") return vmm::location::os_host();
  if (name == "device") return vmm::location::device(0);
  if (name == "pinned_host") return vmm::location::pinned_host(0);
  throw vmm::invalid_argument("unknown location " + name);
}

peer_report report_of(const vmm::ipc::imported_buffer& imported) {
  peer_report report;
  const auto bytes = vmm::testing::read_bytes(
      *imported.provider(), reinterpret_cast<std::uintptr_t>(imported.data()), imported.size());
  report.checksum = vmm::testing::checksum(bytes.data(), bytes.size());
  report.size = imported.size();
  report.capacity = imported.capacity();
  report.address = reinterpret_cast<std::uintptr_t>(imported.data());
  return report;
}

int run_export(const std::shared_ptr<vmm::memory_provider>& provider, int socket, std::uint32_t seed,
               std::size_t chunks, const std::string& corruption) {
  const std::size_t g = provider->capabilities().granularity;
  vmm::growable_buffer buffer(vmm::chunk_pool::create(provider),
                              {.max_size = 16 * g, .policy = vmm::chunk_policy::fixed(g)});
  buffer.resize(chunks * g);
  vmm::testing::write_bytes(*provider, reinterpret_cast<std::uintptr_t>(buffer.data()),
                            vmm::testing::pattern(chunks * g, seed));
  vmm::ipc::exporter exporter;
  vmm::ipc::exported_manifest exported = exporter.export_buffer(buffer);
  std::vector<int> fds;
  for (const vmm::unique_fd& fd : exported.fds) fds.push_back(fd.get());
  if (corruption == "none") {
    vmm::ipc::send_manifest(socket, exported);
  } else if (corruption == "truncate") {
    vmm::ipc::send_message(socket, std::span(exported.bytes).first(exported.bytes.size() - 8), fds);
  } else if (corruption == "extra_fd") {
    fds.push_back(fds.front());
    vmm::ipc::send_message(socket, exported.bytes, fds);
  } else if (corruption == "missing_fd") {
    fds.pop_back();
    vmm::ipc::send_message(socket, exported.bytes, fds);
  } else if (corruption == "wrong_size") {
    // A valid manifest whose first chunk claims twice the memory its fd holds.
    vmm::ipc::manifest forged = exported.description;
    forged.chunks.resize(1);
    forged.chunks[0].size *= 2;
    forged.end = forged.size = forged.chunks[0].size;
    vmm::ipc::send_message(socket, vmm::ipc::serialize(forged), std::span(fds).first(1));
  } else {
    throw vmm::invalid_argument("unknown corruption " + corruption);
  }
  try {
    vmm::testing::receive_go(socket);
  } catch (const vmm::ipc::peer_closed&) {
    // The importer refused the manifest and closed: as the tests of bad input expect.
  }
  return 0;
}

int run_cycles(const std::shared_ptr<vmm::memory_provider>& provider, int socket, unsigned long cycles) {
  vmm::testing::peer_fd_report fds;
  fds.before_first = vmm::testing::open_fd_count();
  for (unsigned long cycle = 1; cycle <= cycles; ++cycle) {
    peer_report report;
    {
      const vmm::ipc::imported_buffer imported = vmm::ipc::imported_buffer::receive(
          socket, {.access = vmm::access_mode::read_only, .provider = provider});
      report.checksum = vmm::testing::sampled_checksum(
          *provider, reinterpret_cast<std::uintptr_t>(imported.data()), imported.size(),
          provider->capabilities().granularity, vmm::testing::cycle_sample_bytes);
      report.size = imported.size();
      report.capacity = imported.capacity();
      report.address = reinterpret_cast<std::uintptr_t>(imported.data());
    }
    if (cycle == 1) {
      vmm::collect_retired(true);
      fds.after_first = vmm::testing::open_fd_count();
    }
    send_report(socket, report);
  }
  vmm::collect_retired(true);
  fds.after_last = vmm::testing::open_fd_count();
  vmm::testing::send_fd_report(socket, fds);
  return 0;
}

int run(int argc, char** argv) {
  const auto arg = [&](int i) -> std::string {
    if (i >= argc) throw vmm::invalid_argument("too few arguments for this mode");
    return argv[i];
  };
  const auto where = parse_location(arg(1));
  const std::size_t granularity = std::stoul(arg(2));
  const std::string mode = arg(3);
  const auto provider =
      granularity == 0 ? vmm::provider_for(where) : vmm::make_os_host_provider({.granularity = granularity});
  const int socket = vmm::testing::peer_socket_fd;
  if (mode == "cycles") return run_cycles(provider, socket, std::stoul(arg(4)));
  if (mode == "export")
    return run_export(provider, socket, static_cast<std::uint32_t>(std::stoul(arg(4))), std::stoul(arg(5)),
                      arg(6));

  vmm::ipc::import_options options{.provider = provider};
  if (mode == "write_read_only" || (mode == "import" && arg(4) == "ro"))
    options.access = vmm::access_mode::read_only;
  vmm::ipc::imported_buffer imported = vmm::ipc::imported_buffer::receive(socket, options);

  if (mode == "import") {
    send_report(socket, report_of(imported));
  } else if (mode == "follow") {
    send_report(socket, report_of(imported));
    for (int round = 0, rounds = std::stoi(arg(4)); round < rounds; ++round) {
      imported.receive_growth(socket);
      send_report(socket, report_of(imported));
    }
  } else if (mode == "write_read_only") {
    peer_report report = report_of(imported);
    const bool faulted =
        vmm::testing::write_faults(*provider, imported.data(), imported.capacity(), "ipc_peer");
    report.status = faulted ? peer_status::write_faulted : peer_status::write_succeeded;
    send_report(socket, report);
    // A GPU context that took a fault cannot tear down cleanly: leave that to the driver.
    if (faulted && where.kind != vmm::memory_kind::os_host) std::_Exit(0);
  } else if (mode == "hold") {
    send_report(socket, report_of(imported));
    vmm::testing::receive_go(socket);
    send_report(socket, report_of(imported));
  } else if (mode == "die") {
    send_report(socket, report_of(imported));
    ::kill(::getpid(), SIGKILL);
  } else if (mode == "consume") {
    vmm::ipc::handoff_consumer consumer(socket, provider);
    for (int round = 0, rounds = std::stoi(arg(4)); round < rounds; ++round) {
      consumer.acquire(nullptr);
      const peer_report report = report_of(imported);  // reads in order on the default stream
      consumer.finish(nullptr);
      send_report(socket, report);
    }
  } else {
    std::fprintf(stderr, "ipc_peer: unknown mode %s\n", mode.c_str());
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <os_host|device|pinned_host> <granularity> <mode> [args]\n",
                 argc > 0 ? argv[0] : "ipc_peer");
    return 2;
  }
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ipc_peer (%s): %s\n", argv[3], error.what());
    return 1;
  }
}
