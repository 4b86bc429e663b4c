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

// Whether every line of /proc/self/maps belongs to the program: AddressSanitizer's and
// ThreadSanitizer's allocators map memory of their own as the process runs (the quarantine
// of freed blocks, shadow for new mappings, more of them in a fresh process), so under them
// only the memfd lines count. The CUDA driver maps memory of its own too (staging buffers
// for copies): on GPU memory the address space's book and the descriptors are what count.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool maps_lines_are_the_programs = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool maps_lines_are_the_programs = false;
#else
inline constexpr bool maps_lines_are_the_programs = true;
#endif
#else
inline constexpr bool maps_lines_are_the_programs = true;
#endif

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
