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
#include "gpu_reads.hpp"
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
constexpr std::size_t total_bytes = 16 * gib;  // the range every read benchmark reads
constexpr int reference_repetitions = 20;      // for the in-run figures the ratios divide by

using vmm::bench::bench_failure;
using vmm::bench::check;
using vmm::bench::concurrent_reads;
using vmm::bench::read_job;
using vmm::bench::report;
using vmm::bench::time_reads;
using vmm::bench::whole_range_on;

int gpu_count = 0;  // visible GPUs, set in main

double one_gpu_local_gbps() {
  return vmm::bench::one_gpu_local_gbps(total_bytes, reference_repetitions);
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
  vmm::bench::one_gpu_local(state, total_bytes);
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

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::string why;
  try {
    gpu_count = vmm::bench::peer_connected_gpus(&why);
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
