// A client process of tests/store/store_test.cpp: it talks to a vmm-store daemon through
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
//   tensor <name> <tensor>  get the tensor set, report the checksum, bytes (size) and
//                            address of that tensor and whether a write to it faults; then
//                            hold the set until the test closes the socket
//   tensor_reconnect <name> <tensor>
//                            get the tensor set and report that tensor as `tensor` does (size:
//                            0, capacity: the set's entry id); after a word from the test,
//                            client::reconnect() and report again (size: the offers refused);
//                            then hold the set until the test closes the socket
//   soak <peer> <cycles> <seed> <dies at cycle | -1> <how>
//                            tests/store/store_soak_test.cpp: `cycles` create / get / grow / release
//                            / remove cycles, each checking the bytes it reads (also those of
//                            the test's sealed buffer "shared", pattern(0x5eed)); reports the
//                            cycles done and the mismatches (checksum = mismatches, size =
//                            cycles). A peer that dies kills itself with SIGKILL in that cycle,
//                            in the middle of a request or of the cycle (soak_death).
// Exit status: 0 done, 2 bad usage, 1 any error (printed).

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>

#include "../memory_io.hpp"
#include "store_peer_protocol.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/protocol.hpp"
#include "vmm/store/tensor_set.hpp"

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

std::uint64_t checksum_of(const vmm::store::buffer& held) {
  const auto bytes =
      vmm::testing::read_bytes(*held.provider(), reinterpret_cast<std::uintptr_t>(held.data()), held.size());
  return vmm::testing::checksum(bytes.data(), bytes.size());
}

void write_pattern(const vmm::store::buffer& held, std::size_t from, std::size_t bytes, std::uint32_t seed) {
  const std::vector<std::uint8_t> all = vmm::testing::pattern(from + bytes, seed);
  vmm::testing::write_bytes(
      *held.provider(), reinterpret_cast<std::uintptr_t>(held.data()) + from,
      std::vector<std::uint8_t>(all.begin() + static_cast<std::ptrdiff_t>(from), all.end()));
}

// A raw connection to the daemon that sends `bytes` of `frame` (a whole or a cut request),
// then dies: the daemon sees a request stop in the middle, or a reply go to a dead peer.
[[noreturn]] void die_inside(const std::string& socket_path, const std::vector<std::byte>& hello,
                             const std::vector<std::byte>& frame, bool whole) {
  const vmm::unique_fd raw = vmm::ipc::connect_unix(socket_path);
  vmm::ipc::send_message(raw.get(), hello);
  if (whole) {
    vmm::ipc::send_message(raw.get(), frame);
  } else {
    // The first half of the bytes send_message puts on the wire for the frame.
    auto [in, out] = vmm::ipc::make_socket_pair();
    vmm::ipc::send_message(in.get(), frame);
    std::vector<std::byte> wire(frame.size() + 256);
    const ssize_t got = ::read(out.get(), wire.data(), wire.size());
    if (got <= 1) throw vmm::os_error(errno, "store_peer: reading a frame back");
    // Half a frame, then the kill: whether the write took all of it does not matter, and
    // glibc's warn_unused_result is not silenced by a cast to void.
    if (::write(raw.get(), wire.data(), static_cast<std::size_t>(got) / 2) < 0) std::abort();
  }
  ::raise(SIGKILL);
  std::abort();
}

// How a soak peer dies (tests/store/store_soak_test.cpp draws one per victim).
enum class soak_death : int {
  cut_request = 0,         // half a create frame on a connection of its own
  unread_reply = 1,        // a whole create request whose reply it never reads
  uncommitted_create = 2,  // after create and its writes, before seal or remove
  after_grow = 3,          // holding the buffer and a get of it, after grow, before refresh
};

