#pragma once
// The bytes in use in a memory resource (as rounded, held by live blocks), their high-water
// mark, and the request the slow path is placing, which counts as in use while it is.
// Updated on the fast path without a lock.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "resource/arena_mutex.hpp"

namespace vmm::detail {

class usage {
 public:
  // After an allocation of `bytes`.
  void add(std::uint64_t bytes) noexcept {
    std::size_t now = 0;
    if (process_single_threaded()) {  // no other thread: no locked instruction (arena_mutex.hpp)
      now = used_.load(std::memory_order_relaxed) + bytes;
      used_.store(now, std::memory_order_relaxed);
    } else {
      now = used_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    }
    std::size_t high = high_.load(std::memory_order_relaxed);
    while (now > high && !high_.compare_exchange_weak(high, now, std::memory_order_relaxed)) {}
  }
  // After a free of `bytes`.
  void remove(std::uint64_t bytes) noexcept {
    if (process_single_threaded())
      used_.store(used_.load(std::memory_order_relaxed) - bytes, std::memory_order_relaxed);
    else
      used_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t current() const noexcept { return used_.load(); }
  [[nodiscard]] std::size_t high() const noexcept { return high_.load(); }
  void reset_high() noexcept { high_.store(used_.load()); }

  // Under the resource's mutex: the size the slow path is placing (0: none).
  void set_request(std::uint64_t size) noexcept { request_ = size; }
  // The most bytes ever in use, counting the request being placed.
  [[nodiscard]] std::uint64_t most_in_use() const noexcept {
    return std::max<std::uint64_t>(high_.load(std::memory_order_relaxed), used_.load() + request_);
  }

 private:
  std::atomic<std::size_t> used_{0};
  std::atomic<std::size_t> high_{0};
  std::uint64_t request_ = 0;
};

}  // namespace vmm::detail
