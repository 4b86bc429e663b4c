#pragma once
/// @file
/// Framed messages that carry file descriptors over a Unix stream socket.
///
///     auto [left, right] = vmm::ipc::make_socket_pair();
///     const int fds[] = {memory_fd.get()};
///     vmm::ipc::send_message(left.get(), payload, fds);   // the peer gets duplicates
///     vmm::ipc::message got = vmm::ipc::receive_message(right.get(), 1);  // exactly 1 fd
///     vmm::unique_fd received = std::move(got.fds[0]);     // owned since it arrived
///
/// A message is a frame_header, then frame_header::payload_size payload bytes; its file
/// descriptors travel as SCM_RIGHTS ancillary data on the first byte of the header. Both
/// ends run on one host, so the header is in host byte order.
///
/// Every send and receive has a deadline: a peer that stops half-way through a message, or
/// stops reading, costs the other end at most the timeout (default_timeout unless the
/// caller says otherwise), then a timeout_error. The sockets may be blocking or not: each
/// call waits in poll() for the time left and moves bytes with MSG_DONTWAIT.
///
/// After any exception from send_message or receive_message the stream position is unknown:
/// close the socket rather than sending or receiving on it again. peer_closed is the one
/// exception to this: it is the orderly end of a conversation.

#include <vmm/error.hpp>
#include <vmm/ipc/protocol_error.hpp>
#include <vmm/unique_fd.hpp>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace vmm::ipc {

/// The most file descriptors one message may carry: the kernel's SCM_MAX_FD.
inline constexpr std::size_t max_fds_per_message = 253;

/// The largest payload one message may carry (64 MiB); larger frames are refused on both
/// ends so that a corrupt or hostile header cannot make the receiver allocate without bound.
inline constexpr std::size_t max_payload_bytes = std::size_t{64} << 20;

