#pragma once
// What tests/store/store_test.cpp (and tests/store/store_soak_test.cpp) and their processes say to each
// other: the child processes themselves (a vmm-store daemon, tests/helpers/store_peer.cpp),
// started with posix_spawn with one end of a socket pair as descriptor 3, the peer's report
// of what it sees, and the temporary directory the daemon's socket lives in.
// Both ends run on one host from one build: plain structs in host byte order.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "vmm/error.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/protocol_error.hpp"

extern char** environ;

namespace vmm::testing {

inline constexpr int store_child_fd = 3;
// The size of the sealed buffer "shared" of tests/store/store_soak_test.cpp, which every soak peer
// reads in every cycle (pattern(0x5eed)).
inline constexpr std::size_t soak_shared_bytes = 3 * 4096 + 17;

// What a store peer sees.
struct store_report {
  std::uint64_t checksum = 0;  // FNV-1a of [0, size) of its handle
  std::uint64_t size = 0;
  std::uint64_t capacity = 0;
  std::uint64_t address = 0;
  std::int64_t error = 0;  // 0, or the store_error code of the refused request
  std::uint64_t write_faulted = 0;
};

inline void send_store_report(int socket_fd, const store_report& report) {
  ipc::send_message(socket_fd, std::as_bytes(std::span(&report, 1)));
}

inline store_report receive_store_report(int socket_fd,
                                         std::chrono::milliseconds timeout = ipc::default_timeout) {
  const ipc::message received = ipc::receive_message(socket_fd, 0, timeout);
  store_report report;
  if (received.payload.size() != sizeof report) throw ipc::protocol_error("store report of the wrong size");
  std::memcpy(&report, received.payload.data(), sizeof report);
  return report;
}

inline void send_word(int socket_fd, std::uint32_t word = 0x676f) {
  ipc::send_message(socket_fd, std::as_bytes(std::span(&word, 1)));
}

// A program started with posix_spawn, with one end of a socket pair as its descriptor 3.
// Killed and reaped on destruction if still running.
class child_process {
 public:
  explicit child_process(std::vector<std::string> argv) {
    auto [mine, theirs] = ipc::make_socket_pair();
    const unique_fd child_end(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, 10));
    if (!child_end) throw os_error(errno, "fcntl(F_DUPFD_CLOEXEC)");
    std::vector<char*> pointers;
    for (std::string& word : argv) pointers.push_back(word.data());
    pointers.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, child_end.get(), store_child_fd);
    const int result = ::posix_spawn(&pid_, pointers[0], &actions, nullptr, pointers.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (result != 0) throw os_error(result, "posix_spawn of " + argv[0]);
    socket_ = std::move(mine);
  }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  ~child_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  [[nodiscard]] int socket() const noexcept { return socket_.get(); }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  void close_socket() noexcept { socket_.reset(); }
  // Sends `signal` and reaps the child: once this returns, every descriptor it had is closed.
  int kill_and_wait(int signal = SIGKILL) {
    ::kill(pid_, signal);
    return wait();
  }
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

// A temporary directory, removed with everything in it.
class temporary_directory {
 public:
  temporary_directory() {
    char name[] = "/tmp/vmm-store-test-XXXXXX";
    if (::mkdtemp(name) == nullptr) throw os_error(errno, "mkdtemp");
    path_ = name;
  }
  ~temporary_directory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

#ifdef VMM_STORE_PATH
// A vmm-store daemon (the tool the build names), listening once the constructor returns.
class daemon_process {
 public:
  daemon_process(const std::string& socket, const std::vector<std::string>& extra = {}) : socket_(socket) {
    std::vector<std::string> argv{VMM_STORE_PATH, "serve", "--socket", socket, "--ready-fd", "3"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    process_ = std::make_unique<child_process>(argv);
    char byte = 0;
    if (::read(process_->socket(), &byte, 1) != 1) throw std::runtime_error("the daemon did not start");
  }
  [[nodiscard]] const std::string& socket() const noexcept { return socket_; }
  child_process& process() { return *process_; }

 private:
  std::string socket_;
  std::unique_ptr<child_process> process_;
};
#endif

}  // namespace vmm::testing
