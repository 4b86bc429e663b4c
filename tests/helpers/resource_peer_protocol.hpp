#pragma once
// What tests/ipc/resource_sharing_test.cpp and its second process, tests/helpers/resource_peer.cpp,
// say to each other besides the resource and pointer messages: commands to the peer and
// its report of what it sees. Both ends run on one host from one build: plain structs in
// host byte order. Spawning the peer: peer_process of ipc_peer_protocol.hpp.

#include <cstdint>
#include <cstring>
#include <span>

#include "ipc_peer_protocol.hpp"
#include "vmm/address_space.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/protocol_error.hpp"

namespace vmm::testing {

enum class resource_peer_op : std::uint32_t {
  import = 1,    // a pointer (message and manifest) follows: import it into `slot`; report
  release = 2,   // let go of the pointer in `slot`; report
  report = 3,    // report (the checksum of `slot`'s bytes when it holds a pointer)
  fill = 4,      // fill `slot`'s bytes with `value` on the peer's stream, synchronize; report
  consume = 5,   // as a handoff_consumer (made on first use): acquire on the peer's stream,
                 // fill `slot` with `value`, let go of the pointer on that stream, finish;
                 // report
  die = 6,       // SIGKILL itself
  allocate = 7,  // try to allocate from the imported resource; report how it was refused
  trim = 8,      // give back the imported resource's cached pages (trim()), wait for them; report
};

struct resource_peer_command {
  resource_peer_op op = resource_peer_op::report;
  std::uint32_t slot = 0;
  std::uint64_t value = 0;
};

enum class resource_peer_status : std::uint64_t {
  ok = 0,
  allocation_refused = 1,  // allocate: vmm::invalid_argument saying it cannot allocate
  allocation_allowed = 2,  // allocate: it returned memory: a failure
  allocation_other = 3,    // allocate: refused with another error or message: a failure
};

// What the peer sees: the slot's bytes and address, its imported resource, its address space.
struct resource_peer_report {
  std::uint64_t checksum = 0;  // FNV-1a of the slot's bytes; 0 when the slot is empty
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t pointers = 0;
  std::uint64_t segments = 0;
  std::uint64_t pages_mapped = 0;
  std::uint64_t pages_imported = 0;
  std::uint64_t pages_shared = 0;
  std::uint64_t pages_released = 0;
  std::uint64_t pages_reused = 0;
  std::uint64_t cached_bytes = 0;
  std::uint64_t ranges = 0;  // provider->address_space().usage()
  std::uint64_t handles = 0;
  std::uint64_t mappings = 0;
  std::uint64_t mapped_bytes = 0;
  resource_peer_status status = resource_peer_status::ok;

  [[nodiscard]] bool same_usage(const resource_peer_report& other) const noexcept {
    return ranges == other.ranges && handles == other.handles && mappings == other.mappings &&
           mapped_bytes == other.mapped_bytes;
  }
};

inline void send_command(int socket_fd, const resource_peer_command& command) {
  ipc::send_message(socket_fd, std::as_bytes(std::span(&command, 1)));
}

inline resource_peer_command receive_command(int socket_fd) {
  const ipc::message received = ipc::receive_message(socket_fd, 0, ipc::no_timeout);
  resource_peer_command command;
  if (received.payload.size() != sizeof command) throw ipc::protocol_error("peer command of the wrong size");
  std::memcpy(&command, received.payload.data(), sizeof command);
  return command;
}

inline void send_resource_report(int socket_fd, const resource_peer_report& report) {
  ipc::send_message(socket_fd, std::as_bytes(std::span(&report, 1)));
}

inline resource_peer_report receive_resource_report(int socket_fd) {
  const ipc::message received = ipc::receive_message(socket_fd, 0);
  resource_peer_report report;
  if (received.payload.size() != sizeof report) throw ipc::protocol_error("peer report of the wrong size");
  std::memcpy(&report, received.payload.data(), sizeof report);
  return report;
}

}  // namespace vmm::testing
