// vmm_bench_host_spill: a device_vector larger than its GPU pool, continued in pinned host
// memory (spill_to a pool of location::pinned_host(0)): one pointer, kernels read both parts.
//
// By default the GPU pool is capped at --cap (4 GiB) and the vector holds --host (4 GiB)
// more, so it runs on any GPU. --oversubscribe=1.5 sizes the vector to 1.5 x the GPU's
// memory instead, with the GPU pool uncapped (it fills the GPU, then spills): it needs half
// the GPU's memory again in pinned host memory.
//
// Rows, in the same run, each a kernel (or copy) over the bytes named:
//   read/device_part    a kernel reads the GPU part of the vector (16-byte loads);
//   read/host_part      the same kernel over the host part (HOST_NUMA memory through the
//                       vector's mapping: PCIe or C2C);
//   read/whole          the same kernel over the whole vector, across the boundary;
//   memcpy/pinned       cudaMemcpyAsync host-to-device from cudaMallocHost memory of the
//                       host part's size (at most 16 GiB): what a user would do instead;
//   memcpy/host_part    cudaMemcpyAsync from the vector's host part to a device buffer.
// Reported: GB/s, and for the host rows vs_memcpy = their GB/s over memcpy/pinned's.
// Correctness: the vector is filled with its indices by a kernel before the rows, and a
// kernel checks every element across the whole vector; any mismatch fails the run
// ("errors" counter on read/whole, and the exit status). Without a GPU every row is
// skipped with the reason.
//
//   vmm_bench_host_spill [--cap=4G] [--host=4G] [--oversubscribe=1.5] [benchmark flags]

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "bench_args.hpp"
#include "cuda_check.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/device_vector.hpp"

namespace {

std::size_t cap_bytes = std::size_t{4} << 30;
std::size_t host_bytes = std::size_t{4} << 30;
double oversubscribe = 0;  // 0: use cap and host
constexpr std::size_t max_staging = std::size_t{16} << 30;

using vmm::bench::check;

__global__ void fill_indices(std::uint32_t* data, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride)
    data[i] = static_cast<std::uint32_t>(i * 2654435761u);
}

__global__ void count_mismatches(const std::uint32_t* data, std::size_t count, unsigned long long* errors) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long mine = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride)
    mine += data[i] != static_cast<std::uint32_t>(i * 2654435761u);
  if (mine != 0) atomicAdd(errors, mine);
}

// Reads `count` uint4 and folds them into one word per block, so that no load is dead.
__global__ void read_all(const uint4* data, std::size_t count, std::uint32_t* sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::uint32_t folded = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    const uint4 v = __ldcs(data + i);
    folded ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (folded == 0x9e3779b9u) sink[blockIdx.x] = folded;  // practically never: keeps the loads
}

// The vector and everything the rows share, made once.
struct fixture {
  std::shared_ptr<vmm::chunk_pool> device_pool;
  std::shared_ptr<vmm::chunk_pool> host_pool;
  std::unique_ptr<vmm::device_vector<std::uint32_t>> vector;
  std::size_t device_part = 0;  // bytes of the vector in GPU memory
  std::size_t total = 0;
  cudaStream_t stream = nullptr;
  int blocks = 0;
  std::uint32_t* sink = nullptr;
  void* staging_host = nullptr;
  void* staging_device = nullptr;
  std::size_t staging = 0;
  unsigned long long errors = 0;

