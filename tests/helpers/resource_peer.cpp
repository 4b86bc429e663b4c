// The second process of tests/ipc/resource_sharing_test.cpp: it imports another process's
// memory_resource and does what the test asks (tests/helpers/resource_peer_protocol.hpp),
// over the Unix socket it inherits as descriptor 3.
//
// Usage: resource_peer <os_host|device> [keep_mapped_bytes]
// It first reports its address space's usage before anything is imported (the baseline),
// then receives the resource message and answers commands until the test closes the
// socket. Exit status: 0 when the test closed the socket, 2 on bad usage, 1 on any error
// (printed).

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <map>
#include <optional>
#include <string>

#include "../memory_io.hpp"
#include "resource_peer_protocol.hpp"
#include "vmm/ipc/handoff.hpp"
#include "vmm/ipc/resource_sharing.hpp"
#include "vmm/retirement.hpp"

namespace {

using namespace vmm::testing;

vmm::location parse_location(const std::string& name) {
  if (name == "os_host") return vmm::location::os_host();
  if (name == "device") return vmm::location::device(0);
  throw vmm::invalid_argument("unknown location " + name);
}

resource_peer_report report_of(const vmm::ipc::imported_resource* shared,
                               const vmm::ipc::imported_pointer* pointer, vmm::memory_provider& provider) {
  resource_peer_report report;
  if (pointer != nullptr && *pointer) {
    const auto bytes =
        read_bytes(provider, reinterpret_cast<std::uintptr_t>(pointer->data()), pointer->size());
    report.checksum = checksum(bytes.data(), bytes.size());
    report.address = reinterpret_cast<std::uintptr_t>(pointer->data());
    report.size = pointer->size();
  }
  if (shared != nullptr) {
    const vmm::ipc::imported_resource_statistics s = shared->statistics();
    report.pointers = s.pointers;
    report.segments = s.segments;
    report.pages_mapped = s.pages_mapped;
    report.pages_imported = s.pages_imported;
    report.pages_shared = s.pages_shared;
    report.pages_released = s.pages_released;
    report.pages_reused = s.pages_reused;
    report.cached_bytes = s.cached_bytes;
  }
  const vmm::address_space_usage usage = provider.address_space().usage();
  report.ranges = usage.ranges;
  report.handles = usage.handles;
  report.mappings = usage.mappings;
  report.mapped_bytes = usage.mapped_bytes;
  return report;
}

int run(const std::string& where_name, std::size_t keep_mapped_bytes) {
  const int socket = peer_socket_fd;
  const auto provider = vmm::provider_for(parse_location(where_name));
  send_resource_report(socket, report_of(nullptr, nullptr, *provider));  // the baseline
  vmm::ipc::imported_resource shared = vmm::ipc::imported_resource::receive(
      socket, {.provider = provider, .keep_mapped_bytes = keep_mapped_bytes});
  const vmm::owned_stream stream(provider->executor());
  std::map<std::uint32_t, vmm::ipc::imported_pointer> slots;
  std::optional<vmm::ipc::handoff_consumer> consumer;
  for (;;) {
    resource_peer_command command;
    try {
      command = receive_command(socket);
    } catch (const vmm::ipc::peer_closed&) {
      return 0;
    }
    vmm::ipc::imported_pointer& slot = slots[command.slot];
    resource_peer_status status = resource_peer_status::ok;
    switch (command.op) {
      case resource_peer_op::import:
        slot = shared.receive_pointer(socket, stream.get());
        break;
      case resource_peer_op::release:
        slot.reset();
        break;
      case resource_peer_op::report:
        break;
      case resource_peer_op::fill:
        provider->executor().fill(slot.data(), static_cast<std::uint8_t>(command.value), slot.size(),
                                  stream.get());
        provider->executor().synchronize(stream.get());
        break;
      case resource_peer_op::consume:
        if (!consumer) consumer.emplace(socket, provider);
        consumer->acquire(stream.get());  // the stream waits for the exporter's work
        provider->executor().fill(slot.data(), static_cast<std::uint8_t>(command.value), slot.size(),
                                  stream.get());
        slot.reset();                    // unmapped once the fill has passed
        consumer->finish(stream.get());  // the exporter's stream waits for the fill
        break;
      case resource_peer_op::trim:
        shared.trim();
        break;
      case resource_peer_op::die:
        ::kill(::getpid(), SIGKILL);
        break;
      case resource_peer_op::allocate:
        try {
          (void)shared.allocate(stream.get(), 4096);
          status = resource_peer_status::allocation_allowed;
        } catch (const vmm::invalid_argument& error) {
          status =
              std::string(error.what()).find("cannot allocate from an imported resource") != std::string::npos
                  ? resource_peer_status::allocation_refused
                  : resource_peer_status::allocation_other;
        } catch (const std::exception&) {
          status = resource_peer_status::allocation_other;
        }
        break;
      default:
        std::fprintf(stderr, "resource_peer: unknown command %u\n", static_cast<unsigned>(command.op));
        return 1;
    }
    // What was let go of is unmapped once its stream passes: wait for that, so that the
    // report counts what is mapped and nothing waiting.
    if (command.op == resource_peer_op::release || command.op == resource_peer_op::consume ||
        command.op == resource_peer_op::trim)
      vmm::collect_retired(true);
    resource_peer_report report = report_of(&shared, &slot, *provider);
    report.status = status;
    send_resource_report(socket, report);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s <os_host|device> [keep_mapped_bytes]\n",
                 argc > 0 ? argv[0] : "resource_peer");
    return 2;
  }
  try {
    return run(argv[1], argc == 3 ? static_cast<std::size_t>(std::stoull(argv[2])) : 0);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "resource_peer: %s\n", error.what());
    return 1;
  }
}
