// vmm_bench_growth_ahead: an append loop with GPU work between the appends, as a producer
// that grows its output while kernels fill it. Each append grows a device_vector-like
// growable_buffer by --append bytes (default 64 MiB) up to --total (default 4 GiB) and
// launches a kernel that writes the new slice --passes times (default 8: GPU work of a few
// hundred microseconds per append on a current GPU, long enough to hide the driver's work).
// The rows, in the same run:
//
//   floor      the same kernels into memory mapped before the loop (no growth at all);
//   fresh_floor  the same, the memory created, mapped and granted before the loop from an
//              empty pool: no growth and no driver call in the loop, only fresh memory's
//              first writes;
//   warm       growth from a warm pool (the chunks of an earlier buffer, idle in the pool):
//              what a steady-state application pays;
//   cold       growth from an empty pool: every chunk a fresh cuMemCreate on the appending
//              thread;
//   ahead      the cold pool, with growth_ahead = {.bytes = append}: the background thread
//              creates the next chunk while the kernels run;
//   ahead_learn  the same with growth_ahead = {.learn = true};
//   raw_fresh  no vmm: the raw driver calls (cuMemCreate, cuMemMap, cuMemSetAccess) make
//              --append handles before the loop, then the loop's kernels, timed;
//   raw_cold   no vmm: the same calls make each append's handle inside the loop, between
//              the kernels. raw_cold against raw_fresh is what creating memory while the
//              GPU works costs the GPU, whatever thread calls the driver: the bound growth
//              ahead works against;
//   raw_cold_geometric  the same with the handles vmm's geometric policy creates (vmm's
//              rows use that policy).
//
// Rows that start from an empty pool wait before their timed loop until the driver is done
// with the memory the previous iteration released (bench/settle.hpp: creating memory while
// the driver still scrubs freed memory slows the writes into it, docs/GPU-FACTS.md, "Freed
// memory"; --settle_ms=0 turns the wait off, --settle_ms=N waits N ms).
//
// Reported: the loop's time (host clock from the first append to the stream's end, every
// grow included; manual time), GB/s written, and vs_warm = the time over warm's of this
// run (registered first). The target: ahead and ahead_learn <= 1.05 x warm. Without a GPU
// every row is skipped with the reason.
//
//   vmm_bench_growth_ahead [--append=64M] [--total=4G] [--passes=8] [--settle_ms=N] [benchmark flags]

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "bench_args.hpp"
#include "cuda_check.hpp"
#include "grow_bench.hpp"
#include "settle.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/growable_buffer.hpp"

namespace {

std::size_t append_bytes = std::size_t{64} << 20;
std::size_t total_bytes = std::size_t{4} << 30;
int passes = 8;
int settle_ms = -1;  // < 0: settle_after_release(total_bytes)
std::string no_gpu_reason;
std::map<std::string, double> seconds_of;  // rows measured so far, for the ratios

using vmm::bench::check;

__global__ void write_slice(std::uint32_t* slice, std::size_t count, int passes, std::uint32_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (int pass = 0; pass < passes; ++pass)
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
         i += stride)
      slice[i] = static_cast<std::uint32_t>(i) * 2654435761u + seed + static_cast<std::uint32_t>(pass);
}

enum class contender {
  floor,
  fresh_floor,
  warm,
  cold,
  ahead,
  ahead_learn,
  raw_fresh,
  raw_cold,
  raw_cold_geometric
};

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
    case contender::raw_fresh:
      return "raw_fresh";
    case contender::raw_cold:
      return "raw_cold";
    case contender::raw_cold_geometric:
      return "raw_cold_geometric";
  }
  return "?";
}

struct gpu_work {
  cudaStream_t stream = nullptr;
  int blocks = 0;
};

// The loop's GPU work alone: one kernel per --append slice of [data, data + total).
void write_slices(const gpu_work& work, char* data, std::size_t slice) {
  auto* words = reinterpret_cast<std::uint32_t*>(data + slice * append_bytes);
  write_slice<<<work.blocks, 256, 0, work.stream>>>(words, append_bytes / sizeof(std::uint32_t), passes,
                                                    static_cast<std::uint32_t>(slice));
}

