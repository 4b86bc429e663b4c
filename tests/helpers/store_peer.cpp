// A client process of tests/store_test.cpp: it talks to a vmm-store daemon through
// vmm::store::client and reports to the test over the socket it inherits as descriptor 3
// (tests/helpers/store_peer_protocol.hpp).
//
// Usage: store_peer <daemon socket> <os_host|device> <mode> [args]
// Modes:
//   hold <name> <ro|rw>      get, report; then for every word the test sends: refresh,
//                            report; exits when the test closes the socket
//   write <name>             get read-only, write to it: report write_faulted when the write
//                            faults (SIGSEGV on the host, a driver error on the GPU)
//   get_rw <name>            wait for a word, then try a read-write get; report the error
//                            code (0: granted)
//   create <name> <bytes> <seed>
//                            create, fill with pattern(seed), report; then wait (an
//                            uncommitted creation) until the test closes the socket or kills it
// Exit status: 0 done, 2 bad usage, 1 any error (printed).

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "../memory_io.hpp"
#include "store_peer_protocol.hpp"
#include "vmm/store/client.hpp"

namespace {

using vmm::testing::store_report;

store_report report_of(const vmm::store::buffer& held) {
  store_report report;
  const auto bytes =
      vmm::testing::read_bytes(*held.provider(), reinterpret_cast<std::uintptr_t>(held.data()), held.size());
  report.checksum = vmm::testing::checksum(bytes.data(), bytes.size());
  report.size = held.size();
  report.capacity = held.capacity();
  report.address = reinterpret_cast<std::uintptr_t>(held.data());
  return report;
}

// Waits for a word from the test; false when it closed the socket.
bool wait_word(int socket) {
  try {
    (void)vmm::ipc::receive_message(socket, 0, vmm::ipc::no_timeout);
    return true;
  } catch (const vmm::ipc::peer_closed&) {
    return false;
  }
}

int run(int argc, char** argv) {
  const auto arg = [&](int i) -> std::string {
    if (i >= argc) throw vmm::invalid_argument("too few arguments for this mode");
    return argv[i];
  };
  const int socket = vmm::testing::store_child_fd;
  vmm::store::client store({.socket_path = arg(1)});
  const vmm::location where = arg(2) == "device" ? vmm::location::device(0) : vmm::location::os_host();
  const std::string mode = arg(3);
  if (mode == "hold") {
    vmm::store::buffer held =
        store.get(arg(4), arg(5) == "rw" ? vmm::access_mode::read_write : vmm::access_mode::read_only);
    send_store_report(socket, report_of(held));
    while (wait_word(socket)) {
      held.refresh();
      send_store_report(socket, report_of(held));
    }
    return 0;
  }
  if (mode == "write") {
    vmm::store::buffer held = store.get(arg(4));
    store_report report = report_of(held);
    report.write_faulted =
        vmm::testing::write_faults(*held.provider(), held.data(), held.capacity(), "store_peer") ? 1 : 0;
    send_store_report(socket, report);
    // A GPU context that took a fault cannot tear down cleanly: leave that to the driver.
    if (report.write_faulted != 0 && where.kind != vmm::memory_kind::os_host) std::_Exit(0);
    return 0;
  }
  if (mode == "get_rw") {
    wait_word(socket);
    store_report report;
    try {
      vmm::store::buffer held = store.get(arg(4), vmm::access_mode::read_write);
      report = report_of(held);
    } catch (const vmm::store::store_error& error) {
      report.error = error.code();
    }
    send_store_report(socket, report);
    return 0;
  }
  if (mode == "create") {
    const std::size_t bytes = std::stoul(arg(5));
    vmm::store::buffer made = store.create(arg(4), bytes, where);
    vmm::testing::write_bytes(*made.provider(), reinterpret_cast<std::uintptr_t>(made.data()),
                              vmm::testing::pattern(bytes, static_cast<std::uint32_t>(std::stoul(arg(6)))));
    send_store_report(socket, report_of(made));
    wait_word(socket);
    return 0;
  }
  std::fprintf(stderr, "store_peer: unknown mode %s\n", mode.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 4) {
    std::fprintf(stderr, "usage: store_peer <socket> <os_host|device> <mode> [args]\n");
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  return run(argc, argv);
} catch (const std::exception& error) {
  std::fprintf(stderr, "store_peer: %s\n", error.what());
  return 1;
}
