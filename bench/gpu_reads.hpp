#pragma once
/// @file
/// Kernels on several GPUs reading memory at once, timed: what the multi-GPU benchmarks
/// (vmm_bench_multi_gpu, vmm_bench_replicated) share. A read_job says which GPU reads what
/// (its own stripes of a layout, or a whole range as one stripe); concurrent_reads launches
/// every job at once, one stream per GPU with events around each kernel, and reports the
/// slowest kernel's time. Every kernel reads with 16-byte loads in 256 KiB segments: a
/// stripe at a time, contiguous inside, no division per load. CUDA C++ only; include it
/// from one translation unit of a program.

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda_check.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/stripe_layout.hpp"

namespace vmm::bench {

inline constexpr std::uint64_t segment_bytes = 256 * 1024;  // one block's piece of a stripe
inline constexpr int threads = 256;

/// The GPUs there are, or 0 with the reason in *why: every pair must reach each other's memory.
inline int peer_connected_gpus(std::string* why) {
  if (!vmm::gpu_available(why)) return 0;
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) {
    *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(counted);
    return 0;
  }
  for (int a = 0; a < count; ++a)
    for (int b = 0; b < count; ++b)
      if (!vmm::can_access_peer(a, b)) {
        *why = "gpu " + std::to_string(a) + " cannot access the memory of gpu " + std::to_string(b);
        return 0;
      }
  return count;
}

// ---- the kernel -------------------------------------------------------------------------

// Reads every byte of device `device`'s stripes once. Work items are (stripe, segment)
// pairs, `per_stripe` segments to a stripe (segments past a short stripe's end are empty);
// one division per item, none per load.
__global__ void read_stripes(const uint4* base, vmm::stripe_layout layout, std::uint32_t device,
                             std::uint64_t per_stripe, unsigned long long* sink) {
  const std::uint64_t items = layout.stripes_of(device) * per_stripe;
  std::uint32_t acc = 0;
  for (std::uint64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const vmm::stripe_extent stripe = layout.stripe_of(device, item / per_stripe);
    const std::uint64_t begin = item % per_stripe * segment_bytes;
    if (begin >= stripe.length) continue;
    const std::uint64_t length =
        stripe.length - begin < segment_bytes ? stripe.length - begin : segment_bytes;
    const uint4* p = base + (stripe.offset + begin) / 16;
    const std::uint64_t count = length / 16;
#pragma unroll 4
    for (std::uint64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const uint4 v = p[i];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1ull);  // keeps the loads; almost never taken
}

// What one GPU reads, and how: the layout (its own stripes, or the whole range as one).
struct read_job {
  int gpu;
  const void* base;
  vmm::stripe_layout layout;
  std::uint32_t device;  // index into the layout's devices
};

inline read_job whole_range_on(int gpu, const void* base, std::size_t size) {
  return {gpu, base, vmm::make_stripe_layout(size, size, 1, vmm::stripe_mode::contiguous), 0};
}

inline std::uint64_t per_stripe(const vmm::stripe_layout& layout, std::uint32_t device) {
  const std::uint64_t longest =
      layout.mode == vmm::stripe_mode::contiguous ? layout.bytes_on(device) : layout.stripe_size;
  return (longest + segment_bytes - 1) / segment_bytes;
}

// One GPU's stream, events and sink for concurrent_reads; released on destruction, so
// that a constructor failing half-way leaks nothing.
class gpu_lane {
 public:
  explicit gpu_lane(int gpu) : gpu_(gpu) {
    check(cudaSetDevice(gpu), "cudaSetDevice(" + std::to_string(gpu) + ")");
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, gpu), "cudaDeviceGetAttribute");
    blocks_ = 8 * sms;
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
    check(cudaMalloc(&sink_, sizeof(unsigned long long)), "cudaMalloc(sink)");
  }
  gpu_lane(gpu_lane&& other) noexcept
      : gpu_(other.gpu_),
        blocks_(other.blocks_),
        stream_(std::exchange(other.stream_, nullptr)),
        start_(std::exchange(other.start_, nullptr)),
        stop_(std::exchange(other.stop_, nullptr)),
        sink_(std::exchange(other.sink_, nullptr)) {}
  gpu_lane(const gpu_lane&) = delete;
  gpu_lane& operator=(const gpu_lane&) = delete;
  gpu_lane& operator=(gpu_lane&&) = delete;
  ~gpu_lane() {
    if (stream_ == nullptr && start_ == nullptr && stop_ == nullptr && sink_ == nullptr) return;
    report(cudaSetDevice(gpu_), "cudaSetDevice");
    if (stream_ != nullptr) report(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (sink_ != nullptr) report(cudaFree(sink_), "cudaFree");
    if (start_ != nullptr) report(cudaEventDestroy(start_), "cudaEventDestroy");
    if (stop_ != nullptr) report(cudaEventDestroy(stop_), "cudaEventDestroy");
    if (stream_ != nullptr) report(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  }

  int gpu_;
  int blocks_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  unsigned long long* sink_ = nullptr;
};

// A set of read jobs run together, one lane per job.
class concurrent_reads {
 public:
  explicit concurrent_reads(std::vector<read_job> jobs) : jobs_(std::move(jobs)) {
    lanes_.reserve(jobs_.size());
    for (const read_job& job : jobs_) lanes_.emplace_back(job.gpu);
    check(cudaSetDevice(0), "cudaSetDevice(0)");
  }

  struct timing {
    double slowest_kernel = 0;  // seconds, from events
    double wall = 0;            // seconds, host clock around launches and waits
  };
  // Launches every job at once, waits for all, and times them.
  timing run() {
    const auto begin = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < jobs_.size(); ++i) {
      const read_job& job = jobs_[i];
      check(cudaSetDevice(job.gpu), "cudaSetDevice");
      check(cudaEventRecord(lanes_[i].start_, lanes_[i].stream_), "cudaEventRecord");
      read_stripes<<<lanes_[i].blocks_, threads, 0, lanes_[i].stream_>>>(
          static_cast<const uint4*>(job.base), job.layout, job.device, per_stripe(job.layout, job.device),
          lanes_[i].sink_);
      check(cudaGetLastError(), "read_stripes launch on gpu " + std::to_string(job.gpu));
      check(cudaEventRecord(lanes_[i].stop_, lanes_[i].stream_), "cudaEventRecord");
    }
    timing result;
    for (std::size_t i = 0; i < jobs_.size(); ++i) {
      check(cudaEventSynchronize(lanes_[i].stop_), "read_stripes on gpu " + std::to_string(jobs_[i].gpu));
      float ms = 0;
      check(cudaEventElapsedTime(&ms, lanes_[i].start_, lanes_[i].stop_), "cudaEventElapsedTime");
      result.slowest_kernel = std::max(result.slowest_kernel, static_cast<double>(ms) / 1e3);
    }
    result.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    return result;
  }
  // Bytes all jobs read together.
  [[nodiscard]] std::size_t bytes() const {
    std::size_t sum = 0;
    for (const read_job& job : jobs_) sum += job.layout.bytes_on(job.device);
    return sum;
  }
  // GB/s of `repetitions` runs after one warm-up (the figure the ratios divide by).
  double measure(int repetitions) {
    (void)run();
    double seconds = 0;
    for (int r = 0; r < repetitions; ++r) seconds += run().slowest_kernel;
    return static_cast<double>(bytes()) * repetitions / seconds / 1e9;
  }

 private:
  std::vector<read_job> jobs_;
  std::vector<gpu_lane> lanes_;
};

