// filter_append: stream compaction into a vector that grows in place.
//
// The kernel keeps, of 32 Mi random keys, those below a threshold, as {index, key} pairs,
// pushing each through a vmm::append_view. It knows nothing of how much room there is:
// vmm::append_from_kernel gives it the vector's capacity, and when that runs out it grows the
// vector where it is (no copy, data() unchanged) and launches again the window of inputs
// that did not fit. The output order is free; the host checks that every selected key is
// there exactly once, against its own filter of the same keys.
//
// Part 1: selectivities from 0.1 % to 90 %, each into a new vector of one 2 MiB granule.
// Part 2: an output 115 times that first capacity, with the three growth settings: growth
//   from the overflow information with the input count known (windows), the same with the
//   input count unknown (one launch per round), and geometric growth (doubling).
// On a machine without a GPU it prints one line saying so and exits 0.

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "vmm/append.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/device_vector.hpp"

namespace {

struct hit {
  std::uint32_t index;
  std::uint32_t key;
};

constexpr std::uint64_t key_count = std::uint64_t{32} << 20;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

std::uint32_t random_key(std::uint64_t i) {
  std::uint64_t x = i + 0x9e3779b97f4a7c15ull;
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return static_cast<std::uint32_t>(x ^ (x >> 33));
}

// Processes inputs [first, out.limit(n)): append_from_kernel may run it once for the whole
// input or once per window, and again for a window that did not fit.
__global__ void select_below(const std::uint32_t* keys, std::uint64_t first, std::uint64_t n,
                             std::uint32_t threshold, vmm::append_view<hit> out) {
  if (out.overflowed()) return;  // an earlier window of this round ran out: this one runs again
  const std::uint64_t end = out.limit(n);
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = first + std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < end; i += stride) {
    const std::uint32_t key = keys[i];
    if (key < threshold) out.push(hit{static_cast<std::uint32_t>(i), key});  // one atomic per warp
  }
}

struct outcome {
  std::size_t selected = 0;
  vmm::append_statistics statistics;
  double milliseconds = 0;
  double capacity_ratio = 0;  // capacity mapped over the output
};

// Runs the filter into a new vector of one granule and checks the result against the host.
outcome filter(const std::shared_ptr<vmm::chunk_pool>& pool, const std::uint32_t* device_keys,
               const std::vector<std::uint32_t>& keys, std::uint32_t threshold, cudaStream_t stream,
               vmm::append_options options) {
  vmm::device_vector<hit> selected(pool, {.max_size = key_count * sizeof(hit) + (4 << 20)});
  selected.reserve(1);  // one granule: 262112 pairs fit
  int blocks = 0;
  check(cudaDeviceGetAttribute(&blocks, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
  blocks *= 8;
  outcome result;
  options.statistics = &result.statistics;
  const auto start = std::chrono::steady_clock::now();
  result.selected = vmm::append_from_kernel(
      selected,
      [&](vmm::append_view<hit> view, std::size_t first, vmm::stream_ref on) {
        select_below<<<blocks, 256, 0, on.get()>>>(device_keys, first, key_count, threshold, view);
      },
      stream, options);
  result.milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  result.capacity_ratio =
      result.selected == 0 ? 0.0
                           : static_cast<double>(selected.capacity()) / static_cast<double>(result.selected);

  // Every key below the threshold exactly once, with its index; nothing else.
  const std::vector<hit> got = selected.to_host();
  std::vector<bool> seen(keys.size());
  for (const hit& h : got) {
    if (h.index >= keys.size() || keys[h.index] != h.key || h.key >= threshold || seen[h.index])
      throw std::runtime_error("wrong or repeated pair {" + std::to_string(h.index) + ", " +
                               std::to_string(h.key) + "}");
    seen[h.index] = true;
  }
  std::size_t expected = 0;
  for (const std::uint32_t key : keys) expected += key < threshold ? 1 : 0;
  if (got.size() != expected)
    throw std::runtime_error(std::to_string(got.size()) + " pairs appended, " + std::to_string(expected) +
                             " keys are below the threshold");
  return result;
}

std::uint32_t threshold_for(double fraction) {
  return static_cast<std::uint32_t>(fraction * 4294967296.0);
}

int run() {
  std::string why;
  if (!vmm::gpu_available(&why)) {
    std::printf("filter_append: no GPU here (%s); nothing to run\n", why.c_str());
    return 0;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<std::uint32_t> keys(key_count);
  for (std::uint64_t i = 0; i < key_count; ++i) keys[i] = random_key(i);
  std::uint32_t* device_keys = nullptr;
  check(cudaMalloc(&device_keys, key_count * sizeof(std::uint32_t)), "cudaMalloc");
  check(cudaMemcpy(device_keys, keys.data(), key_count * sizeof(std::uint32_t), cudaMemcpyHostToDevice),
        "cudaMemcpy");
  auto pool = vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0)));

  std::printf("%llu Mi keys; each run starts from a vector of one 2 MiB granule (262112 pairs)\n\n",
              static_cast<unsigned long long>(key_count >> 20));
  std::printf("%-11s %10s %7s %9s %8s %17s %9s\n", "selectivity", "selected", "rounds", "launches", "growths",
              "capacity/output", "time ms");
  const vmm::append_options windows{.input_count = key_count};
  for (const double fraction : {0.001, 0.01, 0.1, 0.5, 0.9}) {
    const outcome o = filter(pool, device_keys, keys, threshold_for(fraction), stream, windows);
    std::printf("%10.1f%% %10zu %7zu %9zu %8zu %17.3f %9.2f\n", 100 * fraction, o.selected,
                o.statistics.rounds, o.statistics.launches, o.statistics.growths, o.capacity_ratio,
                o.milliseconds);
  }

  std::printf("\nan output 115 times the first capacity (90 %% of the keys):\n");
  std::printf("%-40s %7s %9s %8s %17s %9s\n", "growth", "rounds", "launches", "growths", "capacity/output",
              "time ms");
  const std::pair<const char*, vmm::append_options> settings[] = {
      {"from the overflow, input count known", {.input_count = key_count}},
      {"from the overflow, input count unknown", {}},
      {"doubling, input count known", {.input_count = key_count, .growth_factor = 2}},
  };
  for (const auto& [name, options] : settings) {
    // The first run warms the pool: the second shows growth from recycled chunks.
    (void)filter(pool, device_keys, keys, threshold_for(0.9), stream, options);
    const outcome o = filter(pool, device_keys, keys, threshold_for(0.9), stream, options);
    std::printf("%-40s %7zu %9zu %8zu %17.3f %9.2f\n", name, o.statistics.rounds, o.statistics.launches,
                o.statistics.growths, o.capacity_ratio, o.milliseconds);
  }
  std::printf("\nevery run checked against the host's filter: each selected key once, nothing else\n");
  check(cudaFree(device_keys), "cudaFree");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "filter_append: %s\n", error.what());
    return 1;
  }
}
