#pragma once
/// @file
/// Waiting, untimed, until a GPU is done with memory a benchmark has just freed.
///
/// The driver scrubs freed device memory on the GPU after cuMemRelease (or cudaFree) has
/// returned: writes run slower meanwhile, and large handles created during the scrub are
/// slow to grant (docs/GPU-FACTS.md, "Freed memory", has the rate). A benchmark that frees
/// and then measures fresh memory again waits here first, so every timed run starts from the
/// same state and a row's time does not depend on what ran before it.

#include <chrono>
#include <cstddef>
#include <thread>

namespace vmm::bench {

/// Sleeps 2 ms plus 4 ms per GiB `released` (about three times the scrub rate measured).
inline void settle_after_release(std::size_t released) {
  constexpr std::size_t bytes_per_ms = (std::size_t{1} << 30) / 4;
  std::this_thread::sleep_for(std::chrono::milliseconds(2 + released / bytes_per_ms));
}

}  // namespace vmm::bench
