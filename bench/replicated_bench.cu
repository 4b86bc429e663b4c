// vmm_bench_replicated: read-mostly data every GPU reads, against what a user would use
// instead, in the same run (two or more GPUs with peer access; otherwise nothing is
// registered and the program says why).
//
// 1. reads/<how>: a kernel on every GPU reads the whole array (array_bytes), all GPUs at once
//    (gpu_reads.hpp: one stream per GPU, events around each kernel). Aggregate GB/s = the
//    bytes all GPUs read / the slowest GPU's kernel time; ratio_to_one_gpu divides it by
//    one_gpu_local (GPU 0 reading a cudaMalloc buffer of array_bytes), measured in this run.
//    <how>:
//     - replicated: a vmm::replicated_buffer, each GPU reading its own replica.
//       Target: ratio_to_one_gpu >= 1.95 on two GPUs (0.975 x the GPU count).
//     - one_copy: one vmm::growable_buffer on GPU 0, read by every GPU over peer mappings.
//     - striped: a vmm::striped_buffer (64 MiB round-robin stripes) over every GPU, each GPU
//       reading all of it (its own stripes locally, the others over peer mappings).
//     - managed_read_mostly: cudaMallocManaged with cudaMemAdviseSetReadMostly, prefetched
//       to every GPU first (a read-only copy on each), each GPU reading all of it.
// 2. broadcast/from_host:0: 1 GiB published from the owner replica on GPU 0 to every other
//    replica (the broadcast tree's peer copies only). peer_limit_ms = the plan's rounds x
//    (1 GiB / peer_GB_per_s), the bandwidth of one GPU 0 -> GPU 1 cudaMemcpyPeerAsync of
//    1 GiB measured in this run; ratio_to_limit = time / that. Target: <= 1.1.
//    broadcast/from_host:1: the same bytes from pageable host memory (one H2D copy,
//    then the tree), for comparison; its limit adds nothing for the H2D copy.

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "gpu_reads.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/replicated_buffer.hpp"
#include "vmm/striped_buffer.hpp"

