/// @file
/// Framed messages with SCM_RIGHTS descriptors over Unix stream sockets.
///
/// How Linux moves descriptors over a stream socket decides the shape of this code:
///  - sendmsg attaches the descriptors to the first buffer of the bytes it queues; later
///    sendmsg calls of the same message (after a partial write) carry none.
///  - recvmsg hands over the descriptors of every buffer it reads from, and stops reading
///    right after a buffer that carried some. Reading exactly the header first therefore
///    yields the message's descriptors on the first call, and never those of the next
///    message.
///  - A recvmsg without room for control data does not leave descriptors queued: the
///    kernel closes them and sets MSG_CTRUNC. So every recvmsg here offers a control buffer
///    large enough for SCM_MAX_FD descriptors plus credentials, and takes each descriptor
///    it gets into a unique_fd before looking at anything else. Descriptors arriving after
///    the first read are a protocol error, and are closed like all the others.
///  - When the receiver cannot install every descriptor (EMFILE), it gets those that fit
///    and MSG_CTRUNC; that is an error too, after the ones that fit are owned.
///
/// Deadlines. A blocking recvmsg waits for as long as the peer keeps the connection open,
/// and a blocking sendmsg of a large message for as long as the peer does not read: a peer
/// that stops half-way would hang this process. So no call here ever blocks in the kernel
/// except poll(), given the time left to the message's deadline: every recvmsg and sendmsg
/// passes MSG_DONTWAIT, which moves what can be moved now whatever the socket's O_NONBLOCK
/// says. A send tries first and polls when the socket is full; a receive polls before the
/// first byte of a message (which is usually not there yet), and tries first for the rest
/// (which usually is). A poll() that a signal interrupts is called again with the time left
/// then; an EAGAIN (a spurious wake-up, a non-blocking socket, a rest not there yet) goes
/// back to poll() the same way. When the deadline passes, the
/// descriptors received so far are owned already, and close as the exception unwinds.

#include <vmm/ipc/fd_channel.hpp>

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "vmm/ipc/detail/fd_channel.hpp"
#include "vmm/detail/system.hpp"

