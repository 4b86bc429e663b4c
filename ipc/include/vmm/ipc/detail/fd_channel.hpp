#pragma once
// The channel calls of fd_channel.hpp under a deadline (implemented with them, in
// fd_channel.cpp), and the deadline: the moment a conversation step gives up waiting for its
// peer. A caller gives a timeout (fd_channel.hpp); a step of several messages (a
// manifest and its continuations) turns it into one deadline and passes that to every
// message, so that the timeout bounds the whole step and not each message of it.
//
// Internal (vmm/ipc/detail/): installed for vmm::store, which builds on it, and not part of
// vmm::ipc's interface: it may change in any release without notice.

#include <vmm/ipc/fd_channel.hpp>

#include <chrono>
#include <climits>
#include <cstddef>
#include <optional>
#include <span>

namespace vmm::ipc::detail {

class deadline {
 public:
  using clock = std::chrono::steady_clock;

  /// Starts now and ends `timeout` later; never for no_timeout (or any timeout that would
  /// run past the clock's end); at once for zero or less.
  explicit deadline(std::chrono::milliseconds timeout) noexcept
      : start_(clock::now()), timeout_(timeout), end_(end_after(start_, timeout)) {}

  /// What poll() takes: the milliseconds left, rounded up so that poll never returns just
  /// before the end; 0 once the end has passed; -1 (wait without end) when there is none.
  [[nodiscard]] int poll_timeout() const noexcept {
    if (end_ == clock::time_point::max()) return -1;
    const clock::duration left = end_ - clock::now();
    if (left <= clock::duration::zero()) return 0;
    const auto milliseconds = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return milliseconds > INT_MAX ? INT_MAX : static_cast<int>(milliseconds);
  }
  [[nodiscard]] bool passed() const noexcept {
    return end_ != clock::time_point::max() && clock::now() >= end_;
  }
  /// How long since the start, for messages.
  [[nodiscard]] std::chrono::milliseconds waited() const noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start_);
  }
  /// The timeout it was made from, for messages.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

 private:
  static clock::time_point end_after(clock::time_point start, std::chrono::milliseconds timeout) noexcept {
    if (timeout <= std::chrono::milliseconds::zero()) return start;
    const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(clock::time_point::max() - start);
    return timeout >= room ? clock::time_point::max() : start + timeout;
  }

  clock::time_point start_;
  std::chrono::milliseconds timeout_;
  clock::time_point end_;  // time_point::max(): none
};

/// send_message and receive_message of fd_channel.hpp, under a deadline that the caller
/// may share with other messages.
void send_message(int socket_fd, std::span<const std::byte> payload, std::span<const int> fds,
                  const deadline& until);
[[nodiscard]] message receive_message(int socket_fd, std::optional<std::size_t> expected_fd_count,
                                      const deadline& until);
/// Writes what the socket takes now of one message as send_message frames it (the header,
/// then the payload; the descriptors go with the first byte), from byte `sent` on, adding
/// what it wrote to `sent`. Never waits: returns false when the socket would block (or a
/// signal came), true once the whole message is written. Limits are not checked here.
/// @throws os_error the socket broke.
bool send_some(int socket_fd, std::span<const std::byte> payload, std::span<const int> fds,
               std::size_t& sent);

}  // namespace vmm::ipc::detail