  fixture() {
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaDeviceGetAttribute(&blocks, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
    blocks *= 8;
    check(cudaMalloc(&sink, sizeof(std::uint32_t) * static_cast<std::size_t>(blocks)), "cudaMalloc");
    const auto gpu = vmm::provider_for(vmm::location::device(0));
    total = oversubscribe > 0
                ? static_cast<std::size_t>(oversubscribe *
                                           static_cast<double>(gpu->capabilities().physical_memory_size))
                : cap_bytes + host_bytes;
    total = vmm::round_up(total, gpu->capabilities().granularity);
    // The copies' buffers first: once the vector has filled the GPU there is no room left.
    staging = std::min(oversubscribe > 0 ? total - total / 2 : host_bytes, max_staging);
    check(cudaMallocHost(&staging_host, staging), "cudaMallocHost");
    std::memset(staging_host, 1, staging);
    check(cudaMalloc(&staging_device, staging), "cudaMalloc (the copies' destination)");
    if (oversubscribe > 0) {  // all the GPU has left, less 2 GiB for the runtime and kernels
      std::size_t free = 0;
      std::size_t all = 0;
      check(cudaMemGetInfo(&free, &all), "cudaMemGetInfo");
      cap_bytes = free > (std::size_t{2} << 30) ? free - (std::size_t{2} << 30) : 0;
    }
    device_pool = vmm::chunk_pool::create(gpu, {.cap = cap_bytes});
    host_pool = vmm::chunk_pool::create(vmm::provider_for(vmm::location::pinned_host(0)));
    vector = std::make_unique<vmm::device_vector<std::uint32_t>>(
        device_pool,
        vmm::growable_buffer_options{.max_size = total, .stream = stream, .spill_to = {host_pool}});
    // Grown in 1 GiB steps, as an application would, so the GPU part is what fits.
    for (std::size_t size = 0; size < total;) {
      size = std::min(total, size + (std::size_t{1} << 30));
      vector->resize(size / sizeof(std::uint32_t), vmm::element_init::uninitialized);
    }
    device_part = device_pool->statistics().used_current;
    fill_indices<<<blocks, 256, 0, stream>>>(vector->data(), vector->size());
    unsigned long long* errors_on_gpu = nullptr;
    check(cudaMalloc(&errors_on_gpu, sizeof(unsigned long long)), "cudaMalloc");
    check(cudaMemsetAsync(errors_on_gpu, 0, sizeof(unsigned long long), stream), "cudaMemsetAsync");
    count_mismatches<<<blocks, 256, 0, stream>>>(vector->data(), vector->size(), errors_on_gpu);
    check(cudaMemcpyAsync(&errors, errors_on_gpu, sizeof errors, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaFree(errors_on_gpu), "cudaFree");
    staging = std::min(staging, total - device_part);
    std::printf(
        "vmm_bench_host_spill: vector of %.2f GiB, %.2f GiB on the GPU, %.2f GiB in pinned host memory; "
        "%llu mismatches across the boundary\n",
        static_cast<double>(total) / (1 << 30), static_cast<double>(device_part) / (1 << 30),
        static_cast<double>(total - device_part) / (1 << 30), errors);
  }
  ~fixture() {
    cudaFree(staging_device);
    cudaFreeHost(staging_host);
    cudaFree(sink);
    vector.reset();
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
};

fixture* shared = nullptr;
std::string no_gpu_reason;
double pinned_memcpy_rate = 0;

double time_on_stream(cudaStream_t stream, const auto& work) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  work();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3;
}

enum class row { device_part, host_part, whole, memcpy_pinned, memcpy_host_part };

void run(benchmark::State& state, row which) {
  if (shared == nullptr) {
    state.SkipWithError(("no GPU here: " + no_gpu_reason).c_str());
    return;
  }
  fixture& f = *shared;
  const auto* base = reinterpret_cast<const char*>(f.vector->data());
  const char* from = base;
  std::size_t bytes = f.total;
  switch (which) {
    case row::device_part:
      bytes = f.device_part;
      break;
    case row::host_part:
      from = base + f.device_part;
      bytes = f.total - f.device_part;
      break;
    case row::whole:
      break;
    case row::memcpy_pinned:
      bytes = f.staging;
      break;
    case row::memcpy_host_part:
      from = base + f.device_part;
      bytes = f.staging;
      break;
  }
  if (bytes == 0) {
    state.SkipWithError("that part of the vector is empty");
    return;
  }
  double seconds_total = 0;
  for (auto _ : state) {
    const double seconds = time_on_stream(f.stream, [&] {
      if (which == row::memcpy_pinned) {
        check(cudaMemcpyAsync(f.staging_device, f.staging_host, bytes, cudaMemcpyHostToDevice, f.stream),
              "cudaMemcpyAsync");
      } else if (which == row::memcpy_host_part) {
        check(cudaMemcpyAsync(f.staging_device, from, bytes, cudaMemcpyDefault, f.stream), "cudaMemcpyAsync");
      } else {
        read_all<<<f.blocks, 256, 0, f.stream>>>(reinterpret_cast<const uint4*>(from), bytes / sizeof(uint4),
                                                 f.sink);
        check(cudaGetLastError(), "read_all<<<>>>");
      }
    });
    state.SetIterationTime(seconds);
    seconds_total += seconds;
  }
  const double rate =
      static_cast<double>(bytes) * static_cast<double>(state.iterations()) / seconds_total / 1e9;
  state.counters["GB/s"] = rate;
  state.counters["GiB"] = static_cast<double>(bytes) / (1 << 30);
  if (which == row::memcpy_pinned) pinned_memcpy_rate = rate;
  if ((which == row::host_part || which == row::memcpy_host_part) && pinned_memcpy_rate > 0)
    state.counters["vs_memcpy"] = rate / pinned_memcpy_rate;
  if (which == row::whole) state.counters["errors"] = static_cast<double>(f.errors);
}

}  // namespace

int main(int argc, char** argv) {
  using vmm::bench::parse_size;
  if (!vmm::bench::take_options(argc, argv, "vmm_bench_host_spill",
                                {{"--cap=", [](const char* v) { cap_bytes = parse_size("--cap=", v); }},
                                 {"--host=", [](const char* v) { host_bytes = parse_size("--host=", v); }},
                                 {"--oversubscribe=", [](const char* v) {
                                    oversubscribe = vmm::bench::parse_ratio("--oversubscribe=", v, 0, 64);
                                  }}}))
    return 1;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  std::unique_ptr<fixture> gpu;
  if (vmm::gpu_available(&no_gpu_reason)) {
    try {
      gpu = std::make_unique<fixture>();
      shared = gpu.get();
    } catch (const std::exception& error) {
      no_gpu_reason = error.what();
      std::fprintf(stderr, "vmm_bench_host_spill: %s\n", error.what());
    }
  }
  const std::pair<const char*, row> rows[] = {{"memcpy/pinned", row::memcpy_pinned},
                                              {"read/device_part", row::device_part},
                                              {"read/host_part", row::host_part},
                                              {"read/whole", row::whole},
                                              {"memcpy/host_part", row::memcpy_host_part}};
  for (const auto& [name, which] : rows)
    benchmark::RegisterBenchmark(name, [which = which](benchmark::State& state) { run(state, which); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.5);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  const bool wrong = gpu != nullptr && gpu->errors != 0;
  gpu.reset();
  return wrong ? 1 : 0;
}