namespace vmm::ipc {
namespace {

constexpr std::size_t fds_control_space = CMSG_SPACE(sizeof(int) * max_fds_per_message);

/// Room for one full SCM_RIGHTS message plus SCM_CREDENTIALS, which the kernel adds when the
/// socket has SO_PASSCRED set; without that room a credential message would truncate.
constexpr std::size_t receive_control_space = fds_control_space + CMSG_SPACE(sizeof(ucred));

/// An upper bound on the descriptors one recvmsg can deliver into the control buffer.
constexpr std::size_t max_fds_per_receive = receive_control_space / sizeof(int);

sockaddr_un make_address(const std::string& path, const char* caller) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty()) {
    throw invalid_argument(
        fmt::format("{}: the socket path is empty (abstract sockets are not supported)", caller));
  }
  if (path.size() >= sizeof(address.sun_path)) {
    throw invalid_argument(
        fmt::format("{}: socket path \"{}\" is {} bytes; sockaddr_un::sun_path holds at most {}", caller,
                    path, path.size(), sizeof(address.sun_path) - 1));
  }
  if (path.find('\0') != std::string::npos) {
    throw invalid_argument(fmt::format("{}: socket path holds a NUL byte", caller));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

unique_fd make_stream_socket(const char* caller) {
  unique_fd socket_fd{::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (!socket_fd) {
    throw os_error(errno, fmt::format("{}: socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC)", caller));
  }
  return socket_fd;
}

/// The unsent or unfilled part of a message, as a sequence of buffers.
class iovec_cursor {
 public:
  explicit iovec_cursor(std::span<iovec> buffers) : buffers_(buffers) { skip_empty(); }

  [[nodiscard]] iovec* data() const noexcept { return buffers_.data(); }
  [[nodiscard]] std::size_t count() const noexcept { return buffers_.size(); }
  [[nodiscard]] bool done() const noexcept { return buffers_.empty(); }

  void advance(std::size_t bytes) noexcept {
    while (bytes > 0) {
      auto& front = buffers_.front();
      std::size_t const step = std::min(bytes, front.iov_len);
      front.iov_base = static_cast<std::byte*>(front.iov_base) + step;
      front.iov_len -= step;
      bytes -= step;
      skip_empty();
    }
  }

 private:
  void skip_empty() noexcept {
    while (!buffers_.empty() && buffers_.front().iov_len == 0) buffers_ = buffers_.subspan(1);
  }

  std::span<iovec> buffers_;
};

/// Waits until `socket_fd` is ready for `events` (POLLIN or POLLOUT) or `until` passes.
/// "Ready" includes an error or a hang-up, which the recvmsg or sendmsg that follows
/// reports. Calls poll() again after EINTR, with the time left then.
/// @returns false if the deadline passed first.
bool wait_until_ready(int socket_fd, short events, const detail::deadline& until, const char* caller) {
  if (socket_fd < 0) {
    // poll() skips negative descriptors: it would wait out the deadline for nothing.
    throw os_error(EBADF, fmt::format("{}: socket {} is not a descriptor", caller, socket_fd));
  }
  pollfd watched{socket_fd, events, 0};
  while (true) {
    int const ready = os::poll(&watched, 1, until.poll_timeout());
    if (ready > 0) return true;
    if (ready == 0) {
      if (until.passed()) return false;
      continue;  // poll() rounds its own clock; the deadline's is the one that counts
    }
    if (errno != EINTR) {
      throw os_error(errno, fmt::format("{}: poll on socket {}", caller, socket_fd));
    }
  }
}

/// One recvmsg into `buffer` once the socket is readable, retried after EINTR and EAGAIN.
/// Appends every descriptor it receives to `fds` before anything can throw, then reports
/// truncated control data. `poll_first`: wait for the socket before the first recvmsg
/// (bytes that are not there yet); otherwise try at once (the rest of a message that is
/// arriving), and wait only when nothing is there.
/// @returns the number of bytes read, 0 at end of stream; nullopt if `until` passed first.
std::optional<std::size_t> receive_some(int socket_fd, std::span<std::byte> buffer,
                                        std::vector<unique_fd>& fds, const detail::deadline& until,
                                        bool poll_first) {
  // Reserve first, so that taking ownership below cannot fail with descriptors in flight.
  fds.reserve(fds.size() + max_fds_per_receive);

  alignas(cmsghdr) std::array<std::byte, receive_control_space> control{};
  iovec io{buffer.data(), buffer.size()};
  msghdr header{};
  ssize_t received = 0;
  bool wait = poll_first;
  do {
    if (wait && !wait_until_ready(socket_fd, POLLIN, until, "receive_message")) return std::nullopt;
    wait = true;
    header = msghdr{};
    header.msg_iov = &io;
    header.msg_iovlen = 1;
    header.msg_control = control.data();
    header.msg_controllen = control.size();
    received = os::recvmsg(socket_fd, &header, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (received < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK));
  if (received < 0) {
    throw os_error(errno, fmt::format("recvmsg on socket {} ({} bytes wanted)", socket_fd, buffer.size()));
  }

  std::size_t const fds_before = fds.size();
  for (cmsghdr* part = CMSG_FIRSTHDR(&header); part != nullptr; part = CMSG_NXTHDR(&header, part)) {
    if (part->cmsg_level != SOL_SOCKET || part->cmsg_type != SCM_RIGHTS) continue;
    std::size_t const count = (part->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(part) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  if ((header.msg_flags & MSG_CTRUNC) != 0) {
    throw os_error(EMFILE, fmt::format("recvmsg on socket {}: the kernel truncated the "
                                       "descriptors (MSG_CTRUNC) after {}; is this process "
                                       "out of descriptors?",
                                       socket_fd, fds.size() - fds_before));
  }
  return static_cast<std::size_t>(received);
}

/// Fills `buffer` completely before `until`. Descriptors are accepted only from the first
/// recvmsg when `first_of_message` is set, and from none otherwise.
/// @param part "header" or "payload", for messages.
void receive_exact(int socket_fd, std::span<std::byte> buffer, std::vector<unique_fd>& fds,
                   bool first_of_message, const char* part, const detail::deadline& until) {
  std::vector<unique_fd> late_fds;
  std::size_t filled = 0;
  while (filled < buffer.size()) {
    bool const fds_allowed = first_of_message && filled == 0;
    std::optional<std::size_t> const received =
        receive_some(socket_fd, buffer.subspan(filled), fds_allowed ? fds : late_fds, until,
                     first_of_message && filled == 0);
    if (!received) {
      throw timeout_error(fmt::format(
          "receive_message on socket {}: timed out with {} of {} {} bytes received, after "
          "waiting {} ms (timeout {} ms)",
          socket_fd, filled, buffer.size(), part, until.waited().count(), until.timeout().count()));
    }
    if (!late_fds.empty()) {
      throw protocol_error(
          fmt::format("receive_message on socket {}: {} descriptors arrived after {} {} bytes; they must "
                      "come with the message's first byte",
                      socket_fd, late_fds.size(), filled, part));
    }
    if (*received == 0) {
      if (first_of_message && filled == 0) {
        throw peer_closed(fmt::format(
            "receive_message on socket {}: peer closed the connection before sending a message", socket_fd));
      }
      throw os_error(ECONNRESET, fmt::format("receive_message on socket {}: peer closed after {} of {} {} "
                                             "bytes",
                                             socket_fd, filled, buffer.size(), part));
    }
    filled += *received;
  }
}

}  // namespace

std::pair<unique_fd, unique_fd> make_socket_pair() {
  std::array<int, 2> ends{-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends.data()) != 0) {
    throw os_error(errno, "socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC)");
  }
  return {unique_fd{ends[0]}, unique_fd{ends[1]}};
}

unique_fd listen_unix(const std::string& path) {
  sockaddr_un const address = make_address(path, "listen_unix");
  unique_fd socket_fd = make_stream_socket("listen_unix");
  if (::bind(socket_fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    throw os_error(errno, fmt::format("listen_unix: bind to \"{}\"", path));
  }
  if (::listen(socket_fd.get(), SOMAXCONN) != 0) {
    throw os_error(errno, fmt::format("listen_unix: listen on \"{}\"", path));
  }
  return socket_fd;
}

unique_fd connect_unix(const std::string& path) {
  sockaddr_un const address = make_address(path, "connect_unix");
  unique_fd socket_fd = make_stream_socket("connect_unix");
  // An AF_UNIX connect interrupted while waiting for backlog room leaves the socket
  // unconnected, so unlike TCP it can simply be called again.
  int result = 0;
  do {
    result = ::connect(socket_fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  } while (result != 0 && errno == EINTR);
  if (result != 0) throw os_error(errno, fmt::format("connect_unix: connect to \"{}\"", path));
  return socket_fd;
}

unique_fd accept_unix(int listen_fd) {
  int fd = -1;
  do {
    fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw os_error(errno, fmt::format("accept_unix: accept4 on socket {}", listen_fd));
  return unique_fd{fd};
}

void detail::send_message(int socket_fd, std::span<const std::byte> payload, std::span<const int> fds,
                          const deadline& until) {
  if (fds.size() > max_fds_per_message) {
    throw invalid_argument(
        fmt::format("send_message on socket {}: {} descriptors; a message carries at most {}", socket_fd,
                    fds.size(), max_fds_per_message));
  }
  if (payload.size() > max_payload_bytes) {
    throw invalid_argument(
        fmt::format("send_message on socket {}: payload of {} bytes; a message carries at most {}", socket_fd,
                    payload.size(), max_payload_bytes));
  }

  std::size_t const total = sizeof(frame_header) + payload.size();
  std::size_t sent = 0;
  while (!send_some(socket_fd, payload, fds, sent)) {
    if (!wait_until_ready(socket_fd, POLLOUT, until, "send_message")) {
      throw timeout_error(
          fmt::format("send_message on socket {}: timed out with {} of {} bytes sent ({} descriptors), "
                      "after waiting {} ms (timeout {} ms) for the peer to read",
                      socket_fd, sent, total, fds.size(), until.waited().count(), until.timeout().count()));
    }
  }
}

bool detail::send_some(int socket_fd, std::span<const std::byte> payload, std::span<const int> fds,
                       std::size_t& sent) {
  frame_header header{frame_magic, static_cast<std::uint32_t>(fds.size()),
                      static_cast<std::uint64_t>(payload.size())};
  // sendmsg takes non-const buffers but only reads them.
  std::array<iovec, 2> buffers{iovec{&header, sizeof(header)},
                               iovec{const_cast<std::byte*>(payload.data()), payload.size()}};
  iovec_cursor unsent{buffers};
  unsent.advance(sent);
  std::size_t const total = sizeof(header) + payload.size();
  alignas(cmsghdr) std::array<std::byte, fds_control_space> control{};
  while (!unsent.done()) {
    msghdr message_header{};
    message_header.msg_iov = unsent.data();
    message_header.msg_iovlen = unsent.count();
    if (sent == 0 && !fds.empty()) {  // any byte written carries the descriptors with it
      message_header.msg_control = control.data();
      message_header.msg_controllen = CMSG_SPACE(fds.size_bytes());
      cmsghdr* part = CMSG_FIRSTHDR(&message_header);
      part->cmsg_level = SOL_SOCKET;
      part->cmsg_type = SCM_RIGHTS;
      part->cmsg_len = CMSG_LEN(fds.size_bytes());
      std::memcpy(CMSG_DATA(part), fds.data(), fds.size_bytes());
    }
    ssize_t const written = os::sendmsg(socket_fd, &message_header, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (written < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return false;
      throw os_error(errno, fmt::format("send_message: sendmsg on socket {} after {} of {} "
                                        "bytes ({} descriptors)",
                                        socket_fd, sent, total, fds.size()));
    }
    sent += static_cast<std::size_t>(written);
    unsent.advance(static_cast<std::size_t>(written));
  }
  return true;
}

message detail::receive_message(int socket_fd, std::optional<std::size_t> expected_fd_count,
                                const deadline& until) {
  message received;
  frame_header header{};
  receive_exact(socket_fd, std::as_writable_bytes(std::span{&header, 1}), received.fds, true, "header",
                until);

  if (header.magic != frame_magic) {
    throw protocol_error(
        fmt::format("receive_message on socket {}: bad magic {:#010x} (expected {:#010x}); the "
                    "peer is not a vmm channel or the stream lost sync",
                    socket_fd, header.magic, frame_magic));
  }
  if (header.payload_size > max_payload_bytes) {
    throw protocol_error(
        fmt::format("receive_message on socket {}: header declares a payload of {} bytes; at most {} allowed",
                    socket_fd, header.payload_size, max_payload_bytes));
  }
  if (header.fd_count != received.fds.size()) {
    throw protocol_error(
        fmt::format("receive_message on socket {}: header declares {} descriptors but {} arrived", socket_fd,
                    header.fd_count, received.fds.size()));
  }
  if (expected_fd_count && *expected_fd_count != received.fds.size()) {
    throw protocol_error(
        fmt::format("receive_message on socket {}: expected {} descriptors but the message "
                    "carries {}",
                    socket_fd, *expected_fd_count, received.fds.size()));
  }

  received.payload.resize(static_cast<std::size_t>(header.payload_size));
  receive_exact(socket_fd, received.payload, received.fds, false, "payload", until);
  return received;
}

void send_message(int socket_fd, std::span<const std::byte> payload, std::span<const int> fds,
                  std::chrono::milliseconds timeout) {
  detail::send_message(socket_fd, payload, fds, detail::deadline{timeout});
}

message receive_message(int socket_fd, std::optional<std::size_t> expected_fd_count,
                        std::chrono::milliseconds timeout) {
  return detail::receive_message(socket_fd, expected_fd_count, detail::deadline{timeout});
}

}  // namespace vmm::ipc
