#pragma once
// A clock for timing one short call (vmm-replay, vmm_bench_resource).
//
// A steady_clock reading through the vDSO costs a good part of a call that short, and a
// reading of the time-stamp counter a fraction of that (vmm-replay prints what one timing's
// clock reads cost, `clock_ns`, beside its figures). So where the processor's TSC is
// invariant (x86-64, CPUID 0x80000007 EDX bit 8: it ticks at one rate whatever the core's
// frequency, as the kernel's tsc clock source needs), a call is timed in TSC ticks,
// converted to ns by the rate measured against steady_clock between the clock's
// construction and calibrate(); elsewhere with steady_clock itself.

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include <chrono>
#include <cstdint>
#include <string_view>

namespace vmm::tools {

class call_clock {
 public:
  using steady = std::chrono::steady_clock;

  call_clock() : tsc_(invariant_tsc()), started_(steady::now()), started_ticks_(now()) {}

  // The time now, in ticks (TSC ticks, or ns of steady_clock).
  [[nodiscard]] std::uint64_t now() const noexcept {
#if defined(__x86_64__)
    if (tsc_) return __rdtsc();
#endif
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now().time_since_epoch()).count());
  }

  // Ends the calibration: from here on, to_ns() converts with the rate seen since
  // construction (a longer time gives a closer rate: the whole run, or at least milliseconds).
  void calibrate() {
    if (!tsc_) return;
    const std::uint64_t elapsed_ticks = now() - started_ticks_;
    const double elapsed_ns = std::chrono::duration<double, std::nano>(steady::now() - started_).count();
    if (elapsed_ticks != 0) ns_per_tick_ = elapsed_ns / static_cast<double>(elapsed_ticks);
  }
  [[nodiscard]] double to_ns(double ticks) const noexcept {
    return ticks * ns_per_tick_;
  }
  [[nodiscard]] std::string_view name() const noexcept {
    return tsc_ ? "TSC" : "steady_clock";
  }

 private:
  static bool invariant_tsc() noexcept {
#if defined(__x86_64__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(0x80000007u, &a, &b, &c, &d) != 0 && (d & (1u << 8)) != 0;
#else
    return false;
#endif
  }

  bool tsc_;
  steady::time_point started_;
  std::uint64_t started_ticks_;
  double ns_per_tick_ = 1.0;  // steady_clock's ticks are ns
};

}  // namespace vmm::tools
