// vmm_bench_resource: stream-ordered allocation with vmm::memory_resource against what a
// user would pick instead, every row in the same run.
//
//  pair/<size>/<contender>          allocate + deallocate of one size on one stream, again
//      and again (after one untimed pair): the host cost of the pair.
//  window/<range>/<contender>       256 live blocks of random sizes (log-uniform over the
//      range, fixed seed) on one stream; each step frees the oldest and allocates the next
//      size: the host cost of that pair, in the steady state (4096 untimed steps first).
//  fragmented/<range>/<contender>   fill 3/4 of the memory free to the allocator with blocks
//      of random sizes (log-uniform, fixed seed), free every other one, then find by binary
//      search the largest single allocation that succeeds; reported as a share of the memory
//      free to the allocator at that point (the device's free memory, cudaMemGetInfo, plus
//      what the allocator holds idle). Each probe starts from a fresh allocator and the same
//      fill, so that no probe changes what the next one sees.
//
// Contenders. GPU rows: vmm (memory_resource on GPU 0 over a pool of its own),
// cudaMallocAsync (cudaMallocAsync + cudaFreeAsync on the device's default pool, release
// threshold UINT64_MAX: it keeps what it has, as vmm does), cudaMalloc (cudaMalloc +
// cudaFree, pair only). OS rows, which run on any machine: vmm_os_host (memory_resource on
// location::os_host()) and malloc (std::malloc + std::free, pair and window). Without a GPU
// the GPU rows are skipped with the reason.
//
// Times are host times of the calls, read around each pair with the TSC where it is invariant
// (otherwise steady_clock: vmm/tools/call_clock.hpp, as vmm-replay); a row's time is
// the mean (manual time), and the counters give median_ns and p99_ns of the same samples,
// clock_ns (what one pair of clock reads costs, included in every sample) and vs_baseline,
// the ratio of medians (fragmented: of shares) to the group's baseline (the row's label names
// it; 1 on the baseline's own row), run earlier in this process. The streams carry no kernels: every free is
// reusable at once by its own stream. Every 4096 pairs the stream is synchronized, untimed, so that no queue
// grows without bound. A summary at the end prints each group with its ratios, and the target for vmm's pair.

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "call_clock.hpp"
#include "cuda_check.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/retirement.hpp"

