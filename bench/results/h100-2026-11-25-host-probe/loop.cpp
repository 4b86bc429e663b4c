// The memory resource's hot path without clocks in the loop: N allocate + deallocate pairs of
// 1 KiB (p), or N steps of a window of 256 live blocks of random sizes 512 B-8 MiB (w), on
// OS memory; THREADED=1 makes (and joins) a thread first, as a CUDA process has threads.
//   g++ -O2 -std=c++20 -I vmm/include loop.cpp BUILD/vmm/libvmm.a -lfmt -ldl -lpthread -o loop
//   ./loop 3000000 p; THREADED=1 ./loop 2000000 w
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <thread>
#include <vmm/memory_resource.hpp>
#include <vmm/stream_ref.hpp>
#include <vmm/location.hpp>
int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 10000000;
  const bool window = argc > 2 && argv[2][0] == 'w';
  if (std::getenv("THREADED")) std::thread([] {}).join();
  vmm::memory_resource r(vmm::location::os_host());
  vmm::stream_ref s;
  std::vector<std::size_t> sizes(1 << 16);
  std::mt19937_64 g(42);
  std::uniform_real_distribution<double> u(std::log(512.0), std::log(8.0 * 1024 * 1024));
  for (auto& x : sizes) x = static_cast<std::size_t>(std::exp(u(g)));
  std::vector<std::pair<void*, std::size_t>> live(256);
  std::size_t next = 0, oldest = 0;
  if (window)
    for (auto& l : live) {
      l.second = sizes[next++ % sizes.size()];
      l.first = r.allocate(s, l.second);
    }
  const auto step = [&] {
    if (!window) {
      void* p = r.allocate(s, 1024);
      asm volatile("" : : "r"(p) : "memory");
      r.deallocate(s, p, 1024);
      return;
    }
    auto& l = live[oldest];
    oldest = (oldest + 1) % live.size();
    r.deallocate(s, l.first, l.second);
    l.second = sizes[next++ % sizes.size()];
    l.first = r.allocate(s, l.second);
  };
  for (int i = 0; i < 5000; ++i) step();
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) step();
  auto t1 = std::chrono::steady_clock::now();
  std::printf("%.1f ns per step\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / n);
  for (auto& l : live)
    if (l.first) r.deallocate(s, l.first, l.second);
}
