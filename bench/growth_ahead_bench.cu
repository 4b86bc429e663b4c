// vmm_bench_growth_ahead: an append loop with GPU work between the appends, as a producer
// that grows its output while kernels fill it. Each append grows a device_vector-like
// growable_buffer by --append bytes (default 64 MiB) up to --total (default 4 GiB) and
// launches a kernel that writes the new slice --passes times (default 8: GPU work of a few
// hundred microseconds per append on an H100/H200, long enough to hide the driver's work).
// The rows, in the same run:
//
//   floor      the same kernels into memory mapped before the loop (no growth at all);
//   fresh_floor  the same, the memory created, mapped and granted before the loop from an
//              empty pool: no growth and no driver call in the loop, only fresh memory's
//              first writes. What the driver defers to a fresh handle's first use (see
//              docs/GPU-FACTS.md, "Chunk size") is here; growth ahead, which works on the
//              host, cannot take it off the GPU, so this row bounds what ahead can reach;
//   warm       growth from a warm pool (the chunks of an earlier buffer, idle in the pool):
//              what a steady-state application pays;
//   cold       growth from an empty pool: every chunk a fresh cuMemCreate, and the driver's
//              cost of fresh memory paid at the access grant, on the appending thread;
//   ahead      the cold pool, with growth_ahead = {.bytes = append}: the background thread
//              creates and touches the next chunk while the kernels run;
//   ahead_learn  the same with growth_ahead = {.learn = true}.
//
// Reported: the loop's time (host clock from the first append to the stream's end, every
// grow included; manual time), GB/s written, and vs_warm = the time over warm's of this
// run (registered first). The target: ahead and ahead_learn <= 1.05 x warm. Without a GPU
// every row is skipped with the reason.
//
//   vmm_bench_growth_ahead [--append=64M] [--total=4G] [--passes=8] [benchmark flags]

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "bench_args.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/growable_buffer.hpp"

namespace {

std::size_t append_bytes = std::size_t{64} << 20;
std::size_t total_bytes = std::size_t{4} << 30;
int passes = 8;
std::string no_gpu_reason;
std::map<std::string, double> seconds_of;  // rows measured so far, for the ratios

void check(cudaError_t result, const char* call) {
  if (result != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(result));
}

__global__ void write_slice(std::uint32_t* slice, std::size_t count, int passes, std::uint32_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (int pass = 0; pass < passes; ++pass)
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
         i += stride)
      slice[i] = static_cast<std::uint32_t>(i) * 2654435761u + seed + static_cast<std::uint32_t>(pass);
}

enum class contender { floor, fresh_floor, warm, cold, ahead, ahead_learn };

const char* name_of(contender c) {
  switch (c) {
    case contender::floor:
      return "floor";
    case contender::fresh_floor:
      return "fresh_floor";
    case contender::warm:
      return "warm";
    case contender::cold:
      return "cold";
    case contender::ahead:
      return "ahead";
    case contender::ahead_learn:
      return "ahead_learn";
  }
  return "?";
}

void append_loop(benchmark::State& state, contender which) {
  if (!no_gpu_reason.empty()) {
    state.SkipWithError(("no GPU here: " + no_gpu_reason).c_str());
    return;
  }
  auto pool = vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0)));
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  int blocks = 0;
  check(cudaDeviceGetAttribute(&blocks, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
  blocks *= 4;
  vmm::growable_buffer_options options{.max_size = total_bytes, .stream = stream};
  if (which == contender::ahead) options.growth_ahead = {.bytes = append_bytes};
  if (which == contender::ahead_learn) options.growth_ahead = {.learn = true};
  if (which == contender::warm) {  // leave the chunks of a whole run idle in the pool
    vmm::growable_buffer earlier(pool, options);
    for (std::size_t size = append_bytes; size <= total_bytes; size += append_bytes) earlier.resize(size);
    earlier.resize(0);
    earlier.collect_retired(true);
  }
  const std::size_t appends = total_bytes / append_bytes;
  double total_seconds = 0;
  std::size_t created = 0;
  for (auto _ : state) {
    if (which == contender::cold || which == contender::ahead || which == contender::ahead_learn ||
        which == contender::fresh_floor)
      pool->trim_to(0);
    const std::size_t created_before = pool->statistics().chunks_created;
    vmm::growable_buffer buffer(pool, options);
    if (which == contender::floor || which == contender::fresh_floor) buffer.reserve(total_bytes);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < appends; ++i) {
      const std::size_t size = i * append_bytes;
      buffer.resize(size + append_bytes);
      auto* slice = reinterpret_cast<std::uint32_t*>(static_cast<char*>(buffer.data()) + size);
      write_slice<<<blocks, 256, 0, stream>>>(slice, append_bytes / sizeof(std::uint32_t), passes,
                                              static_cast<std::uint32_t>(i));
    }
    check(cudaGetLastError(), "write_slice<<<>>>");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    total_seconds += seconds;
    created += pool->statistics().chunks_created - created_before;
    buffer.wait_for_growth_ahead();  // outside the time: what it prepared past the end goes back
  }
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  if (state.iterations() == 0) return;
  const double mean = total_seconds / static_cast<double>(state.iterations());
  seconds_of[name_of(which)] = mean;
  state.counters["GB/s"] = static_cast<double>(appends * append_bytes) * passes / mean / 1e9;
  state.counters["appends"] = static_cast<double>(appends);
  state.counters["chunks_created_per_loop"] =
      static_cast<double>(created) / static_cast<double>(state.iterations());
  if (auto warm = seconds_of.find("warm"); warm != seconds_of.end() && which != contender::warm)
    state.counters["vs_warm"] = mean / warm->second;
  if (auto floor = seconds_of.find("floor"); floor != seconds_of.end() && which != contender::floor)
    state.counters["vs_floor"] = mean / floor->second;
}

}  // namespace

int main(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--append=", 9) == 0) {
      append_bytes = vmm::bench::parse_size("--append=", argv[i] + 9);
    } else if (std::strncmp(argv[i], "--total=", 8) == 0) {
      total_bytes = vmm::bench::parse_size("--total=", argv[i] + 8);
    } else if (std::strncmp(argv[i], "--passes=", 9) == 0) {
      passes = std::atoi(argv[i] + 9);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (append_bytes == 0 || total_bytes < append_bytes) {
    std::fprintf(stderr, "vmm_bench_growth_ahead: --append must be > 0 and <= --total\n");
    return 1;
  }
  if (!vmm::gpu_available(&no_gpu_reason) && no_gpu_reason.empty()) no_gpu_reason = "no GPU";
  for (contender which : {contender::floor, contender::warm, contender::fresh_floor, contender::cold,
                          contender::ahead, contender::ahead_learn})
    benchmark::RegisterBenchmark((std::string("append_loop/") + name_of(which)).c_str(),
                                 [which](benchmark::State& state) { append_loop(state, which); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.5);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
