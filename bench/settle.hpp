#pragma once
/// @file
/// Waiting, untimed, until a GPU is done with memory a benchmark has just freed.
///
/// The driver scrubs freed device memory on the GPU after cuMemRelease (or cudaFree) has
/// returned: on an H100, writes ran ~12 % slower for about 20 ms after 16 GiB was released
/// (1.25 ms/GiB), and cold growth in 256 MiB handles started right after the release of the
/// previous iteration's 16 GiB took 27 ms instead of 9.4 ms (docs/GPU-FACTS.md, "Freed
/// memory"). A benchmark that frees and then measures fresh memory again waits here first, so
/// every timed run starts from the same state and a row's time does not depend on what ran
/// before it.

#include <chrono>
#include <cstddef>
#include <thread>

namespace vmm::bench {

/// Sleeps 2 ms plus 4 ms per GiB `released` (three times the scrub rate measured).
inline void settle_after_release(std::size_t released) {
  constexpr std::size_t bytes_per_ms = (std::size_t{1} << 30) / 4;
  std::this_thread::sleep_for(std::chrono::milliseconds(2 + released / bytes_per_ms));
}

}  // namespace vmm::bench
