#include "fault_injection.hpp"

#include <mutex>

namespace vmm::detail::fault {
namespace {

struct plan {
  std::uint32_t sites = 0;
  std::uint64_t nth = 0;
  int error = 0;
  std::uint64_t calls = 0;
  bool fired = false;
};

std::mutex& plan_mutex() {
  static auto* const mutex = new std::mutex();
  return *mutex;
}

plan& current() {
  static plan state;
  return state;
}

}  // namespace

namespace internal {

std::atomic<bool> armed{false};

bool should_fail(site where, int& error) noexcept {
  std::lock_guard lock(plan_mutex());
  plan& p = current();
  if ((p.sites & where) == 0) return false;
  if (++p.calls != p.nth) return false;
  p.fired = true;
  error = p.error;
  return true;
}

}  // namespace internal

void arm(std::uint32_t sites, std::uint64_t nth, int error) noexcept {
  std::lock_guard lock(plan_mutex());
  current() = plan{sites, nth, error, 0, false};
  internal::armed.store(true, std::memory_order_relaxed);
}

void disarm() noexcept {
  std::lock_guard lock(plan_mutex());
  internal::armed.store(false, std::memory_order_relaxed);
  current().sites = 0;
}

std::uint64_t calls() noexcept {
  std::lock_guard lock(plan_mutex());
  return current().calls;
}

bool fired() noexcept {
  std::lock_guard lock(plan_mutex());
  return current().fired;
}

}  // namespace vmm::detail::fault
