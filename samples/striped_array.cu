// striped_array: one array whose stripes live on every GPU, processed by all of them at
// once (each GPU only its own stripes), then read back through the single pointer.
//
// A vmm::striped_buffer deals 8 MiB stripes round-robin to the GPUs and maps them into one
// range. Each GPU runs a kernel that walks its own stripes with the buffer's layout
// (layout.stripes_of / stripe_of), so every access is to its local memory. Then GPU 0 reads
// the whole array through the one pointer (half of it, on two GPUs, over NVLink) and the
// host checks every element.
//
// No cudaDeviceEnablePeerAccess anywhere: the buffer grants each GPU access to the whole
// range with cuMemSetAccess, which is all memory from cuMemCreate needs.
//
// Part two is the other way to spread one pointer over several GPUs: a vmm::growable_buffer
// with spill_to. It fills the first GPU's pool, then continues on the next GPU's, keeping
// its address; a grow that finds no memory anywhere throws vmm::out_of_memory and leaves
// the buffer as it was. (Here GPU 0's pool is capped at 64 MiB, as if GPU 0 were full;
// with default pools the buffer reaches the sum of the GPUs' free memory: a 200 GiB buffer
// over two H200s.)
//
// With one GPU part one runs degenerate (every stripe on GPU 0) and part two is skipped,
// and it says so; with no GPU it prints one line saying so and exits 0.

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/striped_buffer.hpp"

namespace {

constexpr std::size_t stripe_bytes = std::size_t{8} << 20;
constexpr std::uint64_t elements_per_gpu = 50'000'000;  // 200 MB of uint32 each

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

__host__ __device__ std::uint32_t initial(std::uint64_t i) {
  std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  return static_cast<std::uint32_t>(x);
}
__host__ __device__ std::uint32_t processed(std::uint32_t v) {
  return v * 3u + 1u;
}

// Calls body(i) for every element of the array in device `device`'s stripes (elements
// past `count` are the padding up to the granularity: skipped).
template <class Body>
__device__ void for_own_elements(const vmm::stripe_layout& layout, std::uint32_t device, std::uint64_t count,
                                 Body body) {
  const std::uint64_t first_thread = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
  const std::uint64_t all_threads = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t k = 0; k < layout.stripes_of(device); ++k) {
    const vmm::stripe_extent stripe = layout.stripe_of(device, k);
    const std::uint64_t begin = stripe.offset / sizeof(std::uint32_t);
    std::uint64_t end = (stripe.offset + stripe.length) / sizeof(std::uint32_t);
    if (end > count) end = count;
    for (std::uint64_t i = begin + first_thread; i < end; i += all_threads) body(i);
  }
}

__global__ void initialize_own(std::uint32_t* array, vmm::stripe_layout layout, std::uint32_t device,
                               std::uint64_t count) {
  for_own_elements(layout, device, count, [=](std::uint64_t i) { array[i] = initial(i); });
}

__global__ void process_own(std::uint32_t* array, vmm::stripe_layout layout, std::uint32_t device,
                            std::uint64_t count) {
  for_own_elements(layout, device, count, [=](std::uint64_t i) { array[i] = processed(array[i]); });
}

// GPU 0 reads every element through the one pointer, wherever it lives.
__global__ void gather(const std::uint32_t* array, std::uint64_t count, std::uint32_t* out) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    out[i] = array[i];
}

__global__ void write_indices(std::uint32_t* words, std::uint64_t count) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    words[i] = static_cast<std::uint32_t>(i);
}

__global__ void count_wrong_indices(const std::uint32_t* words, std::uint64_t count,
                                    unsigned long long* wrong) {
  unsigned long long local = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    if (words[i] != static_cast<std::uint32_t>(i)) ++local;
  if (local != 0) atomicAdd(wrong, local);
}

// Part two: a growable buffer that spills from GPU 0 onto the others. Returns false when a
// check fails.
bool spill_across_gpus(int gpus) {
  constexpr std::size_t mib = std::size_t{1} << 20;
  // GPU 0's pool capped at 64 MiB, as if that were all it had left; then the others.
  auto first = vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0)), {.cap = 64 * mib});
  std::vector<std::shared_ptr<vmm::chunk_pool>> next;
  for (int d = 1; d < gpus; ++d) next.push_back(vmm::default_pool(vmm::location::device(d)));
  vmm::growable_buffer grown(first, {.max_size = 1024 * mib, .spill_to = next});
  grown.resize(16 * mib);
  void* const address = grown.data();
  grown.resize(256 * mib);  // past GPU 0's 64 MiB: the rest lands on GPU 1
  std::vector<std::size_t> bytes_on(static_cast<std::size_t>(gpus));
  for (const vmm::shared_chunk& chunk : grown.chunks(0, grown.capacity()))
    bytes_on[static_cast<std::size_t>(chunk->memory().provider()->capabilities().where.id)] += chunk->size();
  std::printf("growable buffer at %p (still %p after growing) holds %zu MiB:", grown.data(), address,
              grown.size() / mib);
  for (int d = 0; d < gpus; ++d)
    std::printf(" %zu MiB on gpu %d%s", bytes_on[static_cast<std::size_t>(d)] / mib, d,
                d + 1 < gpus ? "," : "\n");

  // GPU 0 writes all of it through the one pointer; the last GPU reads all of it back.
  auto* words = static_cast<std::uint32_t*>(grown.data());
  const std::uint64_t count = grown.size() / sizeof(std::uint32_t);
  check(cudaSetDevice(0), "cudaSetDevice(0)");
  write_indices<<<264, 256>>>(words, count);
  check(cudaGetLastError(), "write_indices launch");
  check(cudaDeviceSynchronize(), "write_indices");
  check(cudaSetDevice(gpus - 1), "cudaSetDevice");
  unsigned long long* wrong = nullptr;
  check(cudaMalloc(&wrong, sizeof *wrong), "cudaMalloc");
  check(cudaMemset(wrong, 0, sizeof *wrong), "cudaMemset");
  count_wrong_indices<<<264, 256>>>(words, count, wrong);
  check(cudaGetLastError(), "count_wrong_indices launch");
  unsigned long long seen = 1;
  check(cudaMemcpy(&seen, wrong, sizeof seen, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaFree(wrong), "cudaFree");
  check(cudaSetDevice(0), "cudaSetDevice(0)");
  std::printf("gpu 0 wrote it through the one pointer, gpu %d read it back: %llu wrong\n", gpus - 1, seen);
  return grown.data() == address && bytes_on[0] == 64 * mib && seen == 0;
}