int soak(vmm::store::client& store, const std::string& socket_path, vmm::location where, int argc,
         char** argv, const std::function<std::string(int)>& arg) {
  (void)argc;
  (void)argv;
  const std::string peer = arg(4);
  const std::uint64_t cycles = std::stoull(arg(5));
  const std::uint64_t seed = std::stoull(arg(6));
  const std::int64_t dies_at = std::stoll(arg(7));
  const auto how = static_cast<soak_death>(std::stoi(arg(8)));
  const std::size_t g = vmm::provider_for(where)->capabilities().granularity;
  const std::uint64_t shared_checksum = [&] {
    const auto bytes = vmm::testing::pattern(vmm::testing::soak_shared_bytes, 0x5eed);
    return vmm::testing::checksum(bytes.data(), bytes.size());
  }();
  std::mt19937_64 random(seed);
  store_report report;
  for (std::uint64_t cycle = 0; cycle < cycles; ++cycle) {
    const bool dies = static_cast<std::int64_t>(cycle) == dies_at;
    const std::string name = "soak-" + peer + "-" + std::to_string(cycle);
    // Small buffers, so that the cycles cost requests rather than copies; one grow in eight
    // passes the first chunk, so that the holders map a new one.
    const std::size_t size = 64 + random() % 16384;
    const std::size_t grown = random() % 8 == 0 ? g + 64 + random() % 4096 : size + 1 + random() % 16384;
    const auto pattern_seed = static_cast<std::uint32_t>(random());
    if (dies && (how == soak_death::cut_request || how == soak_death::unread_reply))
      die_inside(socket_path, vmm::store::encode(vmm::store::request{.op = vmm::store::operation::hello}),
                 vmm::store::encode(vmm::store::request{
                     .op = vmm::store::operation::create, .name = name, .where = where, .size = size}),
                 how == soak_death::unread_reply);
    vmm::store::buffer made = store.create(name, size, where);
    write_pattern(made, 0, size, pattern_seed);
    if (dies && how == soak_death::uncommitted_create) ::raise(SIGKILL);
    vmm::store::buffer held = store.get(name);
    report.checksum += checksum_of(held) == checksum_of(made) &&
                               checksum_of(held) ==
                                   [&] {
                                     const auto bytes = vmm::testing::pattern(size, pattern_seed);
                                     return vmm::testing::checksum(bytes.data(), bytes.size());
                                   }()
                           ? 0
                           : 1;
    (void)store.grow(name, grown);
    if (dies && how == soak_death::after_grow) ::raise(SIGKILL);
    made.refresh();
    write_pattern(made, size, grown - size, pattern_seed);
    held.refresh();
    const auto expected = vmm::testing::pattern(grown, pattern_seed);
    report.checksum +=
        held.size() == grown && checksum_of(held) == vmm::testing::checksum(expected.data(), grown) ? 0 : 1;
    {
      const vmm::store::buffer shared = store.get("shared");
      report.checksum += checksum_of(shared) == shared_checksum ? 0 : 1;
    }
    held.release();
    made.release();
    store.remove(name);
    report.size = cycle + 1;
  }
  send_store_report(vmm::testing::store_child_fd, report);
  return 0;
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
  if (mode == "tensor") {
    const vmm::store::tensor_set set = vmm::store::tensor_set::get(store, arg(4));
    const vmm::store::tensor_view tensor = set.at(arg(5));
    const auto address = reinterpret_cast<std::uintptr_t>(tensor.data);
    const auto bytes = vmm::testing::read_bytes(*set.memory().provider(), address, tensor.info->bytes);
    store_report report;
    report.checksum = vmm::testing::checksum(bytes.data(), bytes.size());
    report.size = tensor.info->bytes;
    report.address = address;
    report.write_faulted =
        vmm::testing::write_faults(*set.memory().provider(), const_cast<void*>(tensor.data),
                                   tensor.info->bytes, "store_peer")
            ? 1
            : 0;
    send_store_report(socket, report);
    // Held until the test lets go (its holds are counted meanwhile); after a write refused on
    // a GPU, leaves without running the destructors.
    wait_word(socket);
    if (report.write_faulted != 0 && where.kind != vmm::memory_kind::os_host) std::_Exit(0);
    return 0;
  }
  if (mode == "tensor_reconnect") {
    const vmm::store::tensor_set set = vmm::store::tensor_set::get(store, arg(4));
    const vmm::store::tensor_view tensor = set.at(arg(5));
    const auto report_tensor = [&](std::uint64_t refused) {
      const auto address = reinterpret_cast<std::uintptr_t>(tensor.data);
      const auto bytes = vmm::testing::read_bytes(*set.memory().provider(), address, tensor.info->bytes);
      store_report report;
      report.checksum = vmm::testing::checksum(bytes.data(), bytes.size());
      report.size = refused;
      report.capacity = set.memory().entry();
      report.address = address;
      send_store_report(socket, report);
    };
    report_tensor(0);
    if (!wait_word(socket)) return 0;
    report_tensor(store.reconnect().size());
    wait_word(socket);
    return 0;
  }
  if (mode == "soak") return soak(store, arg(1), where, argc, argv, arg);
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
