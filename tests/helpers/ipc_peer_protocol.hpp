#pragma once
// What tests/ipc/ipc_sharing_test.cpp and its second process, tests/helpers/ipc_peer.cpp, say to
// each other besides manifests: the peer's report of what it sees, and a bare "go on".
// Both ends run on one host from one build: plain structs in host byte order.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "vmm/error.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/protocol_error.hpp"

extern char** environ;

namespace vmm::testing {

// The socket end the test hands the peer, as its descriptor 3.
inline constexpr int peer_socket_fd = 3;

enum class peer_status : std::uint64_t {
  ok = 0,
  write_faulted = 1,    // a write to a read-only import faulted, as it must
  write_succeeded = 2,  // a write to a read-only import went through: a failure
};

// What the peer sees of its import.
struct peer_report {
  std::uint64_t checksum = 0;  // FNV-1a of [0, size) of the import
  std::uint64_t size = 0;
  std::uint64_t capacity = 0;
  std::uint64_t address = 0;
  peer_status status = peer_status::ok;
};

inline void send_report(int socket_fd, const peer_report& report) {
  ipc::send_message(socket_fd, std::as_bytes(std::span(&report, 1)));
}

inline peer_report receive_report(int socket_fd) {
  const ipc::message received = ipc::receive_message(socket_fd, 0);
  peer_report report;
  if (received.payload.size() != sizeof report) throw ipc::protocol_error("peer report of the wrong size");
  std::memcpy(&report, received.payload.data(), sizeof report);
  return report;
}

// The peer's own descriptor counts in mode "cycles": before the first import, after the
// first cycle (whatever the driver opens on its first import is open by then) and after
// the last.
struct peer_fd_report {
  std::uint64_t before_first = 0;
  std::uint64_t after_first = 0;
  std::uint64_t after_last = 0;
};

inline void send_fd_report(int socket_fd, const peer_fd_report& report) {
  ipc::send_message(socket_fd, std::as_bytes(std::span(&report, 1)));
}

inline peer_fd_report receive_fd_report(int socket_fd) {
  const ipc::message received = ipc::receive_message(socket_fd, 0);
  peer_fd_report report;
  if (received.payload.size() != sizeof report) throw ipc::protocol_error("peer fd report of the wrong size");
  std::memcpy(&report, received.payload.data(), sizeof report);
  return report;
}

// How much of each chunk "cycles" reads for its checksum (sampled_checksum).
inline constexpr std::size_t cycle_sample_bytes = 4096;

// What the GPU consumer (tests/helpers/ipc_kernel_peer.cu) saw: the smallest and largest
// int in the import, as its kernel read them.
struct kernel_peer_report {
  std::int32_t min = 0;
  std::int32_t max = 0;
};

inline void send_kernel_report(int socket_fd, const kernel_peer_report& report) {
  ipc::send_message(socket_fd, std::as_bytes(std::span(&report, 1)));
}

inline kernel_peer_report receive_kernel_report(int socket_fd) {
  const ipc::message received = ipc::receive_message(socket_fd, 0);
  kernel_peer_report report;
  if (received.payload.size() != sizeof report)
    throw ipc::protocol_error("kernel peer report of the wrong size");
  std::memcpy(&report, received.payload.data(), sizeof report);
  return report;
}

// "Go on" (the next step of a mode that waits for the other side).
inline void send_go(int socket_fd) {
  const std::uint32_t go = 0x676f;
  ipc::send_message(socket_fd, std::as_bytes(std::span(&go, 1)));
}

inline void receive_go(int socket_fd) {
  const ipc::message received = ipc::receive_message(socket_fd, 0);
  if (received.payload.size() != sizeof(std::uint32_t)) throw ipc::protocol_error("not a go message");
}

// A peer program started with posix_spawn (never fork: the test may have started CUDA),
// with one end of a socket pair as its descriptor peer_socket_fd. Killed and reaped on
// destruction if it is still running. If the peer dies, the socket reads end of stream:
// nothing here waits forever on a dead peer.
class peer_process {
 public:
  // argv[0] is the program's path.
  explicit peer_process(std::vector<std::string> argv) {
    auto [mine, theirs] = ipc::make_socket_pair();
    // Never descriptor 3 itself: only a dup2 onto another number clears close-on-exec.
    const unique_fd child_end(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, 10));
    if (!child_end) throw os_error(errno, "fcntl(F_DUPFD_CLOEXEC)");
    std::vector<char*> pointers;
    for (std::string& word : argv) pointers.push_back(word.data());
    pointers.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, child_end.get(), peer_socket_fd);
    const int result = ::posix_spawn(&pid_, pointers[0], &actions, nullptr, pointers.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (result != 0) throw os_error(result, "posix_spawn of " + argv[0]);
    socket_ = std::move(mine);
  }
  peer_process(const peer_process&) = delete;
  peer_process& operator=(const peer_process&) = delete;
  ~peer_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  [[nodiscard]] int socket() const noexcept { return socket_.get(); }
  void close_socket() noexcept { socket_.reset(); }
  // Waits for the peer to end; its wait status.
  int wait() {
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) throw os_error(errno, "waitpid");
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  unique_fd socket_;
};

inline bool exited_cleanly(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace vmm::testing
