#pragma once
/// @file
/// A move-only owner of a file descriptor.
///
///     vmm::physical_allocation memory(vmm::provider_for(vmm::location::os_host()), 2 << 20);
///     vmm::unique_fd fd = memory.export_fd();   // owned: closed when `fd` goes
///     send_to_peer(fd.get());                   // get(): lent; `fd` still owns it
///     int raw = fd.release();                   // release(): the caller closes `raw` now
///
/// get() and release() mean what they mean on every RAII handle of vmm: get() lends the
/// owned value, release() gives up ownership and hands the value to the caller.

#include <unistd.h>

#include <utility>

namespace vmm {

/// Owns a file descriptor and closes it on destruction. -1 means "none".
class unique_fd {
 public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  /// The descriptor, still owned.
  [[nodiscard]] int get() const noexcept { return fd_; }
  /// Gives up ownership and returns the descriptor.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the owned descriptor (if any) and owns `fd` instead.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace vmm