int run() {
  std::string why;
  if (!vmm::gpu_available(&why)) {
    std::printf("striped_array: no GPU here (%s); nothing to run\n", why.c_str());
    return 0;
  }
  int gpus = 0;
  check(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
  for (int a = 0; a < gpus; ++a)
    for (int b = 0; b < gpus; ++b)
      if (!vmm::can_access_peer(a, b)) {
        std::printf("striped_array: gpu %d cannot access gpu %d's memory; nothing to run\n", a, b);
        return 0;
      }
  std::vector<int> devices;
  std::vector<cudaStream_t> streams;
  std::vector<vmm::device_stream> buffer_streams;
  for (int d = 0; d < gpus; ++d) {
    check(cudaSetDevice(d), "cudaSetDevice");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    devices.push_back(d);
    streams.push_back(stream);
    buffer_streams.push_back({d, stream});
  }
  const std::uint64_t count = elements_per_gpu * static_cast<std::uint64_t>(gpus);
  std::vector<std::uint32_t> host(count);
  double process_ms = 0;
  {
    // The buffer waits for these streams before it unmaps.
    vmm::striped_buffer array(devices, count * sizeof(std::uint32_t),
                              {.stripe_size = stripe_bytes, .streams = buffer_streams});
    auto* data = static_cast<std::uint32_t*>(array.data());
    const vmm::stripe_layout layout = array.layout();
    std::printf(
        "striped_array: %llu elements (%.1f MiB) at %p over %d GPU%s, %llu stripes of %zu MiB "
        "round-robin%s\n",
        static_cast<unsigned long long>(count), static_cast<double>(array.size()) / (1 << 20), array.data(),
        gpus, gpus == 1 ? "" : "s", static_cast<unsigned long long>(layout.stripe_count()),
        stripe_bytes >> 20, gpus == 1 ? " (one GPU: every stripe on gpu 0)" : "");
    for (int d = 0; d < gpus; ++d) {
      const std::uint32_t index = array.device_index(d);
      std::printf("  gpu %d holds %llu stripes, %.1f MiB\n", d,
                  static_cast<unsigned long long>(layout.stripes_of(index)),
                  static_cast<double>(layout.bytes_on(index)) / (1 << 20));
    }

    // Every GPU at once, each on its own stripes: initialize, then process.
    const auto start = std::chrono::steady_clock::now();
    for (int d = 0; d < gpus; ++d) {
      check(cudaSetDevice(d), "cudaSetDevice");
      const std::uint32_t index = array.device_index(d);
      initialize_own<<<264, 256, 0, streams[static_cast<std::size_t>(d)]>>>(data, layout, index, count);
      process_own<<<264, 256, 0, streams[static_cast<std::size_t>(d)]>>>(data, layout, index, count);
      check(cudaGetLastError(), "kernel launch");
    }
    for (cudaStream_t stream : streams) check(cudaStreamSynchronize(stream), "processing the own stripes");
    process_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

    // Read back through the single pointer: GPU 0 gathers every element, wherever it lives.
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    std::uint32_t* local = nullptr;
    check(cudaMalloc(&local, count * sizeof(std::uint32_t)), "cudaMalloc");
    const auto gather_start = std::chrono::steady_clock::now();
    gather<<<1024, 256, 0, streams[0]>>>(data, count, local);
    check(cudaGetLastError(), "gather launch");
    check(cudaStreamSynchronize(streams[0]), "gather");
    const double gather_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - gather_start).count();
    check(cudaMemcpy(host.data(), local, count * sizeof(std::uint32_t), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
    check(cudaFree(local), "cudaFree");
    std::printf(
        "every GPU processed its own stripes in %.1f ms; gpu 0 read the whole array through the "
        "one pointer "
        "in %.1f ms\n",
        process_ms, gather_ms);
  }  // the buffer waits for the streams, then unmaps every stripe

  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < count; ++i)
    if (host[i] != processed(initial(i))) ++wrong;
  for (int d = 0; d < gpus; ++d) {
    check(cudaSetDevice(d), "cudaSetDevice");
    check(cudaStreamDestroy(streams[static_cast<std::size_t>(d)]), "cudaStreamDestroy");
  }
  if (wrong != 0) {
    std::fprintf(stderr, "striped_array: %llu of %llu elements are wrong\n",
                 static_cast<unsigned long long>(wrong), static_cast<unsigned long long>(count));
    return 1;
  }
  std::printf("all %llu elements checked on the host\n", static_cast<unsigned long long>(count));

  if (gpus < 2) {
    std::printf("one GPU: no other GPU to spill onto; part two skipped\n");
    return 0;
  }
  if (!spill_across_gpus(gpus)) {
    std::fprintf(stderr, "striped_array: the spilled buffer is not as expected\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "striped_array: %s\n", error.what());
    return 1;
  }
}
