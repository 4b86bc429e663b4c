#pragma once
/// @file
/// The two benchmarks that hand memory to another process (vmm_bench_ipc and
/// vmm_bench_resource_ipc) run their own program again as the importer, connected by a
/// socket pair, and speak fixed-size values over it (one host, host byte order). CUDA C++
/// and C++ alike.

#include <errno.h>  // program_invocation_short_name
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "failure.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/unique_fd.hpp"

extern char** environ;

namespace vmm::bench {

/// The importer's end of the socket pair: its descriptor 3.
inline constexpr int peer_socket_fd = 3;

/// Sends `value`'s bytes, with `fds`, as one message.
template <class T>
void send_value(int socket, const T& value, std::span<const int> fds = {}) {
  vmm::ipc::send_message(socket, std::as_bytes(std::span(&value, 1)), fds);
}

/// Receives one message of exactly sizeof(T) bytes and `fds` descriptors (kept in
/// `received_fds` when given). @throws bench_failure a message of another size.
template <class T>
T receive_value(int socket, std::size_t fds = 0, std::vector<vmm::unique_fd>* received_fds = nullptr) {
  vmm::ipc::message message = vmm::ipc::receive_message(socket, fds);
  T value{};
  if (message.payload.size() != sizeof value) throw bench_failure("a message of the wrong size");
  std::memcpy(&value, message.payload.data(), sizeof value);
  if (received_fds != nullptr) *received_fds = std::move(message.fds);
  return value;
}

/// This program again, started as `/proc/self/exe <peer_flag>` with a socket pair's end as
/// its descriptor peer_socket_fd. Destruction closes this end (the importer sees it and
/// exits) and waits for the importer, reporting an unclean exit.
class importer_process {
 public:
  explicit importer_process(const char* peer_flag) {
    auto [mine, theirs] = vmm::ipc::make_socket_pair();
    const vmm::unique_fd child_end(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, 10));
    if (!child_end) throw bench_failure("fcntl(F_DUPFD_CLOEXEC) failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, child_end.get(), peer_socket_fd);
    std::string self = "/proc/self/exe";
    std::string flag = peer_flag;
    char* argv[] = {self.data(), flag.data(), nullptr};
    const int result = ::posix_spawn(&pid_, self.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    if (result != 0)
      throw bench_failure(std::string("posix_spawn of the importer: ") + std::strerror(result));
    socket_ = std::move(mine);
  }
  importer_process(const importer_process&) = delete;
  importer_process& operator=(const importer_process&) = delete;
  ~importer_process() {
    socket_.reset();
    int status = 0;
    if (pid_ > 0 && ::waitpid(pid_, &status, 0) == pid_ && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      std::fprintf(stderr, "%s: the importer ended with status %d\n", program_invocation_short_name, status);
  }
  [[nodiscard]] int socket() const noexcept { return socket_.get(); }

 private:
  pid_t pid_ = -1;
  vmm::unique_fd socket_;
};

}  // namespace vmm::bench
