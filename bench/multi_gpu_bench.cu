// vmm_bench_multi_gpu: one range striped over every visible GPU, against what a user would
// use instead, in the same run.
//
// 1. own_stripes: each GPU reads its own stripes of a vmm::striped_buffer, all GPUs at once
//    (one stream per GPU, events around each kernel). Aggregate GB/s = all bytes / the
//    slowest GPU's kernel time; ratio_to_one_gpu divides it by one_gpu_local below,
//    measured in this run. Targets: >= 1.95 on two GPUs, >= 3.8 on four.
//    wall_GB_per_s is the same from a host clock around the launches (skew included).
// 2. one_gpu_local: the baseline. GPU 0 reads a cudaMalloc buffer of the same total size
//    with the same kernel.
// 3. one_gpu_reads_all/vmm: GPU 0 reads the whole striped range (mostly over NVLink).
//    one_gpu_reads_all/raw: the same over a range built with raw driver calls
//    (cuMemCreate / cuMemMap / one cuMemSetAccess, fetched through
//    cudaGetDriverEntryPointByVersion: nothing links libcuda). vmm's ratio_to_raw divides by
//    the raw figure measured in this run; the target is within 5 % (>= 0.95).
// 4. spill_reach: a vmm::growable_buffer on GPU 0 spilling onto every other GPU, grown in
//    1 GiB appends (then smaller) until no GPU has memory left: how much one pointer
//    reaches, against the sum of the GPUs' free memory before. Runs last; it takes all of
//    every GPU's memory for a moment.
// Every kernel reads with 16-byte loads in 256 KiB segments: a stripe at a time, contiguous
// inside, no division per load. With fewer than two GPUs (or GPUs without peer access)
// nothing is registered and the program says why.

#include <benchmark/benchmark.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_check.hpp"
#include "raw_driver.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/stripe_layout.hpp"
#include "vmm/striped_buffer.hpp"

