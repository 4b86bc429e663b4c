// Could the driver's page calls leave the thread that allocates?
// (1) Launch cost: 20,000 empty kernels launched by the main thread, alone and while a
//     second thread maps, grants and unmaps 2 MiB pages (stitching) or also creates and
//     releases them; the second thread's page rate alone and during the launches.
// (2) A host-bound loop: each iteration "allocates" 8 pages, queues a memset and a copy from
//     the host into them, 50 (or 200) short kernels that write every byte, and reads each
//     page's first and last word back, checked; the pages are unmapped once the stream has
//     passed them. Synchronous: the main thread maps and grants before queueing. Grant-later:
//     the main thread maps, a worker thread grants and then writes the iteration's number
//     into a pinned host word the stream waits on (cuStreamWaitValue32) before the rest.
//     (The first version let the worker map too: the copies were refused at once, as below.)
// (3) Two threads: one maps and grants 64 pages while the other unmaps 64 others, against
//     each alone (does the driver serialise them?).
// nvcc -O2 -std=c++17 deferred_pages.cu -lcuda -o deferred_pages
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#define CHECK(x)                                                          \
  do {                                                                    \
    CUresult r_ = (x);                                                    \
    if (r_ != CUDA_SUCCESS) {                                             \
      const char* s_ = nullptr;                                           \
      cuGetErrorString(r_, &s_);                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); \
      std::exit(1);                                                       \
    }                                                                     \
  } while (0)

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

__global__ void noop() {}
__global__ void fill(unsigned* data, std::size_t n, unsigned value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    data[i] = value;
}

constexpr std::size_t page = std::size_t{2} << 20;
CUmemAllocationProp prop{};
CUmemAccessDesc access{};

// ---- (1) launches against page calls ----------------------------------------------------
struct page_thread {
  std::atomic<bool> stop{false};
  std::atomic<long> ops{0};
  std::thread thread;
  void start(bool create, CUcontext ctx) {
    stop = false;
    ops = 0;
    thread = std::thread([this, create, ctx] {
      CHECK(cuCtxSetCurrent(ctx));
      constexpr int n = 16;
      CUdeviceptr base = 0;
      CHECK(cuMemAddressReserve(&base, page * n, 0, 0, 0));
      std::vector<CUmemGenericAllocationHandle> h(n);
      for (auto& x : h) CHECK(cuMemCreate(&x, page, &prop, 0));
      while (!stop.load()) {
        for (int i = 0; i < n; ++i) {
          if (create) {
            CHECK(cuMemRelease(h[i]));
            CHECK(cuMemCreate(&h[i], page, &prop, 0));
          }
          CHECK(cuMemMap(base + i * page, page, 0, h[i], 0));
          CHECK(cuMemSetAccess(base + i * page, page, &access, 1));
          CHECK(cuMemUnmap(base + i * page, page));
          ops.fetch_add(1);
        }
      }
      for (auto& x : h) CHECK(cuMemRelease(x));
      CHECK(cuMemAddressFree(base, page * n));
    });
  }
  long finish() {
    stop = true;
    thread.join();
    return ops.load();
  }
};

void launches(CUcontext ctx) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  constexpr int count = 20000;
  for (int rep = 0; rep < 3; ++rep)
    for (int mode = 0; mode < 3; ++mode) {
      page_thread pt;
      if (mode > 0) pt.start(mode == 2, ctx);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const long before = pt.ops.load();
      const auto t = clock_type::now();
      for (int i = 0; i < count; ++i) noop<<<1, 32, 0, s>>>();
      const double launch_ms = ms_since(t);
      const long during = pt.ops.load() - before;
      cudaStreamSynchronize(s);
      long total = mode > 0 ? pt.finish() : 0;
      (void)total;
      std::printf("launch rep %d %-14s %.2f us/launch; page thread %ld pages in %.1f ms = %.1f us/page\n",
                  rep,
                  mode == 0   ? "alone"
                  : mode == 1 ? "+stitching"
                              : "+create/release",
                  launch_ms * 1e3 / count, during, launch_ms, during ? launch_ms * 1e3 / during : 0.0);
    }
  // the page thread alone
  for (int mode = 1; mode < 3; ++mode) {
    page_thread pt;
    pt.start(mode == 2, ctx);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const long before = pt.ops.load();
    const auto t = clock_type::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const long during = pt.ops.load() - before;
    const double ms = ms_since(t);
    pt.finish();
    std::printf("page thread alone %-14s %.1f us/page\n", mode == 1 ? "stitching" : "create/release",
                ms * 1e3 / during);
  }
  cudaStreamDestroy(s);
}

