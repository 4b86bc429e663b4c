#pragma once
// What this process holds from the OS, the way a leak check compares it: open file
// descriptors, reservations and memfd mappings in /proc/self/maps; and its descriptor limit
// lowered for a test of what happens when no descriptor is left.

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "vmm/error.hpp"

namespace vmm::testing {

inline std::size_t open_fd_count() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

// The number the next descriptor opened would get: the lowest one free.
inline int lowest_free_descriptor() {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw vmm::os_error(errno, "open /dev/null");
  ::close(fd);
  return fd;
}

// Lowers RLIMIT_NOFILE's soft limit for its scope and restores it after. A test lowers it to
// lowest_free_descriptor() + n to leave exactly n descriptors to open.
class descriptor_limit {
 public:
  explicit descriptor_limit(rlim_t soft_limit) {
    if (::getrlimit(RLIMIT_NOFILE, &saved_) != 0) throw vmm::os_error(errno, "getrlimit");
    rlimit lowered = saved_;
    lowered.rlim_cur = soft_limit;
    if (::setrlimit(RLIMIT_NOFILE, &lowered) != 0) throw vmm::os_error(errno, "setrlimit");
  }
  descriptor_limit(const descriptor_limit&) = delete;
  descriptor_limit& operator=(const descriptor_limit&) = delete;
  ~descriptor_limit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }

 private:
  rlimit saved_{};
};

// What the descriptors of process `pid` name (/proc/PID/fd), counted by target with the
// numbers of each ("socket: 3 (4, 7, 9)"), for the message of a leak check that fails.
inline std::string open_fd_targets(long pid) {
  std::map<std::string, std::vector<std::string>> by_target;
  std::error_code error;
  const std::filesystem::path folder = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& entry : std::filesystem::directory_iterator(folder, error)) {
    std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (error) target = "(unreadable)";
    // "socket:[123]" and "anon_inode:[eventfd]" name their kind before the bracket.
    if (target.starts_with("socket:") || target.starts_with("pipe:"))
      target = target.substr(0, target.find(':'));
    by_target[target].push_back(entry.path().filename().string());
  }
  if (error) return folder.string() + ": " + error.message();
  std::string out;
  for (const auto& [target, fds] : by_target) {
    out += target + ": " + std::to_string(fds.size()) + " (";
    for (std::size_t i = 0; i < fds.size(); ++i) out += (i != 0 ? ", " : "") + fds[i];
    out += ")\n";
  }
  return out;
}

// The address ranges of the process (/proc/self/maps). A leak check compares reservations
// (ranges mapped without access, as address ranges and their alignment padding are) and the
// memfd mappings; it does not count lines, which the heap, a sanitizer's allocator and the
// CUDA driver change as they work.
struct address_interval {
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  bool inaccessible = false;  // PROT_NONE
  bool memfd = false;         // a mapping of one of the OS provider's memfds ("vmm")
};

inline std::vector<address_interval> process_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::vector<address_interval> ranges;
  for (std::string line; std::getline(maps, line);) {
    address_interval range;
    char dash = 0;
    std::string permissions;
    std::istringstream fields(line);
    fields >> std::hex >> range.start >> dash >> range.end >> permissions;
    range.inaccessible = permissions.starts_with("---");
    range.memfd = line.find("/memfd:vmm") != std::string::npos;
    ranges.push_back(range);
  }
  return ranges;
}

// The line of /proc/self/maps holding an address: its permissions ("r-", "rw") and its
// file's inode (0: anonymous memory, or no line holds the address).
struct mapped_at {
  std::string perms;
  std::uint64_t inode = 0;
  friend bool operator==(const mapped_at&, const mapped_at&) = default;
};

inline mapped_at mapping_of(const void* data) {
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string span, perms, offset, device;
    std::uint64_t inode = 0;
    fields >> span >> perms >> offset >> device >> inode;
    const auto dash = span.find('-');
    const std::uintptr_t start = std::stoull(span.substr(0, dash), nullptr, 16);
    const std::uintptr_t end = std::stoull(span.substr(dash + 1), nullptr, 16);
    if (address >= start && address < end) return {perms.substr(0, 2), inode};
  }
  return {};
}

inline std::size_t memfd_mappings(const std::vector<address_interval>& ranges) {
  return static_cast<std::size_t>(std::ranges::count_if(ranges, &address_interval::memfd));
}

// Bytes reserved in `after` (mapped without access) that nothing in `before` covered: what
// a reservation, or its padding, left behind adds.
inline std::size_t bytes_reserved_since(const std::vector<address_interval>& before,
                                        const std::vector<address_interval>& after = process_mappings()) {
  std::size_t fresh = 0;
  for (const address_interval& now : after) {
    if (!now.inaccessible) continue;
    std::uintptr_t at = now.start;
    for (const address_interval& old : before) {  // both lists are sorted by address
      if (old.end <= at || old.start >= now.end) continue;
      if (old.start > at) fresh += old.start - at;
      at = std::max(at, old.end);
      if (at >= now.end) break;
    }
    if (at < now.end) fresh += now.end - at;
  }
  return fresh;
}

}  // namespace vmm::testing
