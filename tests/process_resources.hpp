#pragma once
// What this process holds from the OS, the way a leak check compares it: open file
// descriptors, reservations and memfd mappings in /proc/self/maps.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace vmm::testing {

inline std::size_t open_fd_count() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
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