// Runs the benchmark loop over `reads`; sets the time, bytes and GB/s counters.
inline double time_reads(benchmark::State& state, concurrent_reads& reads) {
  (void)reads.run();  // warm-up: TLBs, clocks
  double kernel_seconds = 0;
  double wall_seconds = 0;
  for (auto _ : state) {
    const concurrent_reads::timing t = reads.run();
    state.SetIterationTime(t.slowest_kernel);
    kernel_seconds += t.slowest_kernel;
    wall_seconds += t.wall;
  }
  const double bytes = static_cast<double>(reads.bytes()) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  const double gbps = bytes / kernel_seconds / 1e9;
  state.counters["GB_per_s"] = gbps;
  state.counters["wall_GB_per_s"] = bytes / wall_seconds / 1e9;
  return gbps;
}

// ---- the baseline: GPU 0 reading memory of its own --------------------------------------

// GPU 0 reading a cudaMalloc buffer of `size` bytes.
class local_buffer {
 public:
  explicit local_buffer(std::size_t size) : size_(size) {
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    check(cudaMalloc(&data_, size), "cudaMalloc(" + std::to_string(size) + " bytes)");
    check(cudaMemset(data_, 1, size), "cudaMemset");
  }
  local_buffer(const local_buffer&) = delete;
  local_buffer& operator=(const local_buffer&) = delete;
  ~local_buffer() { report(cudaFree(data_), "cudaFree"); }
  [[nodiscard]] const void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  void* data_ = nullptr;
  std::size_t size_;
};

/// GB/s of GPU 0 reading a cudaMalloc buffer of `size` bytes, measured once per size in a
/// run (`repetitions` runs after a warm-up): the figure the ratios divide by.
inline double one_gpu_local_gbps(std::size_t size, int repetitions) {
  static std::map<std::size_t, double> measured;
  if (const auto it = measured.find(size); it != measured.end()) return it->second;
  local_buffer buffer(size);
  concurrent_reads reads({whole_range_on(0, buffer.data(), buffer.size())});
  return measured[size] = reads.measure(repetitions);
}

/// The one_gpu_local row: GPU 0 reading a cudaMalloc buffer of `size` bytes.
inline void one_gpu_local(benchmark::State& state, std::size_t size) {
  try {
    local_buffer buffer(size);
    concurrent_reads reads({whole_range_on(0, buffer.data(), buffer.size())});
    (void)time_reads(state, reads);
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

}  // namespace vmm::bench