namespace {

constexpr std::size_t kib = std::size_t{1} << 10;
constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t window_blocks = 256;
constexpr std::size_t warm_steps = 4096;
constexpr std::size_t sync_every = 4096;
constexpr double fill_share = 0.75;
constexpr double target_pair_us = 0.3;  // vmm's target for the median pair on the GPU

using host_clock = std::chrono::steady_clock;

using vmm::bench::bench_failure;
using vmm::bench::check;
using vmm::bench::describe;
using vmm::bench::report;

void skip(benchmark::State& state, const std::string& why) {
  state.SkipWithError(why.c_str());  // const char* in benchmark 1.7, std::string in 1.8
}

std::string size_name(std::size_t bytes) {
  if (bytes >= mib && bytes % mib == 0) return std::to_string(bytes / mib) + "MiB";
  if (bytes >= kib && bytes % kib == 0) return std::to_string(bytes / kib) + "KiB";
  return std::to_string(bytes) + "B";
}

// Why GPU rows cannot run here, or nothing. Asked once: the answer does not change.
const std::optional<std::string>& gpu_unavailable() {
  static const std::optional<std::string> why = []() -> std::optional<std::string> {
    std::string reason;
    if (!vmm::gpu_available(&reason)) return "no GPU: " + reason;
    cudaError_t started = cudaSetDevice(0);
    if (started == cudaSuccess) started = cudaFree(nullptr);
    if (started != cudaSuccess) return "the CUDA runtime cannot start on GPU 0: " + describe(started);
    return std::nullopt;
  }();
  return why;
}

std::size_t device_free_bytes() {
  std::size_t free = 0;
  std::size_t total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

// ---- the contenders -----------------------------------------------------------------------

// One allocator on one stream.
class allocator {
 public:
  virtual ~allocator() = default;
  // Throws on any failure, running out included.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
  // nullptr when out of memory; other failures throw.
  virtual void* try_allocate(std::size_t bytes) = 0;
  // Waits for the stream's queued work.
  virtual void synchronize() = 0;
  // The bytes an allocation could be served from now: memory free where the allocator
  // creates it, plus what it holds idle.
  virtual std::size_t available_bytes() = 0;
};

// A non-blocking stream of the runtime, owned.
class runtime_stream {
 public:
  runtime_stream() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  runtime_stream(const runtime_stream&) = delete;
  runtime_stream& operator=(const runtime_stream&) = delete;
  ~runtime_stream() { report(cudaStreamDestroy(stream_), "cudaStreamDestroy"); }
  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// vmm::memory_resource over a pool of its own, so that its memory is its alone and goes back
// to the driver (or the OS) with it.
class vmm_allocator final : public allocator {
 public:
  explicit vmm_allocator(vmm::location where, std::size_t max_size = 0)
      : gpu_(where.kind != vmm::memory_kind::os_host),
        pool_(vmm::chunk_pool::create(vmm::provider_for(where))),
        stream_(gpu_ ? std::make_unique<runtime_stream>() : nullptr),
        resource_(std::make_unique<vmm::memory_resource>(
            pool_, vmm::memory_resource_properties{.max_size = max_size})) {}
  ~vmm_allocator() override {
    try {
      resource_.reset();           // retires its pages after the stream passes
      vmm::collect_retired(true);  // ... which it has: the pages go back to the pool
      pool_->trim_to(0);           // and the pool's to the driver
    } catch (const std::exception& error) {
      std::fprintf(stderr, "vmm_bench_resource: giving vmm's memory back: %s\n", error.what());
    }
  }
  void* allocate(std::size_t bytes) override { return resource_->allocate(stream(), bytes); }
  void deallocate(void* p, std::size_t bytes) noexcept override { resource_->deallocate(stream(), p, bytes); }
  void* try_allocate(std::size_t bytes) override {
    try {
      return resource_->allocate(stream(), bytes);
    } catch (const vmm::out_of_memory&) {
      return nullptr;
    }
  }
  void synchronize() override {
    if (stream_) check(cudaStreamSynchronize(stream_->get()), "cudaStreamSynchronize");
  }
  std::size_t available_bytes() override {
    const vmm::memory_resource_statistics mine = resource_->statistics();
    const std::size_t max_size = resource_->properties().max_size;
    const std::size_t room = max_size - std::min(max_size, mine.used_current);
    if (!gpu_) return room;  // host memory: created on demand up to max_size
    const vmm::pool_statistics pool = pool_->statistics();
    const std::size_t idle = mine.reserved_unused() + (pool.reserved_current - pool.used_current);
    return std::min(room, device_free_bytes() + idle);
  }

 private:
  [[nodiscard]] vmm::stream_ref stream() const noexcept {
    return stream_ ? vmm::stream_ref(stream_->get()) : vmm::stream_ref();
  }
  bool gpu_;
  std::shared_ptr<vmm::chunk_pool> pool_;
  std::unique_ptr<runtime_stream> stream_;
  std::unique_ptr<vmm::memory_resource> resource_;
};

// cudaMallocAsync / cudaFreeAsync on GPU 0's default pool, which keeps what it has (release
// threshold UINT64_MAX) while the contender lives; trimmed to nothing, and the threshold put
// back, when it goes.
class cuda_async_allocator final : public allocator {
 public:
  cuda_async_allocator() {
    check(cudaDeviceGetDefaultMemPool(&pool_, 0), "cudaDeviceGetDefaultMemPool");
    check(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &old_threshold_),
          "cudaMemPoolGetAttribute(cudaMemPoolAttrReleaseThreshold)");
    std::uint64_t keep_everything = std::numeric_limits<std::uint64_t>::max();
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_everything),
          "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold, UINT64_MAX)");
  }
  ~cuda_async_allocator() override {
    report(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
    report(cudaMemPoolTrimTo(pool_, 0), "cudaMemPoolTrimTo");
    report(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &old_threshold_),
           "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)");
  }
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    check(cudaMallocAsync(&p, bytes, stream_.get()), "cudaMallocAsync(" + std::to_string(bytes) + ")");
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override {
    report(cudaFreeAsync(p, stream_.get()), "cudaFreeAsync");
  }
  void* try_allocate(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t result = cudaMallocAsync(&p, bytes, stream_.get());
    if (result == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it
      return nullptr;
    }
    check(result, "cudaMallocAsync(" + std::to_string(bytes) + ")");
    return p;
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize"); }
  std::size_t available_bytes() override {
    std::uint64_t reserved = 0;
    std::uint64_t used = 0;
    check(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved),
          "cudaMemPoolGetAttribute(cudaMemPoolAttrReservedMemCurrent)");
    check(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used),
          "cudaMemPoolGetAttribute(cudaMemPoolAttrUsedMemCurrent)");
    return device_free_bytes() + static_cast<std::size_t>(reserved - used);
  }

 private:
  runtime_stream stream_;
  cudaMemPool_t pool_ = nullptr;
  std::uint64_t old_threshold_ = 0;
};