gpu_work make_gpu_work() {
  gpu_work work;
  check(cudaStreamCreateWithFlags(&work.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check(cudaDeviceGetAttribute(&work.blocks, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
  work.blocks *= 4;
  return work;
}

void settle() {
  if (settle_ms < 0)
    vmm::bench::settle_after_release(total_bytes);
  else
    std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
}

// The counters every row reports, from the mean loop time.
void report(benchmark::State& state, contender which, double total_seconds, std::size_t created) {
  if (state.iterations() == 0) return;
  const std::size_t appends = total_bytes / append_bytes;
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

// raw_fresh, raw_cold and raw_cold_geometric: the driver's calls by hand, no vmm.
void raw_loop(benchmark::State& state, contender which) {
  if (!no_gpu_reason.empty()) {
    state.SkipWithError(("no GPU here: " + no_gpu_reason).c_str());
    return;
  }
  const vmm::chunk_policy policy = which == contender::raw_cold_geometric
                                       ? vmm::chunk_policy::geometric()
                                       : vmm::chunk_policy::fixed(append_bytes);
  const std::unique_ptr<vmm::bench::grow_contender> raw = vmm::bench::make_raw_vmm_grow(policy);
  const gpu_work work = make_gpu_work();
  const std::size_t appends = total_bytes / append_bytes;
  double total_seconds = 0;
  std::size_t created = 0;
  try {
    for (auto _ : state) {
      raw->begin(total_bytes, nullptr);
      char* data = which == contender::raw_fresh ? raw->grow(total_bytes) : nullptr;
      check(cudaStreamSynchronize(work.stream), "cudaStreamSynchronize");
      const auto start = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < appends; ++i) {
        if (which != contender::raw_fresh) data = raw->grow((i + 1) * append_bytes);
        write_slices(work, data, i);
      }
      check(cudaGetLastError(), "write_slice<<<>>>");
      check(cudaStreamSynchronize(work.stream), "cudaStreamSynchronize");
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      state.SetIterationTime(seconds);
      total_seconds += seconds;
      created += raw->handle_count();
      raw->end();
      settle();
    }
  } catch (const std::exception& e) {
    cudaStreamSynchronize(work.stream);
    raw->end();
    state.SkipWithError(e.what());
  }
  check(cudaStreamDestroy(work.stream), "cudaStreamDestroy");
  report(state, which, total_seconds, created);
}

void append_loop(benchmark::State& state, contender which) {
  if (!no_gpu_reason.empty()) {
    state.SkipWithError(("no GPU here: " + no_gpu_reason).c_str());
    return;
  }
  auto pool = vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0)));
  const gpu_work work = make_gpu_work();
  vmm::growable_buffer_options options{.max_size = total_bytes, .stream = work.stream};
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
        which == contender::fresh_floor) {
      pool->trim_to(0);
      settle();
    }
    const std::size_t created_before = pool->statistics().chunks_created;
    vmm::growable_buffer buffer(pool, options);
    if (which == contender::floor || which == contender::fresh_floor) buffer.reserve(total_bytes);
    check(cudaStreamSynchronize(work.stream), "cudaStreamSynchronize");
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < appends; ++i) {
      buffer.resize((i + 1) * append_bytes);
      write_slices(work, static_cast<char*>(buffer.data()), i);
    }
    check(cudaGetLastError(), "write_slice<<<>>>");
    check(cudaStreamSynchronize(work.stream), "cudaStreamSynchronize");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    total_seconds += seconds;
    created += pool->statistics().chunks_created - created_before;
    buffer.wait_for_growth_ahead();  // outside the time: what it prepared past the end goes back
  }
  check(cudaStreamDestroy(work.stream), "cudaStreamDestroy");
  report(state, which, total_seconds, created);
}

}  // namespace

int main(int argc, char** argv) {
  using vmm::bench::parse_count;
  using vmm::bench::parse_size;
  if (!vmm::bench::take_options(
          argc, argv, "vmm_bench_growth_ahead",
          {{"--append=", [](const char* v) { append_bytes = parse_size("--append=", v); }},
           {"--total=", [](const char* v) { total_bytes = parse_size("--total=", v); }},
           {"--settle_ms=", [](const char* v) { settle_ms = parse_count("--settle_ms=", v, 0); }},
           {"--passes=", [](const char* v) { passes = parse_count("--passes=", v, 1); }}}))
    return 1;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (append_bytes == 0 || total_bytes < append_bytes) {
    std::fprintf(stderr, "vmm_bench_growth_ahead: --append must be > 0 and <= --total\n");
    return 1;
  }
  if (!vmm::gpu_available(&no_gpu_reason) && no_gpu_reason.empty()) no_gpu_reason = "no GPU";
  for (contender which :
       {contender::floor, contender::warm, contender::fresh_floor, contender::cold, contender::ahead,
        contender::ahead_learn, contender::raw_fresh, contender::raw_cold, contender::raw_cold_geometric})
    benchmark::RegisterBenchmark((std::string("append_loop/") + name_of(which)).c_str(),
                                 [which](benchmark::State& state) {
                                   if (which == contender::raw_fresh || which == contender::raw_cold ||
                                       which == contender::raw_cold_geometric)
                                     raw_loop(state, which);
                                   else
                                     append_loop(state, which);
                                 })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.5);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