/// How long send_message and receive_message wait for the peer unless told otherwise: 30
/// seconds for the whole message, every byte and descriptor of it. A live peer on the same
/// host moves max_payload_bytes in a small fraction of that; a peer that stopped is noticed.
inline constexpr std::chrono::milliseconds default_timeout{30'000};

/// A timeout that never expires: wait for as long as the peer keeps the connection open.
/// For a side that idles between messages for as long as it likes (a server waiting for its
/// next request); a peer that stops half-way then blocks it forever.
inline constexpr std::chrono::milliseconds no_timeout = std::chrono::milliseconds::max();

/// The value of frame_header::magic: "VMM1" read as a little-endian integer.
inline constexpr std::uint32_t frame_magic = 0x314d4d56;

/// The fixed header that opens every message on the wire, in host byte order.
/// Public so that tests and peers written in other languages can build frames by hand.
struct frame_header {
  /// Always frame_magic; anything else means the stream is not a vmm channel or lost sync.
  std::uint32_t magic;
  /// The number of file descriptors attached to the header's first byte.
  std::uint32_t fd_count;
  /// The number of payload bytes that follow the header.
  std::uint64_t payload_size;
};
static_assert(sizeof(frame_header) == 16 && std::is_trivially_copyable_v<frame_header>);

/// One received message. Every descriptor is owned, close-on-exec, and refers to the same
/// open file description the sender passed.
struct message {
  /// The payload bytes, exactly as sent.
  std::vector<std::byte> payload;
  /// The descriptors, in the order the sender listed them.
  std::vector<unique_fd> fds;
};

/// The peer closed the connection at a message boundary, before sending any byte of the
/// next message: the orderly end of a conversation. code() is ECONNRESET. A peer that
/// closes part-way through a message raises a plain vmm::os_error instead.
class peer_closed : public os_error {
 public:
  /// @param message what was being received, and on which socket.
  explicit peer_closed(const std::string& message) : os_error(ECONNRESET, message) {}
};

/// The peer did not send (or, for send_message, did not make room for) the rest of a
/// message before the deadline, though it kept the connection open. code() is ETIMEDOUT;
/// what() says how many of how many bytes got through and how long the call waited. Every
/// descriptor received with the message was closed. As after any error but peer_closed,
/// close the socket.
class timeout_error : public os_error {
 public:
  /// @param message what was being sent or received, on which socket, and how far it got.
  explicit timeout_error(const std::string& message) : os_error(ETIMEDOUT, message) {}
};

/// Creates a connected pair of AF_UNIX SOCK_STREAM sockets, both close-on-exec.
/// @throws vmm::os_error if socketpair fails (for example EMFILE).
[[nodiscard]] std::pair<unique_fd, unique_fd> make_socket_pair();

/// Creates a close-on-exec AF_UNIX stream socket bound to `path` and listening on it.
/// The socket file stays on disk until the caller removes it.
/// @param path a filesystem path of 1 to 107 bytes (sockaddr_un::sun_path holds 108 with
///        the terminating NUL); abstract socket names are not supported.
/// @throws vmm::invalid_argument if `path` is empty, too long, or holds a NUL byte.
/// @throws vmm::os_error if socket, bind or listen fails (EADDRINUSE when `path` exists).
[[nodiscard]] unique_fd listen_unix(const std::string& path);

/// Connects a close-on-exec AF_UNIX stream socket to the listener at `path`.
/// @param path as for listen_unix.
/// @throws vmm::invalid_argument if `path` is empty, too long, or holds a NUL byte.
/// @throws vmm::os_error if socket or connect fails (ENOENT or ECONNREFUSED when nothing
///         listens at `path`).
[[nodiscard]] unique_fd connect_unix(const std::string& path);

/// Waits for and accepts one connection on a socket made by listen_unix.
/// @param listen_fd the listening socket; not owned.
/// @returns the connected socket, close-on-exec.
/// @throws vmm::os_error if accept4 fails.
[[nodiscard]] unique_fd accept_unix(int listen_fd);

/// Sends one message: the header and `payload`, with `fds` attached to the header.
/// Waits, for at most `timeout` in all, until every byte is written; carries on after
/// EINTR and partial writes. Never raises SIGPIPE. The caller keeps ownership of `fds`; the
/// receiver gets duplicates.
/// @param socket_fd a connected stream socket, blocking or not; not owned.
/// @param payload at most max_payload_bytes bytes; may be empty.
/// @param fds at most max_fds_per_message open descriptors; may be empty.
/// @param timeout how long the whole message may wait for room in the socket: no_timeout
///        waits without end; zero or less sends only what fits at once.
/// @throws vmm::invalid_argument if `payload` or `fds` exceeds its limit; nothing was sent.
/// @throws vmm::ipc::timeout_error if the peer did not read enough to let the whole message
///         through within `timeout`. Part of the message may have been sent.
/// @throws vmm::os_error if poll or sendmsg fails: EPIPE when the peer has closed, EBADF
///         when `socket_fd` or an entry of `fds` is not open. Part of the message may have
///         been sent.
void send_message(int socket_fd, std::span<const std::byte> payload, std::span<const int> fds = {},
                  std::chrono::milliseconds timeout = default_timeout);

/// Receives one message sent by send_message. Waits, for at most `timeout` in all, until it
/// is complete; carries on after EINTR and partial reads. Every descriptor is owned from
/// the moment it arrives, so each one is closed again when this function throws.
/// @param socket_fd a connected stream socket, blocking or not; not owned.
/// @param expected_fd_count if given, the number of descriptors the message must carry.
/// @param timeout how long to wait for the whole message, its first byte included:
///        no_timeout waits without end; zero or less takes only what has arrived already.
/// @throws vmm::ipc::timeout_error if the message was not complete within `timeout`;
///         what() says after how many of how many header or payload bytes.
/// @throws vmm::ipc::peer_closed if the peer closed before sending any byte of a message.
/// @throws vmm::os_error (ECONNRESET) if the peer closed part-way through the message;
///         what() says after how many of how many header or payload bytes.
/// @throws vmm::os_error if poll or recvmsg fails, or if the kernel truncated the descriptors
///         (MSG_CTRUNC; EMFILE when this process ran out of descriptors).
/// @throws vmm::ipc::protocol_error if the peer broke the protocol: a wrong magic, a
///         payload size over max_payload_bytes, a descriptor count that differs from the
///         header's or from `expected_fd_count`, or descriptors that arrived after the
///         message's first read.
/// @throws std::bad_alloc if the payload buffer cannot be allocated.
[[nodiscard]] message receive_message(int socket_fd, std::optional<std::size_t> expected_fd_count = {},
                                      std::chrono::milliseconds timeout = default_timeout);

}  // namespace vmm::ipc