// ---- (2) a host-bound loop, synchronous or deferred mapping --------------------------------
struct worker {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;
  bool done = false;
  std::thread thread;
  explicit worker(CUcontext ctx) {
    thread = std::thread([this, ctx] {
      CHECK(cuCtxSetCurrent(ctx));
      for (;;) {
        std::function<void()> job;
        {
          std::unique_lock lock(m);
          cv.wait(lock, [&] { return done || !jobs.empty(); });
          if (jobs.empty()) return;
          job = std::move(jobs.front());
          jobs.pop_front();
        }
        job();
      }
    });
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard lock(m);
      jobs.push_back(std::move(job));
    }
    cv.notify_one();
  }
  ~worker() {
    {
      std::lock_guard lock(m);
      done = true;
    }
    cv.notify_one();
    thread.join();
  }
};

void host_bound(CUcontext ctx, bool deferred, int iterations, int kernels, int pages_each, int rep) {
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  constexpr int slots = 4;  // an iteration's pages go to slot i % slots; unmapped once the stream passed
  CUdeviceptr base = 0;
  CHECK(cuMemAddressReserve(&base, page * pages_each * slots, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> pool(pages_each * slots);
  for (auto& h : pool) CHECK(cuMemCreate(&h, page, &prop, 0));
  std::vector<CUevent> passed(iterations);  // one per iteration: a worker must never wait for a later one
  for (auto& e : passed) CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  std::vector<bool> mapped(slots, false);
  unsigned* flag = nullptr;
  CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&flag), 64,
                       CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  *flag = 0;
  CUdeviceptr flag_dev = 0;
  CHECK(cuMemHostGetDevicePointer(&flag_dev, flag, 0));
  unsigned* readback = nullptr;
  const std::size_t words = std::size_t{2} * pages_each * iterations;
  CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&readback), words * 4, 0));
  std::optional<worker> w;
  if (deferred) w.emplace(ctx);
  const auto map_slot = [&, base](int i) {
    const int slot = i % slots;
    const CUdeviceptr at = base + page * pages_each * slot;
    if (mapped[slot]) {
      CHECK(cuEventSynchronize(passed[i - slots]));  // the stream passed the slot's last use
      for (int p = 0; p < pages_each; ++p) CHECK(cuMemUnmap(at + p * page, page));
    }
    for (int p = 0; p < pages_each; ++p)
      CHECK(cuMemMap(at + p * page, page, 0, pool[slot * pages_each + p], 0));
    CHECK(cuMemSetAccess(at, page * pages_each, &access, 1));
    mapped[slot] = true;
  };
  double map_ms = 0;
  unsigned* source = nullptr;  // a host word copied into each iteration's first page
  CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&source), 4, 0));
  *source = 7;
  const auto t = clock_type::now();
  for (int i = 0; i < iterations; ++i) {
    const CUdeviceptr at = base + page * pages_each * (i % slots);
    const auto m0 = clock_type::now();
    if (deferred) {
      // The main thread maps; the worker grants, then lets the stream through.
      const int slot = i % slots;
      if (mapped[slot]) {
        CHECK(cuEventSynchronize(passed[i - slots]));
        for (int p = 0; p < pages_each; ++p) CHECK(cuMemUnmap(at + p * page, page));
      }
      for (int p = 0; p < pages_each; ++p)
        CHECK(cuMemMap(at + p * page, page, 0, pool[slot * pages_each + p], 0));
      mapped[slot] = true;
      w->post([&, at, i] {
        CHECK(cuMemSetAccess(at, page * pages_each, &access, 1));
        std::atomic_thread_fence(std::memory_order_seq_cst);
        *reinterpret_cast<volatile unsigned*>(flag) = static_cast<unsigned>(i + 1);
      });
      CHECK(cuStreamWaitValue32(s, flag_dev, static_cast<cuuint32_t>(i + 1), CU_STREAM_WAIT_VALUE_GEQ));
    } else {
      map_slot(i);
    }
    map_ms += ms_since(m0);
    // What torch does to fresh memory besides kernels: a memset and a copy from the host.
    CHECK(cuMemsetD32Async(at, 0, page * pages_each / 4, s));
    CHECK(cuMemcpyHtoDAsync(at + page, source, 4, s));
    const std::size_t n = page * pages_each / 4;
    for (int k = 0; k < kernels; ++k)
      fill<<<64, 256, 0, s>>>(reinterpret_cast<unsigned*>(at), n, static_cast<unsigned>(i * 1000 + k));
    for (int p = 0; p < pages_each; ++p) {
      CHECK(cuMemcpyDtoHAsync(readback + (std::size_t{2} * pages_each * i) + 2 * p, at + p * page, 4, s));
      CHECK(cuMemcpyDtoHAsync(readback + (std::size_t{2} * pages_each * i) + 2 * p + 1,
                              at + (p + 1) * page - 4, 4, s));
    }
    CHECK(cuEventRecord(passed[i], s));
  }
  const double issued = ms_since(t);
  CHECK(cuStreamSynchronize(s));
  const double total = ms_since(t);
  long wrong = 0;
  for (int i = 0; i < iterations; ++i)
    for (std::size_t k = 0; k < std::size_t{2} * pages_each; ++k)
      if (readback[std::size_t{2} * pages_each * i + k] != static_cast<unsigned>(i * 1000 + kernels - 1))
        ++wrong;
  std::printf(
      "loop rep %d %-11s %d iterations x (%d pages, %d kernels): issued %.1f ms, done %.1f ms (%.1f "
      "us/iteration), "
      "main thread mapping %.1f ms, wrong words %ld\n",
      rep, deferred ? "grant-later" : "synchronous", iterations, pages_each, kernels, issued, total,
      total * 1e3 / iterations, map_ms, wrong);
  w.reset();
  for (int slot = 0; slot < slots; ++slot)
    if (mapped[slot])
      for (int p = 0; p < pages_each; ++p)
        CHECK(cuMemUnmap(base + page * pages_each * slot + p * page, page));
  for (auto& h : pool) CHECK(cuMemRelease(h));
  for (auto& e : passed) CHECK(cuEventDestroy(e));
  CHECK(cuMemAddressFree(base, page * pages_each * slots));
  CHECK(cuMemFreeHost(flag));
  CHECK(cuMemFreeHost(readback));
  CHECK(cuMemFreeHost(source));
  CHECK(cuStreamDestroy(s));
}

