#pragma once
// What this process holds from the OS, counted the way a leak check compares it: open file
// descriptors and lines of /proc/self/maps (all of them, and those of the OS provider's
// memfds, named "vmm").

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>

namespace vmm::testing {

inline std::size_t open_fd_count() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

struct maps_lines {
  std::size_t all = 0;
  std::size_t memfd = 0;  // mappings of the OS provider's memfds
  friend bool operator==(const maps_lines&, const maps_lines&) = default;
};

inline maps_lines count_maps_lines() {
  std::ifstream maps("/proc/self/maps");
  maps_lines count;
  for (std::string line; std::getline(maps, line);) {
    ++count.all;
    if (line.find("/memfd:vmm") != std::string::npos) ++count.memfd;
  }
  return count;
}

}  // namespace vmm::testing
