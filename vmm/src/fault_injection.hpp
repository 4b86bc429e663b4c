#pragma once
// Test-only fault injection: makes the Nth call of chosen OS functions or of any driver
// entry point fail, so that tests can sweep N over an operation and prove that every
// failure point leaves a documented exception, the strong guarantee where documented, and
// nothing leaked. Every OS call vmm makes goes through vmm::os (vmm/detail/system.hpp) and every
// driver call through driver::check / driver::try_call, which ask fail_here() first; a
// provider's export as a whole can fail too (provider_export).
//
// Disarmed (the normal state) the cost is one relaxed atomic load per call. Arming is
// process-wide: sweeps run single-threaded; calls from other threads count too.

#include <atomic>
#include <cstdint>

namespace vmm::detail::fault {

// The places a failure can be injected. A mask of them says which calls count.
enum site : std::uint32_t {
  memfd_create = 1u << 0,
  fallocate = 1u << 1,  // sizing a memfd: fallocate, or ftruncate where pages come at first touch
  mmap = 1u << 2,
  munmap = 1u << 3,
  mprotect = 1u << 4,
  fcntl = 1u << 5,  // dup (F_DUPFD_CLOEXEC), seals
  fstat = 1u << 6,
  sendmsg = 1u << 7,
  recvmsg = 1u << 8,
  poll = 1u << 9,
  driver = 1u << 10,  // any CUDA driver entry point
  all_os = (1u << 10) - 1,
  // memory_provider::export_fd as a whole, once its arguments are checked: the refusal a
  // GPU's driver gives for a handle the process imported, on any provider (an os_error with
  // the injected errno). In no sweep's mask: an export that must not reach the provider is
  // what it tests.
  provider_export = 1u << 11,
};

// Counts calls at `sites` from now on; the `nth` (1-based) fails with `error` (an errno for
// OS sites, a CUresult for the driver). nth == 0 only counts.
void arm(std::uint32_t sites, std::uint64_t nth, int error) noexcept;
void disarm() noexcept;
// Calls at the armed sites since arm().
[[nodiscard]] std::uint64_t calls() noexcept;
// Whether the armed failure has been injected.
[[nodiscard]] bool fired() noexcept;

namespace internal {
extern std::atomic<bool> armed;
bool should_fail(site where, int& error) noexcept;
}  // namespace internal

// True when this call must fail; `error` then holds the value to fail with.
inline bool fail_here(site where, int& error) noexcept {
  if (!internal::armed.load(std::memory_order_relaxed)) return false;
  return internal::should_fail(where, error);
}

}  // namespace vmm::detail::fault