// ---- (3) page calls on two threads: maps and grants on one, unmaps on the other -----------
void two_threads(CUcontext ctx) {
  constexpr int n = 64;
  CUdeviceptr a = 0, b = 0;
  CHECK(cuMemAddressReserve(&a, page * n, 0, 0, 0));
  CHECK(cuMemAddressReserve(&b, page * n, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> h(n);
  for (auto& x : h) CHECK(cuMemCreate(&x, page, &prop, 0));
  const auto map_grant = [&](CUdeviceptr base) {
    for (int i = 0; i < n; ++i) {
      CHECK(cuMemMap(base + i * page, page, 0, h[i], 0));
      CHECK(cuMemSetAccess(base + i * page, page, &access, 1));
    }
  };
  const auto unmap_all = [&](CUdeviceptr base) {
    for (int i = 0; i < n; ++i) CHECK(cuMemUnmap(base + i * page, page));
  };
  for (int rep = 0; rep < 5; ++rep) {
    map_grant(b);
    auto t = clock_type::now();
    map_grant(a);
    const double map_alone = ms_since(t);
    t = clock_type::now();
    unmap_all(b);
    const double unmap_alone = ms_since(t);
    unmap_all(a);
    map_grant(b);
    double unmap_during = 0;
    std::thread other([&] {
      CHECK(cuCtxSetCurrent(ctx));
      const auto u = clock_type::now();
      unmap_all(b);
      unmap_during = ms_since(u);
    });
    t = clock_type::now();
    map_grant(a);
    const double map_during = ms_since(t);
    other.join();
    const double both = ms_since(t);
    unmap_all(a);
    std::printf(
        "two threads rep %d: %d pages map+grant alone %.2f ms, unmap alone %.2f ms (serial %.2f); "
        "at once: map+grant %.2f ms, unmap %.2f ms, both done %.2f ms\n",
        rep, n, map_alone, unmap_alone, map_alone + unmap_alone, map_during, unmap_during, both);
  }
  for (auto& x : h) CHECK(cuMemRelease(x));
  CHECK(cuMemAddressFree(a, page * n));
  CHECK(cuMemAddressFree(b, page * n));
}

int main() {
  cudaFree(nullptr);
  CUcontext ctx;
  CHECK(cuCtxGetCurrent(&ctx));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  two_threads(ctx);
  if (std::getenv("TWO_THREADS_ONLY") != nullptr) return 0;
  if (std::getenv("SKIP_LAUNCHES") == nullptr) launches(ctx);
  for (int rep = 0; rep < 3; ++rep)
    for (const bool deferred : {false, true}) host_bound(ctx, deferred, 400, 50, 8, rep);
  for (int rep = 0; rep < 2; ++rep)
    for (const bool deferred : {false, true}) host_bound(ctx, deferred, 400, 200, 8, rep);
  for (int rep = 0; rep < 2; ++rep)
    for (const bool deferred : {false, true}) host_bound(ctx, deferred, 400, 10, 32, rep);
  return 0;
}