namespace {

constexpr std::size_t gib = std::size_t{1} << 30;
constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t array_bytes = 8 * gib;  // what every GPU reads in reads/*
constexpr std::size_t broadcast_bytes = gib;
constexpr int reference_repetitions = 20;

using vmm::bench::bench_failure;
using vmm::bench::check;
using vmm::bench::concurrent_reads;
using vmm::bench::read_job;
using vmm::bench::report;
using vmm::bench::time_reads;
using vmm::bench::whole_range_on;

int gpu_count = 0;  // usable GPUs, set in main

std::vector<vmm::location> all_gpus() {
  std::vector<vmm::location> gpus;
  for (int d = 0; d < gpu_count; ++d) gpus.push_back(vmm::location::device(d));
  return gpus;
}

double one_gpu_local_gbps() {
  return vmm::bench::one_gpu_local_gbps(array_bytes, reference_repetitions);
}

// Every GPU reads `base(d)` whole.
template <class Base>
void every_gpu_reads(benchmark::State& state, Base&& base) {
  const double baseline = one_gpu_local_gbps();
  std::vector<read_job> jobs;
  for (int d = 0; d < gpu_count; ++d) jobs.push_back(whole_range_on(d, base(d), array_bytes));
  concurrent_reads reads(std::move(jobs));
  const double gbps = time_reads(state, reads);
  state.counters["gpus"] = gpu_count;
  state.counters["one_gpu_GB_per_s"] = baseline;
  state.counters["ratio_to_one_gpu"] = gbps / baseline;
}

// A replicated buffer of `bytes` on every GPU, from pools of its own (its memory goes back to
// the driver when the benchmark ends; cuMemCreate commits it, so the reads touch real pages).
vmm::replicated_buffer filled_replicas(std::size_t bytes, std::optional<vmm::location> owner = std::nullopt) {
  std::vector<std::shared_ptr<vmm::chunk_pool>> pools;
  for (const vmm::location& where : all_gpus())
    pools.push_back(vmm::chunk_pool::create(vmm::provider_for(where)));
  vmm::replicated_buffer buffer(pools, {.max_size = bytes, .owner = owner});
  buffer.resize(bytes);
  return buffer;
}

void reads_replicated(benchmark::State& state) {
  try {
    vmm::replicated_buffer buffer = filled_replicas(array_bytes);
    every_gpu_reads(state, [&](int d) { return buffer.data(vmm::location::device(d)); });
    state.counters["target_ratio"] = 0.975 * gpu_count;
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

void reads_one_copy(benchmark::State& state) {
  try {
    std::vector<vmm::access_grant> access;
    for (int d = 0; d < gpu_count; ++d)
      access.push_back({vmm::accessor::device(d), vmm::access_mode::read_only});
    vmm::growable_buffer buffer(vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0))),
                                {.max_size = array_bytes, .access = access});
    buffer.resize(array_bytes);
    every_gpu_reads(state, [&](int) { return buffer.data(); });
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

void reads_striped(benchmark::State& state) {
  try {
    std::vector<int> devices;
    std::vector<std::shared_ptr<vmm::chunk_pool>> pools;
    for (int d = 0; d < gpu_count; ++d) {
      devices.push_back(d);
      pools.push_back(vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(d))));
    }
    vmm::striped_buffer buffer(devices, array_bytes, {.stripe_size = 64 * mib, .pools = pools});
    every_gpu_reads(state, [&](int) { return buffer.data(); });
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

// cudaMallocManaged memory, freed with the object.
class managed_array {
 public:
  explicit managed_array(std::size_t bytes) {
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    check(cudaMallocManaged(&data_, bytes), "cudaMallocManaged(" + std::to_string(bytes) + " bytes)");
  }
  managed_array(const managed_array&) = delete;
  managed_array& operator=(const managed_array&) = delete;
  ~managed_array() { report(cudaFree(data_), "cudaFree(managed)"); }
  [[nodiscard]] void* data() const noexcept { return data_; }

 private:
  void* data_ = nullptr;
};

void reads_managed_read_mostly(benchmark::State& state) {
  try {
    managed_array array(array_bytes);
    check(cudaMemset(array.data(), 1, array_bytes), "cudaMemset(managed)");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const cudaMemLocation nowhere{};  // ignored by SetReadMostly
    check(cudaMemAdvise(array.data(), array_bytes, cudaMemAdviseSetReadMostly, nowhere),
          "cudaMemAdvise(SetReadMostly)");
    for (int d = 0; d < gpu_count; ++d) {
      check(cudaSetDevice(d), "cudaSetDevice");
      cudaMemLocation here{};
      here.type = cudaMemLocationTypeDevice;
      here.id = d;
      check(cudaMemPrefetchAsync(array.data(), array_bytes, here, 0, nullptr), "cudaMemPrefetchAsync");
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    every_gpu_reads(state, [&](int) { return array.data(); });
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

void one_gpu_local(benchmark::State& state) {
  vmm::bench::one_gpu_local(state, array_bytes);
}

// Events on one stream of GPU 0, around work queued between start() and stop().
class stream_timer {
 public:
  stream_timer() {
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  stream_timer(const stream_timer&) = delete;
  stream_timer& operator=(const stream_timer&) = delete;
  ~stream_timer() {
    report(cudaSetDevice(0), "cudaSetDevice(0)");
    report(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    report(cudaEventDestroy(start_), "cudaEventDestroy");
    report(cudaEventDestroy(stop_), "cudaEventDestroy");
    report(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  void start() { check(cudaEventRecord(start_, stream_), "cudaEventRecord"); }
  // Seconds since start(), once the stream has got there.
  double stop() {
    check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return static_cast<double>(ms) / 1e3;
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// cudaMalloc'd bytes on one GPU.
class device_bytes {
 public:
  device_bytes(int gpu, std::size_t bytes) {
    check(cudaSetDevice(gpu), "cudaSetDevice");
    check(cudaMalloc(&data_, bytes), "cudaMalloc(" + std::to_string(bytes) + " bytes)");
    check(cudaMemset(data_, 3, bytes), "cudaMemset");
    check(cudaSetDevice(0), "cudaSetDevice(0)");
  }
  device_bytes(const device_bytes&) = delete;
  device_bytes& operator=(const device_bytes&) = delete;
  ~device_bytes() { report(cudaFree(data_), "cudaFree"); }
  [[nodiscard]] void* data() const noexcept { return data_; }

 private:
  void* data_ = nullptr;
};

// One GPU 0 -> GPU 1 copy of broadcast_bytes, GB/s (the link the broadcast's copies take).
double peer_copy_gbps() {
  static const double gbps = [] {
    device_bytes from(0, broadcast_bytes);
    device_bytes to(1, broadcast_bytes);
    stream_timer timer;
    check(cudaMemcpyPeerAsync(to.data(), 1, from.data(), 0, broadcast_bytes, timer.stream()), "warm-up copy");
    double seconds = 0;
    for (int r = 0; r < reference_repetitions; ++r) {
      timer.start();
      check(cudaMemcpyPeerAsync(to.data(), 1, from.data(), 0, broadcast_bytes, timer.stream()),
            "cudaMemcpyPeerAsync");
      seconds += timer.stop();
    }
    return static_cast<double>(broadcast_bytes) * reference_repetitions / seconds / 1e9;
  }();
  return gbps;
}

// Args: 0 publish from the owner on GPU 0, 1 update from pageable host memory.
void broadcast(benchmark::State& state) {
  try {
    const bool from_host = state.range(0) == 1;
    const double peer = peer_copy_gbps();
    vmm::replicated_buffer buffer = filled_replicas(broadcast_bytes, vmm::location::device(0));
    const std::size_t rounds = buffer.broadcast_plan(vmm::location::device(0)).size();
    std::vector<std::uint8_t> host(from_host ? broadcast_bytes : 0, 5);
    const auto source = vmm::update_source::host(std::as_bytes(std::span(host)));
    stream_timer timer;
    const auto once = [&] {
      timer.start();
      if (from_host) {
        buffer.update(0, broadcast_bytes, source, timer.stream());
      } else {
        buffer.publish(0, broadcast_bytes, timer.stream());
      }
      return timer.stop();
    };
    (void)once();  // warm-up
    double seconds = 0;
    for (auto _ : state) {
      const double t = once();
      state.SetIterationTime(t);
      seconds += t;
    }
    const double per_iteration = seconds / static_cast<double>(state.iterations());
    const double limit = static_cast<double>(rounds) * static_cast<double>(broadcast_bytes) / (peer * 1e9);
    state.SetBytesProcessed(static_cast<std::int64_t>(broadcast_bytes * (gpu_count - 1)) *
                            state.iterations());
    state.counters["gpus"] = gpu_count;
    state.counters["rounds"] = static_cast<double>(rounds);
    state.counters["peer_GB_per_s"] = peer;
    state.counters["peer_limit_ms"] = limit * 1e3;
    state.counters["ratio_to_limit"] = per_iteration / limit;
    if (!from_host) state.counters["target_ratio"] = 1.1;
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::string why;
  try {
    gpu_count = std::min(vmm::bench::peer_connected_gpus(&why), vmm::replica_table_size);
  } catch (const std::exception& error) {
    why = error.what();
  }
  if (gpu_count < 2) {
    std::printf("vmm_bench_replicated: needs 2 GPUs with peer access (%s); no benchmark registered\n",
                gpu_count == 1 ? "this machine has 1" : why.c_str());
    return 0;
  }
  const auto reads = [](const char* name, void (*fn)(benchmark::State&)) {
    benchmark::RegisterBenchmark(name, fn)->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  reads("one_gpu_local", one_gpu_local);
  reads("reads/replicated", reads_replicated);
  reads("reads/one_copy", reads_one_copy);
  reads("reads/striped", reads_striped);
  reads("reads/managed_read_mostly", reads_managed_read_mostly);
  benchmark::RegisterBenchmark("broadcast", broadcast)
      ->ArgName("from_host")
      ->Arg(0)
      ->Arg(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  std::printf("vmm_bench_replicated: %d GPUs, %zu GiB read by each GPU, %zu GiB broadcast\n", gpu_count,
              array_bytes / gib, broadcast_bytes / gib);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
