#pragma once
// Adds the host time from `start` to the end of a scope to a total (the statistics'
// slow_path_time and host_wait_time), however the scope is left.

#include <chrono>

namespace vmm::detail {

class timed_into {
 public:
  explicit timed_into(std::chrono::nanoseconds& total,
                      std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now()) noexcept
      : total_(total), start_(start) {}
  timed_into(const timed_into&) = delete;
  timed_into& operator=(const timed_into&) = delete;
  ~timed_into() { total_ += std::chrono::steady_clock::now() - start_; }

 private:
  std::chrono::nanoseconds& total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace vmm::detail
