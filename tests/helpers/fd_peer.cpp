/// @file
/// The second process of tests/ipc/fd_channel_test.cpp: usage `fd_peer SOCKET_PATH`.
///
/// Connects to SOCKET_PATH, receives one message carrying exactly one descriptor (a file,
/// typically a memfd), and then:
///  - appends fd_peer_suffix to that file, so the sender can see both processes share it;
///  - replies with one message whose payload is the file's original bytes and whose one
///    descriptor is a new memfd holding those bytes in reverse order.
/// Exits 0 on success; on any failure prints the reason to stderr and exits 1.

#include <vmm/error.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/unique_fd.hpp>

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <span>
#include <string_view>
#include <vector>

namespace {

constexpr std::string_view fd_peer_suffix = "|seen by fd_peer";

void write_all_at(int fd, std::span<const std::byte> bytes, off_t offset) {
  while (!bytes.empty()) {
    ssize_t const written = ::pwrite(fd, bytes.data(), bytes.size(), offset);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw vmm::os_error(errno, fmt::format("pwrite to fd {}", fd));
    }
    bytes = bytes.subspan(static_cast<std::size_t>(written));
    offset += written;
  }
}

std::vector<std::byte> read_whole_file(int fd) {
  struct stat status {};
  if (::fstat(fd, &status) != 0) throw vmm::os_error(errno, fmt::format("fstat fd {}", fd));
  std::vector<std::byte> bytes(static_cast<std::size_t>(status.st_size));
  std::size_t filled = 0;
  while (filled < bytes.size()) {
    ssize_t const got = ::pread(fd, bytes.data() + filled, bytes.size() - filled, static_cast<off_t>(filled));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw vmm::os_error(errno, fmt::format("pread from fd {}", fd));
    }
    if (got == 0) throw vmm::os_error(EIO, fmt::format("fd {} shrank while being read", fd));
    filled += static_cast<std::size_t>(got);
  }
  return bytes;
}

int run(const char* socket_path) {
  vmm::unique_fd const channel = vmm::ipc::connect_unix(socket_path);
  vmm::ipc::message const request = vmm::ipc::receive_message(channel.get(), 1);
  int const shared_file = request.fds.front().get();

  std::vector<std::byte> const original = read_whole_file(shared_file);
  write_all_at(shared_file, std::as_bytes(std::span{fd_peer_suffix}), static_cast<off_t>(original.size()));

  vmm::unique_fd reversed{::memfd_create("fd_peer_reversed", MFD_CLOEXEC)};
  if (!reversed) throw vmm::os_error(errno, "memfd_create(\"fd_peer_reversed\")");
  std::vector<std::byte> reversed_bytes(original.rbegin(), original.rend());
  write_all_at(reversed.get(), reversed_bytes, 0);

  int const reply_fds[] = {reversed.get()};
  vmm::ipc::send_message(channel.get(), original, reply_fds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SOCKET_PATH\n", argc > 0 ? argv[0] : "fd_peer");
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "fd_peer: %s\n", error.what());
    return 1;
  }
}
