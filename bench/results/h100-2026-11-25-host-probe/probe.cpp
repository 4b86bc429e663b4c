// What costs what on this host: a dependent arithmetic chain, a locked add, an uncontended
// std::mutex, the TSC and steady_clock, and random pointer chases over 32 KiB to 256 MiB.
//   g++ -O2 -std=c++20 probe.cpp -o probe && ./probe      (output.txt beside this file)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>
#include <x86intrin.h>
using clk = std::chrono::steady_clock;
template <class F>
double ns_per(std::size_t n, F f) {
  auto t0 = clk::now();
  f();
  auto t1 = clk::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}
volatile std::uint64_t sink;
double chase(std::size_t bytes) {
  std::size_t n = bytes / 64;
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
  std::vector<std::size_t> next(n * 8);
  for (std::size_t i = 0; i < n; ++i) next[order[i] * 8] = order[(i + 1) % n] * 8;
  std::size_t p = 0;
  const std::size_t steps = 4'000'000;
  for (std::size_t i = 0; i < n; ++i) p = next[p];
  double r = ns_per(steps, [&] {
    for (std::size_t i = 0; i < steps; ++i) p = next[p];
  });
  sink = p;
  return r;
}
int main() {
  const std::size_t N = 50'000'000;
  for (int round = 0; round < 2; ++round) {
    std::uint64_t x = 1;
    double add = ns_per(N, [&] {
      for (std::size_t i = 0; i < N; ++i) {
        x = x * 3 + 1;
        asm volatile("" : "+r"(x));
      }
    });
    std::atomic<std::uint64_t> a{0};
    double xadd = ns_per(N / 10, [&] {
      for (std::size_t i = 0; i < N / 10; ++i) a.fetch_add(1);
    });
    std::mutex m;
    double mtx = ns_per(N / 10, [&] {
      for (std::size_t i = 0; i < N / 10; ++i) {
        m.lock();
        m.unlock();
      }
    });
    double tsc = ns_per(N / 10, [&] {
      std::uint64_t s = 0;
      for (std::size_t i = 0; i < N / 10; ++i) s += __rdtsc();
      sink = s;
    });
    double sc = ns_per(N / 10, [&] {
      std::uint64_t s = 0;
      for (std::size_t i = 0; i < N / 10; ++i) s += clk::now().time_since_epoch().count();
      sink = s;
    });
    std::printf(
        "dep mul-add %.2f ns (%.2f GHz-equiv at 4 cycles), lock xadd %.2f, mutex pair %.2f, rdtsc %.2f, "
        "steady_clock %.2f\n",
        add, 4.0 / add, xadd, mtx, tsc, sc);
    for (std::size_t kb : {32, 256, 1024, 4096, 16384, 262144})
      std::printf("  chase %zu KiB: %.1f ns\n", kb, chase(kb << 10));
    sink = x;
  }
}
