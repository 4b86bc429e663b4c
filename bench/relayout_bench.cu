// vmm_bench_relayout: what virtual aliasing saves, against what a user would do instead.
//
// 1. Concatenating k buffers that hold 8 GiB together.
//    relayout: vmm::concatenate maps the buffers' physical chunks back to back at a new
//      address range (cuMemMap per chunk, one cuMemSetAccess): nothing is copied, and no
//      physical memory is created. Its cost is per handle, so it runs for several chunk
//      sizes (0: each buffer is one chunk).
//    memcpy: cudaMalloc of 8 GiB and k device-to-device cudaMemcpyAsync, synchronized.
//    Reported: the time until the concatenation is usable (manual time), teardown_ms (unmap
//    or cudaFree, not in the time), peak_extra_MiB (device memory used beyond the sources,
//    from cudaMemGetInfo), and GiB/s of concatenated bytes.
// 2. A kernel reading a ring as 8 windows that tile it from a phase that moves each launch,
//    so that one window crosses the wrap point (every byte read once a launch: DRAM-bound,
//    as a consumer streaming records is).
//    wrap: through the doubly mapped vmm::ring_buffer: one modulo per window (view.at()),
//      then plain contiguous 16-byte loads;
//    modulo: the same kernel over one mapping, indexing (start + i) % capacity per load;
//    mask: the same with & (capacity - 1), which only a power-of-two capacity allows.
//    Reported: bytes read per second, for a ring that fits in L2 and for rings in HBM.
// Without a GPU every benchmark is skipped with the reason.

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/chunk_view.hpp"
#include "vmm/ring_buffer.hpp"

namespace {

constexpr std::size_t total_bytes = std::size_t{8} << 30;
constexpr double mib = 1024.0 * 1024.0;

bool skip_without_gpu(benchmark::State& state) {
  std::string why;
  if (vmm::gpu_available(&why)) return false;
  state.SkipWithError(("no GPU: " + why).c_str());
  return true;
}

bool cuda_failed(benchmark::State& state, cudaError_t status, const char* what) {
  if (status == cudaSuccess) return false;
  state.SkipWithError((std::string(what) + ": " + cudaGetErrorString(status)).c_str());
  return true;
}

std::size_t free_device_memory() {
  std::size_t free = 0;
  std::size_t total = 0;
  cudaMemGetInfo(&free, &total);
  return free;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- concatenation -----------------------------------------------------------------------

// Args: k buffers, chunk size in MiB (0: one chunk per buffer).
void concat_relayout(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const auto k = static_cast<std::size_t>(state.range(0));
  const auto chunk = static_cast<std::size_t>(state.range(1)) << 20;
  const std::size_t each = total_bytes / k;
  // A pool of its own: its memory goes back to the driver when the benchmark ends.
  auto pool = vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0)));
  std::vector<vmm::growable_buffer> buffers;
  std::vector<const vmm::growable_buffer*> list;
  buffers.reserve(k);
  for (std::size_t i = 0; i < k; ++i) {
    buffers.emplace_back(
        pool, vmm::growable_buffer_options{
                  .max_size = each,
                  .policy = chunk == 0 ? vmm::chunk_policy::fixed(each) : vmm::chunk_policy::fixed(chunk)});
    buffers.back().resize(each);
    if (cuda_failed(state, cudaMemset(buffers.back().data(), static_cast<int>(i), each), "cudaMemset"))
      return;
    list.push_back(&buffers.back());
  }
  double teardown = 0;
  std::size_t peak_extra = 0;
  for (auto _ : state) {
    const std::size_t free_before = free_device_memory();
    const auto start = std::chrono::steady_clock::now();
    std::optional<vmm::chunk_view> joined(vmm::concatenate(list));
    state.SetIterationTime(seconds_since(start));
    peak_extra = std::max(peak_extra, free_before - std::min(free_before, free_device_memory()));
    const auto unmap = std::chrono::steady_clock::now();
    joined.reset();
    teardown += seconds_since(unmap);
  }
  const auto iterations = static_cast<double>(state.iterations());
  state.counters["handles"] = static_cast<double>(buffers.front().chunk_count() * k);
  state.counters["teardown_ms"] = teardown / iterations * 1e3;
  state.counters["peak_extra_MiB"] = static_cast<double>(peak_extra) / mib;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(total_bytes));
}

// Args: k buffers.
void concat_memcpy(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const auto k = static_cast<std::size_t>(state.range(0));
  const std::size_t each = total_bytes / k;
  std::vector<void*> sources(k, nullptr);
  for (std::size_t i = 0; i < k; ++i) {
    if (cuda_failed(state, cudaMalloc(&sources[i], each), "cudaMalloc")) return;
    if (cuda_failed(state, cudaMemset(sources[i], static_cast<int>(i), each), "cudaMemset")) return;
  }
  double teardown = 0;
  std::size_t peak_extra = 0;
  for (auto _ : state) {
    const std::size_t free_before = free_device_memory();
    const auto start = std::chrono::steady_clock::now();
    char* joined = nullptr;
    if (cuda_failed(state, cudaMalloc(&joined, total_bytes), "cudaMalloc")) break;
    for (std::size_t i = 0; i < k; ++i)
      cudaMemcpyAsync(joined + i * each, sources[i], each, cudaMemcpyDeviceToDevice);
    if (cuda_failed(state, cudaDeviceSynchronize(), "cudaMemcpyAsync")) break;
    state.SetIterationTime(seconds_since(start));
    peak_extra = std::max(peak_extra, free_before - std::min(free_before, free_device_memory()));
    const auto release = std::chrono::steady_clock::now();
    cudaFree(joined);
    teardown += seconds_since(release);
  }
  for (void* source : sources) cudaFree(source);
  const auto iterations = static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1));
  state.counters["handles"] = 0;
  state.counters["teardown_ms"] = teardown / iterations * 1e3;
  state.counters["peak_extra_MiB"] = static_cast<double>(peak_extra) / mib;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(total_bytes));
}