// cudaMalloc + cudaFree: no stream order, no cache (cudaFree synchronizes the device).
class cuda_malloc_allocator final : public allocator {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc(" + std::to_string(bytes) + ")");
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override { report(cudaFree(p), "cudaFree"); }
  void* try_allocate(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t result = cudaMalloc(&p, bytes);
    if (result == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check(result, "cudaMalloc(" + std::to_string(bytes) + ")");
    return p;
  }
  void synchronize() override {}
  std::size_t available_bytes() override { return device_free_bytes(); }
};

// std::malloc + std::free: what host code uses.
class malloc_allocator final : public allocator {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = std::malloc(bytes);
    if (p == nullptr) throw bench_failure("malloc(" + std::to_string(bytes) + ") failed");
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override { std::free(p); }
  void* try_allocate(std::size_t bytes) override { return std::malloc(bytes); }
  void synchronize() override {}
  std::size_t available_bytes() override { throw bench_failure("malloc cannot say what it could allocate"); }
};

struct contender {
  std::string name;
  bool gpu;
  std::function<std::unique_ptr<allocator>()> make;
  std::string baseline;  // the contender this one is compared with ("": it is a baseline)
};

contender vmm_gpu() {
  return {"vmm", true, [] { return std::make_unique<vmm_allocator>(vmm::location::device(0)); },
          "cudaMallocAsync"};
}
contender cuda_async() {
  return {"cudaMallocAsync", true, [] { return std::make_unique<cuda_async_allocator>(); }, ""};
}
contender cuda_malloc() {
  return {"cudaMalloc", true, [] { return std::make_unique<cuda_malloc_allocator>(); }, "cudaMallocAsync"};
}
contender vmm_os_host(std::size_t max_size = 0) {
  return {"vmm_os_host", false,
          [max_size] { return std::make_unique<vmm_allocator>(vmm::location::os_host(), max_size); },
          "malloc"};
}
contender host_malloc() {
  return {"malloc", false, [] { return std::make_unique<malloc_allocator>(); }, ""};
}

// ---- measuring ----------------------------------------------------------------------------

// The clock of every timed call (the TSC where it is invariant: vmm/tools/call_clock.hpp),
// calibrated against steady_clock over 20 ms before its first use.
const vmm::tools::call_clock& call_timer() {
  static const vmm::tools::call_clock clock = [] {
    vmm::tools::call_clock c;
    const host_clock::time_point until = host_clock::now() + std::chrono::milliseconds(20);
    while (host_clock::now() < until) {}
    c.calibrate();
    return c;
  }();
  return clock;
}

// The q-quantile of `samples` (reorders them).
double quantile(std::vector<double>& samples, double q) {
  if (samples.empty()) return 0;
  const auto k = static_cast<std::ptrdiff_t>(q * static_cast<double>(samples.size() - 1));
  std::nth_element(samples.begin(), samples.begin() + k, samples.end());
  return samples[static_cast<std::size_t>(k)];
}

// The median cost of reading the clock twice, which every sample includes.
double clock_overhead_ns() {
  static const double overhead = [] {
    std::vector<double> samples(20000);
    const vmm::tools::call_clock& clock = call_timer();
    for (double& s : samples) {
      const std::uint64_t t0 = clock.now();
      const std::uint64_t t1 = clock.now();
      s = clock.to_ns(static_cast<double>(t1 - t0));
    }
    return quantile(samples, 0.5);
  }();
  return overhead;
}

// What each row measured, by row name: for the ratios and the summary.
struct result {
  std::string group;
  std::string contender;
  std::string baseline;
  double median_ns = 0;
  double p99_ns = 0;
  double share = 0;  // fragmented rows
  std::size_t largest = 0;
  std::size_t available = 0;
};
std::map<std::string, result>& results() {
  static std::map<std::string, result> all;
  return all;
}
const result* find_result(const std::string& group, const std::string& contender) {
  const auto it = results().find(group + "/" + contender);
  return it == results().end() ? nullptr : &it->second;
}

void report_times(benchmark::State& state, const std::string& group, const contender& who,
                  std::vector<double>& samples) {
  result r{group, who.name, who.baseline};
  r.median_ns = quantile(samples, 0.5);
  r.p99_ns = quantile(samples, 0.99);
  state.counters["median_ns"] = r.median_ns;
  state.counters["p99_ns"] = r.p99_ns;
  state.counters["clock_ns"] = clock_overhead_ns();
  if (who.baseline.empty()) {
    state.counters["vs_baseline"] = 1;
  } else if (const result* base = find_result(group, who.baseline); base != nullptr && base->median_ns > 0) {
    state.counters["vs_baseline"] = r.median_ns / base->median_ns;
    state.SetLabel("vs " + who.baseline);
  }
  results()[group + "/" + who.name] = r;
}

// Log-uniform sizes over [low, high], from a fixed seed: every contender sees the same.
std::vector<std::size_t> random_sizes(std::size_t count, std::size_t low, std::size_t high,
                                      std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<double> exponent(std::log2(static_cast<double>(low)),
                                                  std::log2(static_cast<double>(high)));
  std::vector<std::size_t> sizes(count);
  for (std::size_t& s : sizes)
    s = std::clamp(static_cast<std::size_t>(std::exp2(exponent(random))), low, high);
  return sizes;
}

// ---- the bodies ---------------------------------------------------------------------------

bool runnable(benchmark::State& state, const contender& who) {
  if (who.gpu && gpu_unavailable()) {
    skip(state, *gpu_unavailable());
    return false;
  }
  return true;
}

void run_pair(benchmark::State& state, const std::string& group, const contender& who, std::size_t bytes) {
  if (!runnable(state, who)) return;
  try {
    std::unique_ptr<allocator> a = who.make();
    a->deallocate(a->allocate(bytes), bytes);  // first-time costs, untimed
    a->synchronize();
    std::vector<double> samples;
    samples.reserve(
        static_cast<std::size_t>(std::min<benchmark::IterationCount>(state.max_iterations, 1 << 24)));
    std::size_t since_sync = 0;
    const vmm::tools::call_clock& clock = call_timer();
    for (auto _ : state) {
      const std::uint64_t t0 = clock.now();
      void* p = a->allocate(bytes);
      a->deallocate(p, bytes);
      const std::uint64_t t1 = clock.now();
      benchmark::DoNotOptimize(p);
      const double ns = clock.to_ns(static_cast<double>(t1 - t0));
      samples.push_back(ns);
      state.SetIterationTime(ns * 1e-9);
      if (++since_sync == sync_every) {
        a->synchronize();
        since_sync = 0;
      }
    }
    report_times(state, group, who, samples);
  } catch (const std::exception& error) {
    skip(state, who.name + ": " + error.what());
  }
}

void run_window(benchmark::State& state, const std::string& group, const contender& who, std::size_t low,
                std::size_t high) {
  if (!runnable(state, who)) return;
  const std::vector<std::size_t> sizes = random_sizes(1 << 16, low, high, 42);
  try {
    std::unique_ptr<allocator> a = who.make();
    std::vector<std::pair<void*, std::size_t>> live(window_blocks);
    std::size_t next = 0;
    std::size_t oldest = 0;
    const auto take_next = [&] {
      const std::size_t bytes = sizes[next++ % sizes.size()];
      return std::pair<void*, std::size_t>(a->allocate(bytes), bytes);
    };
    struct free_all {  // also when a call throws
      allocator& a;
      std::vector<std::pair<void*, std::size_t>>& live;
      ~free_all() {
        for (auto& [p, bytes] : live)
          if (p != nullptr) a.deallocate(p, bytes);
      }
    } freeing{*a, live};
    for (auto& slot : live) slot = take_next();
    const auto step = [&] {
      auto& slot = live[oldest];
      oldest = (oldest + 1) % window_blocks;
      a->deallocate(slot.first, slot.second);
      slot.first = nullptr;
      slot = take_next();
    };
    for (std::size_t i = 0; i < warm_steps; ++i) step();  // to the steady state, untimed
    a->synchronize();
    std::vector<double> samples;
    samples.reserve(
        static_cast<std::size_t>(std::min<benchmark::IterationCount>(state.max_iterations, 1 << 24)));
    std::size_t since_sync = 0;
    const vmm::tools::call_clock& clock = call_timer();
    for (auto _ : state) {
      const std::uint64_t t0 = clock.now();
      step();
      const std::uint64_t t1 = clock.now();
      const double ns = clock.to_ns(static_cast<double>(t1 - t0));
      samples.push_back(ns);
      state.SetIterationTime(ns * 1e-9);
      if (++since_sync == sync_every) {
        a->synchronize();
        since_sync = 0;
      }
    }
    report_times(state, group, who, samples);
  } catch (const std::exception& error) {
    skip(state, who.name + ": " + error.what());
  }
}

// One probe of the fragmented state: a fresh allocator, the fill, every other block freed,
// then one try of `bytes` (0: none). Returns whether it succeeded; `available` gets what the
// allocator had free at that point.
bool probe_fragmented(const contender& who, const std::vector<std::size_t>& sizes, std::size_t bytes,
                      std::size_t& available) {
  std::unique_ptr<allocator> a = who.make();
  std::vector<std::pair<void*, std::size_t>> blocks;
  struct free_all {
    allocator& a;
    std::vector<std::pair<void*, std::size_t>>& blocks;
    ~free_all() {
      for (auto& [p, n] : blocks)
        if (p != nullptr) a.deallocate(p, n);
      try {
        a.synchronize();
      } catch (const std::exception& error) {
        std::fprintf(stderr, "vmm_bench_resource: %s\n", error.what());
      }
    }
  } freeing{*a, blocks};
  const auto target = static_cast<std::size_t>(fill_share * static_cast<double>(a->available_bytes()));
  std::size_t filled = 0;
  for (std::size_t i = 0; filled < target; ++i) {
    const std::size_t n = std::min(sizes[i % sizes.size()], target - filled);
    void* p = a->try_allocate(n);
    if (p == nullptr) break;
    blocks.emplace_back(p, n);
    filled += n;
  }
  if (blocks.size() < 2) throw bench_failure("the fill made fewer than two blocks");
  for (std::size_t i = 0; i < blocks.size(); i += 2) {
    a->deallocate(blocks[i].first, blocks[i].second);
    blocks[i].first = nullptr;
  }
  a->synchronize();
  available = a->available_bytes();
  if (bytes == 0) return true;
  void* big = a->try_allocate(bytes);
  if (big == nullptr) return false;
  a->deallocate(big, bytes);
  return true;
}

void run_fragmented(benchmark::State& state, const std::string& group, const contender& who, std::size_t low,
                    std::size_t high) {
  if (!runnable(state, who)) return;
  const std::vector<std::size_t> sizes = random_sizes(1 << 16, low, high, 7);
  constexpr std::size_t unit = 2 * mib;  // the GPU's granularity: finer says nothing
  for (auto _ : state) {
    try {
      const host_clock::time_point start = host_clock::now();
      std::size_t available = 0;
      (void)probe_fragmented(who, sizes, 0, available);
      // Binary search for the largest success in [low_ok, high_bad), in units, to 1/256 of
      // the free memory.
      std::size_t low_ok = 0;
      std::size_t high_bad = available / unit + 1;
      const std::size_t resolution = std::max<std::size_t>(1, available / unit / 256);
      int probes = 1;
      while (high_bad - low_ok > resolution) {
        const std::size_t middle = low_ok + (high_bad - low_ok) / 2;
        std::size_t seen = 0;
        (probe_fragmented(who, sizes, middle * unit, seen) ? low_ok : high_bad) = middle;
        ++probes;
      }
      state.SetIterationTime(std::chrono::duration<double>(host_clock::now() - start).count());
      result r{group, who.name, who.baseline};
      r.largest = low_ok * unit;
      r.available = available;
      r.share = static_cast<double>(r.largest) / static_cast<double>(available);
      state.counters["largest_bytes"] = benchmark::Counter(
          static_cast<double>(r.largest), benchmark::Counter::kDefaults, benchmark::Counter::OneK::kIs1024);
      state.counters["available_bytes"] = benchmark::Counter(
          static_cast<double>(available), benchmark::Counter::kDefaults, benchmark::Counter::OneK::kIs1024);
      state.counters["share"] = r.share;
      state.counters["probes"] = probes;
      if (who.baseline.empty()) {
        state.counters["vs_baseline"] = 1;
      } else if (const result* base = find_result(group, who.baseline); base != nullptr && base->share > 0) {
        state.counters["vs_baseline"] = r.share / base->share;
        state.SetLabel("vs " + who.baseline);
      }
      results()[group + "/" + who.name] = r;
    } catch (const std::exception& error) {
      skip(state, who.name + ": " + error.what());
      break;
    }
  }
}

// ---- registration and the summary ---------------------------------------------------------

std::vector<std::string>& group_order() {
  static std::vector<std::string> order;
  return order;
}

void register_all() {
  const auto add = [](const std::string& group, const contender& who, auto body) {
    const std::string name = group + "/" + who.name;
    if (std::find(group_order().begin(), group_order().end(), group) == group_order().end())
      group_order().push_back(group);
    return benchmark::RegisterBenchmark(
        name.c_str(), [group, who, body](benchmark::State& state) { body(state, group, who); });
  };
  // Baselines first in each group: a row's vs_baseline needs its baseline's result.
  for (const std::size_t bytes : {kib, mib, 64 * mib}) {
    const std::string group = "pair/" + size_name(bytes);
    for (const contender& who : {cuda_async(), cuda_malloc(), vmm_gpu()})
      add(group, who,
          [bytes](benchmark::State& s, const std::string& g, const contender& c) {
            run_pair(s, g, c, bytes);
          })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  }
  for (const std::size_t bytes : {kib, mib, 64 * mib}) {
    const std::string group = "pair_os/" + size_name(bytes);
    for (const contender& who : {host_malloc(), vmm_os_host()})
      add(group, who,
          [bytes](benchmark::State& s, const std::string& g, const contender& c) {
            run_pair(s, g, c, bytes);
          })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  }
  // cudaMalloc has no window row: with sizes up to 128 MiB each of its steps costs a
  // cudaMalloc of fresh memory, and it is the pair rows' baseline already.
  {
    const std::string group = "window/512B-128MiB";
    for (const contender& who : {cuda_async(), vmm_gpu()})
      add(group, who,
          [](benchmark::State& s, const std::string& g, const contender& c) {
            run_window(s, g, c, 512, 128 * mib);
          })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  }
  {
    // Smaller on the host: a CI machine commits what the OS provider maps.
    const std::string group = "window_os/512B-8MiB";
    for (const contender& who : {host_malloc(), vmm_os_host()})
      add(group, who,
          [](benchmark::State& s, const std::string& g, const contender& c) {
            run_window(s, g, c, 512, 8 * mib);
          })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  }
  {
    const std::string group = "fragmented/512B-128MiB";
    for (const contender& who : {cuda_async(), vmm_gpu()})
      add(group, who,
          [](benchmark::State& s, const std::string& g, const contender& c) {
            run_fragmented(s, g, c, 512, 128 * mib);
          })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
  }
  {
    // No host baseline: malloc's address space is not what limits it. vmm alone, in a
    // resource bounded to 512 MiB: how much of what it has free one allocation can take.
    const std::string group = "fragmented_os/4KiB-8MiB";
    contender bounded = vmm_os_host(512 * mib);
    bounded.baseline.clear();
    add(group, bounded,
        [](benchmark::State& s, const std::string& g, const contender& c) {
          run_fragmented(s, g, c, 4 * kib, 8 * mib);
        })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
  }
}

void print_summary() {
  if (results().empty()) return;
  std::printf("\nsummary (median and p99 of the host time of each pair; ratio: to the group's baseline)\n");
  for (const std::string& group : group_order()) {
    bool header = false;
    for (const auto& [name, r] : results()) {
      if (r.group != group) continue;
      if (!header) std::printf("  %s\n", group.c_str());
      header = true;
      const std::string& baseline = r.baseline;
      const result* base = find_result(group, baseline);
      if (r.available != 0) {
        std::printf("    %-18s largest %8.3f GiB of %8.3f GiB free: share %.3f", r.contender.c_str(),
                    static_cast<double>(r.largest) / (1024.0 * mib),
                    static_cast<double>(r.available) / (1024.0 * mib), r.share);
        if (base != nullptr && base->share > 0)
          std::printf("   %.2fx %s's share", r.share / base->share, baseline.c_str());
      } else {
        std::printf("    %-18s median %9.3f us   p99 %9.3f us", r.contender.c_str(), r.median_ns / 1000,
                    r.p99_ns / 1000);
        if (base != nullptr && base->median_ns > 0)
          std::printf("   %.3fx %s", r.median_ns / base->median_ns, baseline.c_str());
        if (r.contender == "vmm" && group.rfind("pair/", 0) == 0)
          std::printf("   (target <= %.1f us: %s)", target_pair_us,
                      r.median_ns <= target_pair_us * 1000 ? "met" : "not met");
      }
      std::printf("\n");
    }
  }
  std::printf("  every sample includes %.0f ns of clock reads\n", clock_overhead_ns());
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary();
  return 0;
}
