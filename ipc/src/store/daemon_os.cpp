#include "daemon_os.hpp"

#include <vmm/error.hpp>
#include <vmm/ipc/fd_channel.hpp>

#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstring>

namespace vmm::store::detail {

// Not std::filesystem: its error_code overloads are noexcept yet allocate, and a daemon out
// of memory would terminate in them.
std::size_t open_fd_count() {
  DIR* listing = ::opendir("/proc/self/fd");
  if (listing == nullptr) return 0;
  std::size_t count = 0;
  while (const dirent* found = ::readdir(listing))
    if (found->d_name[0] != '.') ++count;
  ::closedir(listing);
  return count;
}

std::uint64_t realtime_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(now.tv_nsec);
}

// Replaces a socket file nothing listens at; refuses a live one.
void clear_stale_socket(const std::string& path) {
  struct stat status {};
  if (::lstat(path.c_str(), &status) != 0) return;
  if (!S_ISSOCK(status.st_mode))
    throw invalid_argument(fmt::format("vmm-store: {} exists and is not a socket", path));
  try {
    const unique_fd probe = ipc::connect_unix(path);
  } catch (const os_error& error) {
    if (error.code().value() != ECONNREFUSED) throw;
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      throw os_error(errno, fmt::format("vmm-store: unlink of the stale socket {}", path));
    return;
  }
  throw invalid_argument(fmt::format("vmm-store: a daemon already listens at {}", path));
}

void take_descriptors(const msghdr& message, std::vector<unique_fd>& fds) {
  auto* header = const_cast<msghdr*>(&message);  // the CMSG macros take a non-const header
  for (cmsghdr* c = CMSG_FIRSTHDR(header); c != nullptr; c = CMSG_NXTHDR(header, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      unique_fd owned(fd);  // closed if the vector cannot take it
      fds.push_back(std::move(owned));
    }
  }
}

}  // namespace vmm::store::detail
