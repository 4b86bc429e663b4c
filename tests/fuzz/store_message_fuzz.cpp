/// @file
/// Fuzz target: the vmm-store daemon's request decoder and dispatch (vmm::store::server),
/// fed by one client connection over a socket pair, on the OS host provider.
///
/// The input is a script of messages: each is a kind byte, a u16 length and that many bytes.
/// Kind 0 sends the bytes as one fd_channel frame (a request payload, as a client would);
/// kind 1 writes them raw onto the stream (broken frames, headers that lie); kind 2 sends
/// them as one frame with sealed memfds attached (an offer's chunks: the count is the first
/// byte's low two bits plus one, each one granule); any other kind sends a valid request
/// built from the bytes' first byte (hello, list, statistics). After
/// each message the daemon serves what is ready, and the target drains its replies (closing
/// every descriptor a manifest brought). Then the client hangs up.
///
/// Checked besides "no crash": the daemon never throws out of serve_once; once the client
/// is gone, it holds no hold and no connection, every entry it keeps is named (sealed
/// creations), and after the daemon is destroyed no descriptor, memfd mapping or
/// reservation is left.

#include <vmm/ipc/fd_channel.hpp>
#include <vmm/store/protocol.hpp>
#include <vmm/store/server.hpp>
#include <vmm/error.hpp>
#include <vmm/unique_fd.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using namespace std::chrono_literals;

// Reads and drops whatever the daemon has sent (replies, manifests and their fds).
void drain(int socket) {
  for (;;) {
    try {
      (void)vmm::ipc::receive_message(socket, {}, 0ms);
    } catch (const std::exception&) {
      return;  // nothing more now, a closed stream, or bytes that are not a frame
    }
  }
}

// A memfd of `bytes`, sealed against resizing as the importer requires.
vmm::unique_fd sealed_memfd(std::size_t bytes) {
  vmm::unique_fd fd(::memfd_create("store_message", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw vmm::os_error(errno, "store_message: a memfd to offer");
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace store = vmm::store;
  using vmm::fuzz::finding;
  const vmm::fuzz::leak_check leaks(true);
  {
    store::server daemon({.cap = std::size_t{64} << 20,
                          .client_cap = std::size_t{32} << 20,
                          .request_timeout = 0ms,
                          .reply_timeout = 0ms});
    auto [client, served] = vmm::ipc::make_socket_pair();
    int buffer_bytes = 4 << 20;
    ::setsockopt(client.get(), SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    ::fcntl(client.get(), F_SETFL, O_NONBLOCK);
    daemon.add_connection(std::move(served), ::getpid(), ::getuid());
    vmm::fuzz::byte_reader input(data, size);
    const auto serve = [&] {
      try {
        for (int turn = 0; turn < 4; ++turn) (void)daemon.serve_once(0ms);
      } catch (const std::exception& error) {
        finding(fmt::format("serve_once threw: {}", error.what()));
      }
    };
    for (int message = 0; message < 32 && !input.empty(); ++message) {
      const std::uint8_t kind = input.u8();
      const std::uint16_t length = input.u16();
      const std::span<const std::byte> bytes = input.take(length);
      try {
        if (kind == 0) {
          vmm::ipc::send_message(client.get(), bytes, {}, 0ms);
        } else if (kind == 1) {
          (void)::send(client.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        } else if (kind == 2) {
          const std::size_t count = bytes.empty() ? 1 : (std::to_integer<std::size_t>(bytes[0]) & 3) + 1;
          std::vector<vmm::unique_fd> memfds;
          std::vector<int> fds;
          for (std::size_t i = 0; i < count; ++i) {
            memfds.push_back(sealed_memfd(std::size_t{2} << 20));
            fds.push_back(memfds.back().get());
          }
          vmm::ipc::send_message(client.get(), bytes.empty() ? bytes : bytes.subspan(1), fds, 0ms);
        } else {
          const auto op = bytes.empty() ? 0 : std::to_integer<std::uint8_t>(bytes[0]) % 3;
          const store::operation ops[] = {store::operation::hello, store::operation::list,
                                          store::operation::statistics};
          vmm::ipc::send_message(client.get(), store::encode(store::request{.op = ops[op]}), {}, 0ms);
        }
      } catch (const std::exception&) {
        // The daemon closed the connection, or its buffer is full: go on, it must cope.
      }
      serve();
      drain(client.get());
    }
    client.reset();
    serve();
    const store::daemon_statistics s = daemon.statistics();
    if (s.connections != 0 || s.holds != 0)
      finding(fmt::format("after the client hung up: {} connections, {} holds", s.connections, s.holds));
    if (s.entries != s.named_entries)
      finding(fmt::format("after the client hung up: {} entries, {} named", s.entries, s.named_entries));
  }
  leaks.check("store_message");
  return 0;
}