BENCHMARK(concat_relayout)
    ->ArgNames({"k", "chunk_MiB"})
    ->ArgsProduct({{2, 16, 128}, {2, 64, 0}})
    ->UseManualTime()
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(concat_memcpy)
    ->ArgNames({"k"})
    ->Args({2})
    ->Args({16})
    ->Args({128})
    ->UseManualTime()
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond);

// ---- ring windows ------------------------------------------------------------------------

enum class indexing { wrap, modulo, mask };

// Each launch reads the whole ring once, as `gridDim.y` windows that tile it from `phase`
// on; the window that reaches past the end crosses the wrap. blockIdx.y picks the window,
// blockIdx.x a segment of it. Sizes and positions are in 16-byte units.
template <indexing how>
__global__ void read_windows(vmm::ring_buffer_view ring, std::uint64_t window, std::uint64_t phase,
                             unsigned long long* sink) {
  const std::uint64_t capacity = ring.capacity / 16;
  const std::uint64_t segment = window / gridDim.x;
  const std::uint64_t start = (phase + blockIdx.y * window) % capacity;  // one modulo per window
  const auto* base = reinterpret_cast<const uint4*>(ring.data);
  std::uint32_t acc = 0;
  if constexpr (how == indexing::wrap) {
    // Contiguous through the second copy: no index arithmetic per load.
    const uint4* p = reinterpret_cast<const uint4*>(ring.at(start * 16)) + blockIdx.x * segment;
    for (std::uint64_t i = threadIdx.x; i < segment; i += blockDim.x) {
      const uint4 v = p[i];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  } else {
    const std::uint64_t first = start + blockIdx.x * segment;
    for (std::uint64_t i = threadIdx.x; i < segment; i += blockDim.x) {
      const std::uint64_t index =
          how == indexing::modulo ? (first + i) % capacity : (first + i) & (capacity - 1);
      const uint4 v = base[index];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1ull);  // keeps the loads; almost never taken
}

// Args: capacity in MiB.
template <indexing how>
void ring_windows(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t capacity = static_cast<std::size_t>(state.range(0)) << 20;
  if (how == indexing::mask && (capacity & (capacity - 1)) != 0) {
    state.SkipWithError("mask indexing needs a power-of-two capacity");
    return;
  }
  // A pool of its own: the ring's memory goes back to the driver when the benchmark ends.
  vmm::ring_buffer ring(vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0))), capacity);
  if (cuda_failed(state, cudaMemset(ring.data(), 1, capacity), "cudaMemset")) return;
  unsigned long long* sink = nullptr;
  if (cuda_failed(state, cudaMalloc(&sink, sizeof *sink), "cudaMalloc")) return;
  const std::uint64_t units = capacity / 16;
  const dim3 grid(128, 8);
  const std::uint64_t window = units / grid.y;
  cudaEvent_t begin = nullptr;
  cudaEvent_t end = nullptr;
  cudaEventCreate(&begin);
  cudaEventCreate(&end);
  std::uint64_t phase = window / 3;  // never on a window boundary: one window crosses the wrap
  read_windows<how><<<grid, 512>>>(ring.view(), window, phase, sink);  // warm-up
  for (auto _ : state) {
    phase = (phase + 7919) % units;
    if (phase % window == 0) ++phase;
    cudaEventRecord(begin);
    read_windows<how><<<grid, 512>>>(ring.view(), window, phase, sink);
    cudaEventRecord(end);
    if (cuda_failed(state, cudaEventSynchronize(end), "read_windows")) break;
    float ms = 0;
    cudaEventElapsedTime(&ms, begin, end);
    state.SetIterationTime(static_cast<double>(ms) / 1e3);
  }
  state.counters["windows"] = grid.y;
  state.counters["crossing_the_wrap"] = 1;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(window / grid.x * grid.x * grid.y * 16));
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaFree(sink);
}

// 24 MiB fits in the L2 cache of a current data-centre GPU: there the index arithmetic shows;
// 1 GiB and 1.5 GiB stream from HBM, which hides most of it.
BENCHMARK(ring_windows<indexing::wrap>)
    ->Name("ring_windows/wrap")
    ->ArgName("capacity_MiB")
    ->Arg(24)
    ->Arg(1024)
    ->Arg(1536)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(ring_windows<indexing::modulo>)
    ->Name("ring_windows/modulo")
    ->ArgName("capacity_MiB")
    ->Arg(24)
    ->Arg(1024)
    ->Arg(1536)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(ring_windows<indexing::mask>)
    ->Name("ring_windows/mask")
    ->ArgName("capacity_MiB")
    ->Arg(1024)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
