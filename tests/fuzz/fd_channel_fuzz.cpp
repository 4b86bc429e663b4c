/// @file
/// Fuzz target: vmm::ipc::receive_message framing, with real descriptors in flight.
///
/// Input: one byte of options, then a script of segments (fuzz_support.hpp): each segment
/// is written with one sendmsg, with descriptors made from its spec bytes (memfds of
/// several sizes, /dev/null, a pipe end, a read-only regular file) attached as SCM_RIGHTS.
/// The bytes are raw: frame headers are the fuzzer's to write or break. The options byte:
/// bit 7 set passes expected_fd_count = bits 0-2 to every receive_message call.
///
/// receive_message is called on the other end until it throws. Checked:
///  - only the documented exceptions (protocol_error, and os_error: peer_closed, ECONNRESET,
///    EMFILE);
///  - a message received is what the stream holds: its payload is the bytes after its
///    header, its descriptor count is the header's, and every descriptor is open and
///    close-on-exec;
///  - peer_closed comes exactly at the end of what was written, a plain ECONNRESET before it;
///  - no descriptor leaks: once the messages are dropped and the sockets closed, as many
///    are open as before the input.

#include <vmm/error.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/protocol_error.hpp>

#include <fcntl.h>
#include <fmt/format.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using vmm::fuzz::finding;
namespace ipc = vmm::ipc;

// Scripts stay far below any socket's send buffer (see fuzz_support.hpp).
constexpr std::size_t max_segments = 32;

void check_message(const ipc::message& received, std::span<const std::byte> stream, std::size_t at) {
  ipc::frame_header header{};
  if (at + sizeof(header) > stream.size())
    finding(fmt::format("a message was received from offset {}, but only {} bytes were written", at,
                        stream.size()));
  std::memcpy(&header, stream.data() + at, sizeof(header));
  const std::size_t payload_at = at + sizeof(header);
  if (received.payload.size() != header.payload_size ||
      payload_at + received.payload.size() > stream.size() ||
      (!received.payload.empty() &&
       std::memcmp(received.payload.data(), stream.data() + payload_at, received.payload.size()) != 0))
    finding(
        fmt::format("the message at offset {} carries {} payload bytes that are not the {} its header "
                    "announces",
                    at, received.payload.size(), header.payload_size));
  if (received.fds.size() != header.fd_count)
    finding(fmt::format("the message at offset {} carries {} fds, its header says {}", at,
                        received.fds.size(), header.fd_count));
  for (const vmm::unique_fd& fd : received.fds) {
    const int flags = ::fcntl(fd.get(), F_GETFD);
    if (flags < 0 || (flags & FD_CLOEXEC) == 0)
      finding(fmt::format("received fd {} is {}", fd.get(), flags < 0 ? "not open" : "not close-on-exec"));
  }
}

void run(vmm::fuzz::byte_reader input) {
  const std::uint8_t options = input.u8();
  const std::optional<std::size_t> expected =
      (options & 0x80) != 0 ? std::optional<std::size_t>(options & 7) : std::nullopt;

  vmm::fuzz::fd_stock stock;
  vmm::fuzz::peer_channel channel;
  std::vector<std::byte> stream;  // every byte the peer got written
  for (std::size_t i = 0; i < max_segments && !input.empty() && channel.open(); ++i) {
    const vmm::fuzz::segment part = vmm::fuzz::read_segment(input);
    const std::vector<int> fds = stock.make_all(part.fd_specs);
    const std::size_t sent = channel.send(part.bytes, fds);
    stream.insert(stream.end(), part.bytes.begin(), part.bytes.begin() + static_cast<std::ptrdiff_t>(sent));
  }
  stock.after_send();
  channel.finish();

  std::size_t at = 0;  // where the next message starts
  for (;;) {
    try {
      const ipc::message received = ipc::receive_message(channel.reader(), expected);
      check_message(received, stream, at);
      at += sizeof(ipc::frame_header) + received.payload.size();
    } catch (const ipc::peer_closed&) {
      if (at != stream.size())
        finding(
            fmt::format("peer_closed after {} of {} bytes: not at the end of the stream", at, stream.size()));
      return;
    } catch (const vmm::os_error& error) {
      if (error.code().value() == ECONNRESET && at >= stream.size())
        finding(fmt::format("ECONNRESET at the end of the stream ({} bytes) instead of peer_closed", at));
      return;
    } catch (const ipc::protocol_error&) {
      return;  // a broken frame: refused
    } catch (const std::exception& error) {
      finding(fmt::format("receive_message threw an undocumented exception: {}", error.what()));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const vmm::fuzz::leak_check leaks(false);
  run(vmm::fuzz::byte_reader(data, size));
  leaks.check("fd_channel");
  return 0;
}