namespace {

constexpr std::size_t gib = std::size_t{1} << 30;
constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t total_bytes = 16 * gib;        // the range every read benchmark reads
constexpr std::uint64_t segment_bytes = 256 * 1024;  // one block's piece of a stripe
constexpr int threads = 256;
constexpr int reference_repetitions = 20;  // for the in-run figures the ratios divide by

using vmm::bench::bench_failure;
using vmm::bench::check;
using vmm::bench::report;

int gpu_count = 0;  // visible GPUs, set in main

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

read_job whole_range_on(int gpu, const void* base, std::size_t size) {
  return {gpu, base, vmm::make_stripe_layout(size, size, 1, vmm::stripe_mode::contiguous), 0};
}

std::uint64_t per_stripe(const vmm::stripe_layout& layout, std::uint32_t device) {
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
double time_reads(benchmark::State& state, concurrent_reads& reads) {
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

// ---- what the ratios divide by, measured once in this run --------------------------------

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

double one_gpu_local_gbps() {
  static const double gbps = [] {
    local_buffer buffer(total_bytes);
    concurrent_reads reads({whole_range_on(0, buffer.data(), buffer.size())});
    return reads.measure(reference_repetitions);
  }();
  return gbps;
}

using vmm::bench::raw_driver_calls;

const raw_driver_calls& driver() {
  return vmm::bench::raw_driver<bench_failure>();
}

void check(CUresult result, const std::string& call) {
  if (result != CUDA_SUCCESS)
    throw bench_failure(call + " failed: " + vmm::bench::raw_driver_error_name<bench_failure>(result));
}

void report(CUresult result, const char* call) noexcept {
  if (result != CUDA_SUCCESS)
    std::fprintf(stderr, "vmm_bench_multi_gpu: %s failed: CUresult %d\n", call, static_cast<int>(result));
}

// What striped_buffer does, by hand: one range, one handle per stripe created on the GPU
// the same layout names, mapped, then one cuMemSetAccess granting every GPU read-write.
class raw_striped_range {
 public:
  raw_striped_range(int gpus, std::size_t size, std::size_t stripe)
      : layout_(vmm::make_stripe_layout(size, stripe, static_cast<std::uint32_t>(gpus),
                                        vmm::stripe_mode::round_robin)) {
    // The driver calls below run in GPU 0's primary context, as the runtime's do.
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    check(cudaFree(nullptr), "cudaFree(nullptr) (initialising the primary context)");
    const raw_driver_calls& calls = driver();
    CUmemAllocationProp properties{};
    properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    std::size_t granularity = 0;
    check(calls.get_allocation_granularity(&granularity, &properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    if (granularity == 0 || stripe % granularity != 0 || size % granularity != 0)
      throw bench_failure("raw range: the stripe or size is not a multiple of the granularity " +
                          std::to_string(granularity));
    check(calls.address_reserve(&owned_.base, size, 0, 0, 0),
          "cuMemAddressReserve(" + std::to_string(size) + " bytes)");
    owned_.size = size;
    owned_.handles.reserve(layout_.stripe_count());
    owned_.mapped.reserve(layout_.stripe_count());
    for (std::uint64_t offset = 0; offset < size;) {
      const vmm::stripe_position stripe = layout_.locate(offset);
      properties.location.id = static_cast<int>(stripe.device);
      CUmemGenericAllocationHandle handle = 0;
      check(calls.create(&handle, stripe.extent.length, &properties, 0),
            "cuMemCreate(" + std::to_string(stripe.extent.length) + " bytes) on gpu " +
                std::to_string(stripe.device));
      owned_.handles.push_back(handle);
      check(calls.map(owned_.base + offset, stripe.extent.length, 0, handle, 0), "cuMemMap");
      owned_.mapped.emplace_back(owned_.base + offset, stripe.extent.length);
      offset += stripe.extent.length;
    }
    std::vector<CUmemAccessDesc> access(static_cast<std::size_t>(gpus));
    for (int d = 0; d < gpus; ++d) {
      access[static_cast<std::size_t>(d)].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access[static_cast<std::size_t>(d)].location.id = d;
      access[static_cast<std::size_t>(d)].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    check(calls.set_access(owned_.base, size, access.data(), access.size()), "cuMemSetAccess");
  }
  raw_striped_range(const raw_striped_range&) = delete;
  raw_striped_range& operator=(const raw_striped_range&) = delete;
  [[nodiscard]] const void* data() const noexcept { return reinterpret_cast<const void*>(owned_.base); }
  [[nodiscard]] std::size_t size() const noexcept { return owned_.size; }

 private:
  // Released in reverse: mappings, handles, then the range; also when the constructor
  // throws half-way (members are destroyed then, the class's destructor is not).
  struct owned {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    std::vector<CUmemGenericAllocationHandle> handles;
    std::vector<std::pair<CUdeviceptr, std::size_t>> mapped;
    owned() = default;
    owned(const owned&) = delete;
    owned& operator=(const owned&) = delete;
    ~owned() {
      const raw_driver_calls& calls = driver();
      for (const auto& [address, length] : mapped) report(calls.unmap(address, length), "cuMemUnmap");
      for (CUmemGenericAllocationHandle handle : handles) report(calls.release(handle), "cuMemRelease");
      if (base != 0) report(calls.address_free(base, size), "cuMemAddressFree");
    }
  };
  vmm::stripe_layout layout_;
  owned owned_;
};

double raw_reads_all_gbps(std::size_t stripe) {
  static std::map<std::size_t, double> measured;
  if (auto it = measured.find(stripe); it != measured.end()) return it->second;
  raw_striped_range range(gpu_count, total_bytes, stripe);
  concurrent_reads reads({whole_range_on(0, range.data(), range.size())});
  return measured[stripe] = reads.measure(reference_repetitions);
}

// ---- the benchmarks ---------------------------------------------------------------------

std::vector<int> all_gpus() {
  std::vector<int> gpus;
  for (int d = 0; d < gpu_count; ++d) gpus.push_back(d);
  return gpus;
}

// A striped buffer over every GPU from pools of its own: its memory goes back to the
// driver when the benchmark ends. (cuMemCreate commits the memory: no fill is needed for
// the reads to touch real pages, here as in the raw range.)
struct striped_fixture {
  std::vector<std::shared_ptr<vmm::chunk_pool>> pools;
  vmm::striped_buffer buffer;

  striped_fixture(std::size_t stripe, vmm::stripe_mode mode) {
    for (int d = 0; d < gpu_count; ++d)
      pools.push_back(vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(d))));
    buffer =
        vmm::striped_buffer(all_gpus(), total_bytes, {.stripe_size = stripe, .mode = mode, .pools = pools});
  }
};

// Args: stripe in MiB, mode (0 round-robin, 1 contiguous).
void own_stripes(benchmark::State& state) {
  try {
    const std::size_t stripe = static_cast<std::size_t>(state.range(0)) * mib;
    const auto mode = state.range(1) == 0 ? vmm::stripe_mode::round_robin : vmm::stripe_mode::contiguous;
    const double baseline = one_gpu_local_gbps();
    striped_fixture striped(stripe, mode);
    std::vector<read_job> jobs;
    for (int d = 0; d < gpu_count; ++d)
      jobs.push_back({d, striped.buffer.data(), striped.buffer.layout(), striped.buffer.device_index(d)});
    concurrent_reads reads(std::move(jobs));
    const double gbps = time_reads(state, reads);
    state.counters["gpus"] = gpu_count;
    state.counters["one_gpu_GB_per_s"] = baseline;
    state.counters["ratio_to_one_gpu"] = gbps / baseline;
    state.counters["target_ratio"] = gpu_count == 2 ? 1.95 : gpu_count == 4 ? 3.8 : 0.95 * gpu_count;
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

void one_gpu_local(benchmark::State& state) {
  try {
    local_buffer buffer(total_bytes);
    concurrent_reads reads({whole_range_on(0, buffer.data(), buffer.size())});
    (void)time_reads(state, reads);
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

// Args: stripe in MiB.
void one_gpu_reads_all_vmm(benchmark::State& state) {
  try {
    const std::size_t stripe = static_cast<std::size_t>(state.range(0)) * mib;
    const double raw = raw_reads_all_gbps(stripe);
    striped_fixture striped(stripe, vmm::stripe_mode::round_robin);
    concurrent_reads reads({whole_range_on(0, striped.buffer.data(), striped.buffer.size())});
    const double gbps = time_reads(state, reads);
    state.counters["raw_GB_per_s"] = raw;
    state.counters["ratio_to_raw"] = gbps / raw;
    state.counters["ratio_to_one_gpu"] = gbps / one_gpu_local_gbps();
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

// Args: stripe in MiB.
void one_gpu_reads_all_raw(benchmark::State& state) {
  try {
    const std::size_t stripe = static_cast<std::size_t>(state.range(0)) * mib;
    raw_striped_range range(gpu_count, total_bytes, stripe);
    concurrent_reads reads({whole_range_on(0, range.data(), range.size())});
    (void)time_reads(state, reads);
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

__global__ void fill_bytes(unsigned char* p, std::uint64_t n, unsigned char value) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    p[i] = value;
}

void spill_reach(benchmark::State& state) {
  try {
    for (auto _ : state) {
      double free_bytes = 0;
      for (int d = 0; d < gpu_count; ++d) {
        check(cudaSetDevice(d), "cudaSetDevice");
        std::size_t free = 0;
        std::size_t total = 0;
        check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
        free_bytes += static_cast<double>(free);
      }
      check(cudaSetDevice(0), "cudaSetDevice(0)");
      std::vector<std::shared_ptr<vmm::chunk_pool>> spill;
      for (int d = 1; d < gpu_count; ++d)
        spill.push_back(vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(d))));
      const auto first = vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0)));
      const std::size_t granularity = first->granularity();
      double seconds = 0;
      std::size_t reach = 0;
      std::size_t chunks = 0;
      {
        vmm::growable_buffer buffer(first, {.spill_to = spill});  // range: every GPU's memory
        const auto start = std::chrono::steady_clock::now();
        for (std::size_t step = gib; step >= granularity; step /= 2) {
          try {
            for (;;) buffer.resize(buffer.size() + step);
          } catch (const vmm::out_of_memory&) {
            // this step no longer fits: try a smaller one
          }
        }
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        reach = buffer.size();
        chunks = buffer.chunk_count();
        // The far end is usable from GPU 0: write the last 64 MiB through the one pointer
        // (1 when it worked; every GPU's memory is taken, so a launch may fail for want of
        // it: 0 then, and the reach still stands).
        const std::size_t tail = std::min<std::size_t>(64 * mib, reach);
        fill_bytes<<<1024, 256>>>(static_cast<unsigned char*>(buffer.data()) + reach - tail, tail, 7);
        const cudaError_t launched = cudaGetLastError();
        const cudaError_t done = launched == cudaSuccess ? cudaDeviceSynchronize() : launched;
        if (done != cudaSuccess)
          std::fprintf(stderr, "vmm_bench_multi_gpu: writing the far end of the spilled buffer: %s\n",
                       cudaGetErrorName(done));
        state.counters["far_end_written"] = done == cudaSuccess ? 1 : 0;
      }
      state.SetIterationTime(seconds);
      state.counters["reach_GiB"] = static_cast<double>(reach) / static_cast<double>(gib);
      state.counters["free_GiB"] = free_bytes / static_cast<double>(gib);
      state.counters["percent_of_free"] = 100.0 * static_cast<double>(reach) / free_bytes;
      state.counters["chunks"] = static_cast<double>(chunks);
      state.counters["gpus"] = gpu_count;
    }
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

// GPUs, or 0 with the reason: every pair must reach each other's memory.
int usable_gpus(std::string* why) {
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

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::string why;
  try {
    gpu_count = usable_gpus(&why);
  } catch (const std::exception& error) {
    why = error.what();
  }
  if (gpu_count < 2) {
    std::printf("vmm_bench_multi_gpu: needs 2 GPUs with peer access (%s); no benchmark registered\n",
                gpu_count == 1 ? "this machine has 1" : why.c_str());
    return 0;
  }
  const long gpus = gpu_count;
  benchmark::RegisterBenchmark("one_gpu_local", one_gpu_local)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("own_stripes", own_stripes)
      ->ArgNames({"stripe_MiB", "contiguous"})
      ->Args({2, 0})
      ->Args({64, 0})
      ->Args({2, 1})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("one_gpu_reads_all/raw", one_gpu_reads_all_raw)
      ->ArgName("stripe_MiB")
      ->Arg(2)
      ->Arg(64)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("one_gpu_reads_all/vmm", one_gpu_reads_all_vmm)
      ->ArgName("stripe_MiB")
      ->Arg(2)
      ->Arg(64)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("spill_reach", spill_reach)
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  std::printf("vmm_bench_multi_gpu: %ld GPUs, %zu GiB read per iteration\n", gpus, total_bytes / gib);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
