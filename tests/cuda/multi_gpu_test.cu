// One range over several GPUs, seen from kernels: each GPU processes only its own stripes
// through the layout; a kernel on one GPU reads what a kernel on another wrote, with peer
// access never enabled (cuMemSetAccess is all VMM memory needs); the driver itself says
// each stripe lives on the GPU the layout names; one copy spans every GPU; a kernel write
// from a GPU granted read-only access fails; a growable buffer that spilled across GPUs is
// one pointer for kernels on both. Every test skips with the reason where there are fewer
// than two GPUs.

#include <cuda.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/stripe_layout.hpp"
#include "vmm/striped_buffer.hpp"

namespace vmm::testing {
namespace {

constexpr unsigned blocks = 264;
constexpr unsigned threads = 256;

__host__ __device__ std::uint32_t word_value(std::uint32_t seed, std::uint64_t index) {
  std::uint64_t x = (index + 1) * 0x9e3779b97f4a7c15ull ^ (std::uint64_t{seed} << 32);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<std::uint32_t>(x) | 1u;  // never 0, the "unwritten" fill
}

__device__ std::uint64_t first_thread() {
  return blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
}
__device__ std::uint64_t all_threads() {
  return std::uint64_t{gridDim.x} * blockDim.x;
}

__global__ void fill_words(std::uint32_t* words, std::uint64_t count, std::uint32_t value) {
  for (std::uint64_t i = first_thread(); i < count; i += all_threads()) words[i] = value;
}

__global__ void write_words(std::uint32_t* words, std::uint64_t count, std::uint32_t seed) {
  for (std::uint64_t i = first_thread(); i < count; i += all_threads()) words[i] = word_value(seed, i);
}

__global__ void count_mismatches(const std::uint32_t* words, std::uint64_t count, std::uint32_t seed,
                                 unsigned long long* mismatches) {
  unsigned long long local = 0;
  for (std::uint64_t i = first_thread(); i < count; i += all_threads())
    if (words[i] != word_value(seed, i)) ++local;
  if (local != 0) atomicAdd(mismatches, local);
}

// The kernel of the issue: device `device` (a layout index) writes its own stripes only,
// walking them as the layout hands them out: one stripe at a time, contiguous inside.
__global__ void write_own_stripes(std::uint32_t* base, vmm::stripe_layout layout, std::uint32_t device,
                                  std::uint32_t seed) {
  const std::uint64_t stripes = layout.stripes_of(device);
  for (std::uint64_t k = 0; k < stripes; ++k) {
    const vmm::stripe_extent stripe = layout.stripe_of(device, k);
    std::uint32_t* words = base + stripe.offset / 4;
    for (std::uint64_t i = first_thread(); i < stripe.length / 4; i += all_threads())
      words[i] = word_value(seed + device, stripe.offset / 4 + i);
  }
}

// Every word of the range holds what its owner (by layout.device_of) wrote.
__global__ void count_misplaced(const std::uint32_t* base, vmm::stripe_layout layout, std::uint32_t seed,
                                unsigned long long* mismatches) {
  unsigned long long local = 0;
  for (std::uint64_t i = first_thread(); i < layout.size / 4; i += all_threads())
    if (base[i] != word_value(seed + layout.device_of(i * 4), i)) ++local;
  if (local != 0) atomicAdd(mismatches, local);
}

// Device `device` checks its own bytes, found through local_to_offset.
__global__ void count_own_mismatches(const std::uint32_t* base, vmm::stripe_layout layout,
                                     std::uint32_t device, std::uint32_t seed,
                                     unsigned long long* mismatches) {
  unsigned long long local = 0;
  for (std::uint64_t j = first_thread(); j < layout.bytes_on(device) / 4; j += all_threads()) {
    const std::uint64_t offset = layout.local_to_offset(device, j * 4);
    if (layout.device_of(offset) != device || base[offset / 4] != word_value(seed + device, offset / 4))
      ++local;
  }
  if (local != 0) atomicAdd(mismatches, local);
}

// Runs `launch(counter)` on `device` and returns the count it left.
template <class Launch>
unsigned long long count_on(int device, Launch&& launch) {
  on_device selected(device);
  device_array<unsigned long long> count(1);
  VMM_CUDA_CHECK(cudaMemset(count.get(), 0, sizeof(unsigned long long)));
  launch(count.get());
  VMM_CUDA_CHECK(cudaGetLastError());
  return count.to_host(nullptr).front();
}

// The device the driver says backs `address` (cuMemRetainAllocationHandle and
// cuMemGetAllocationPropertiesFromHandle, fetched through the runtime: nothing links
// libcuda).
class allocation_probe {
 public:
  allocation_probe() {
    fetch(retain_, "cuMemRetainAllocationHandle");
    fetch(properties_, "cuMemGetAllocationPropertiesFromHandle");
    fetch(release_, "cuMemRelease");
  }
  [[nodiscard]] int device_of(const void* address) const {
    CUmemGenericAllocationHandle handle = 0;
    check(retain_(&handle, const_cast<void*>(address)), "cuMemRetainAllocationHandle");
    CUmemAllocationProp properties{};
    const CUresult got = properties_(&properties, handle);
    check(release_(handle), "cuMemRelease (of the retained handle)");
    check(got, "cuMemGetAllocationPropertiesFromHandle");
    return properties.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? properties.location.id : -1;
  }

 private:
  template <class Fn>
  static void fetch(Fn& fn, const char* symbol) {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult status{};
    VMM_CUDA_CHECK(cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || address == nullptr)
      throw std::runtime_error(std::string("the driver has no entry point ") + symbol);
    fn = reinterpret_cast<Fn>(address);
  }
  static void check(CUresult result, const char* call) {
    if (result != CUDA_SUCCESS)
      throw std::runtime_error(std::string(call) + " failed: CUresult " + std::to_string(result));
  }
  decltype(&cuMemRetainAllocationHandle) retain_ = nullptr;
  decltype(&cuMemGetAllocationPropertiesFromHandle) properties_ = nullptr;
  decltype(&cuMemRelease) release_ = nullptr;
};

// Every test needs two GPUs that can reach each other's memory.
class multi_gpu_kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "needs 2 GPUs; no GPU here: " << why;
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    if (counted == cudaErrorInsufficientDriver)
      GTEST_SKIP() << "the driver is older than the CUDA runtime these tests were built with";
    VMM_CUDA_CHECK(counted);
    if (count < 2) GTEST_SKIP() << "needs 2 GPUs; this machine has " << count;
    for (int d = 0; d < count; ++d) {
      for (int e = 0; e < count; ++e)
        if (!can_access_peer(d, e)) GTEST_SKIP() << "gpu " << d << " cannot access gpu " << e << "'s memory";
      on_device selected(d);
      VMM_CUDA_CHECK(cudaFree(nullptr));  // the primary context, which vmm's driver layer uses too
      devices_.push_back(d);
      granularity_ = std::max(granularity_, provider_for(location::device(d))->capabilities().granularity);
    }
  }
  void synchronize_all() const {
    for (int d : devices_) {
      on_device selected(d);
      VMM_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }

  std::vector<int> devices_;
  std::size_t granularity_ = 0;
};

TEST_F(multi_gpu_kernels, each_gpu_processes_only_its_own_stripes) {
  const std::size_t g = granularity_;
  const std::size_t n = devices_.size();
  for (stripe_mode mode : {stripe_mode::round_robin, stripe_mode::contiguous}) {
    SCOPED_TRACE(mode == stripe_mode::round_robin ? "round_robin" : "contiguous");
    std::vector<std::unique_ptr<cuda_stream>> streams;
    std::vector<device_stream> buffer_streams;
    for (int d : devices_) {
      on_device selected(d);
      streams.push_back(std::make_unique<cuda_stream>());
      buffer_streams.push_back({d, streams.back()->get()});
    }
    striped_buffer buffer(devices_, (2 * n + 1) * 2 * g + g,
                          {.stripe_size = 2 * g, .mode = mode, .streams = buffer_streams});
    auto* words = static_cast<std::uint32_t*>(buffer.data());
    const std::uint64_t count = buffer.size() / 4;
    fill_words<<<blocks, threads>>>(words, count, 0);  // GPU 0, through the one pointer
    VMM_CUDA_CHECK(cudaGetLastError());
    VMM_CUDA_CHECK(cudaDeviceSynchronize());
    // All GPUs at once, each on its own stream, each on its own stripes.
    for (std::size_t i = 0; i < n; ++i) {
      on_device selected(devices_[i]);
      write_own_stripes<<<blocks, threads, 0, streams[i]->get()>>>(words, buffer.layout(),
                                                                   buffer.device_index(devices_[i]), 100);
      VMM_CUDA_CHECK(cudaGetLastError());
    }
    for (const auto& stream : streams) stream->synchronize();
    EXPECT_EQ(count_on(0,
                       [&](unsigned long long* c) {
                         count_misplaced<<<blocks, threads>>>(words, buffer.layout(), 100, c);
                       }),
              0u);
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_EQ(count_on(devices_[i],
                         [&](unsigned long long* c) {
                           count_own_mismatches<<<blocks, threads>>>(words, buffer.layout(),
                                                                     static_cast<std::uint32_t>(i), 100, c);
                         }),
                0u)
          << "gpu " << devices_[i];
    // The control: a check that expects other values does see them.
    EXPECT_GT(count_on(0,
                       [&](unsigned long long* c) {
                         count_misplaced<<<blocks, threads>>>(words, buffer.layout(), 7, c);
                       }),
              0u);
  }
}

TEST_F(multi_gpu_kernels, a_kernel_on_one_gpu_reads_what_another_wrote_with_peer_access_never_enabled) {
  // Make sure no peer access is on (a test before might have turned it on): VMM memory
  // needs none.
  for (int a : devices_)
    for (int b : devices_) {
      if (a == b) continue;
      on_device selected(a);
      const cudaError_t disabled = cudaDeviceDisablePeerAccess(b);
      if (disabled != cudaSuccess && disabled != cudaErrorPeerAccessNotEnabled) VMM_CUDA_CHECK(disabled);
      (void)cudaGetLastError();
    }
  const std::size_t g = granularity_;
  striped_buffer buffer(devices_, 8 * devices_.size() * g, {.stripe_size = g});
  auto* words = static_cast<std::uint32_t*>(buffer.data());
  const std::uint64_t count = buffer.size() / 4;
  for (int writer : devices_) {
    const int reader = devices_[(static_cast<std::size_t>(writer) + 1) % devices_.size()];
    const auto seed = static_cast<std::uint32_t>(writer + 1);
    {
      on_device selected(writer);
      write_words<<<blocks, threads>>>(words, count, seed);
      VMM_CUDA_CHECK(cudaGetLastError());
      VMM_CUDA_CHECK(cudaDeviceSynchronize());
    }
    EXPECT_EQ(count_on(reader,
                       [&](unsigned long long* c) {
                         count_mismatches<<<blocks, threads>>>(words, count, seed, c);
                       }),
              0u)
        << "gpu " << reader << " reading what gpu " << writer << " wrote";
  }
  // Still off: the reads above went through cuMemSetAccess alone.
  on_device selected(devices_[1]);
  EXPECT_EQ(cudaDeviceDisablePeerAccess(devices_[0]), cudaErrorPeerAccessNotEnabled);
  (void)cudaGetLastError();
}

TEST_F(multi_gpu_kernels, the_driver_places_each_stripe_on_the_gpu_the_layout_names) {
  const std::size_t g = granularity_;
  const allocation_probe probe;
  for (stripe_mode mode : {stripe_mode::round_robin, stripe_mode::contiguous}) {
    striped_buffer buffer(devices_, (3 * devices_.size() + 1) * g, {.stripe_size = g, .mode = mode});
    const auto* base = static_cast<const char*>(buffer.data());
    const stripe_layout& layout = buffer.layout();
    for (std::uint32_t d = 0; d < layout.device_count; ++d)
      for (std::uint64_t k = 0; k < layout.stripes_of(d); ++k) {
        const stripe_extent stripe = layout.stripe_of(d, k);
        EXPECT_EQ(probe.device_of(base + stripe.offset), buffer.devices()[d])
            << "stripe at " << stripe.offset;
        EXPECT_EQ(probe.device_of(base + stripe.offset + stripe.length - 1), buffer.devices()[d])
            << "end of the stripe at " << stripe.offset;
        EXPECT_EQ(buffer.device_of(stripe.offset), buffer.devices()[d]);
      }
  }
}

TEST_F(multi_gpu_kernels, one_copy_spans_every_gpu) {
  // cudaMemcpy through the one pointer, over stripes of every GPU in a single call.
  const std::size_t g = granularity_;
  striped_buffer buffer(devices_, 4 * devices_.size() * g, {.stripe_size = g});
  auto* words = static_cast<std::uint32_t*>(buffer.data());
  const std::uint64_t count = buffer.size() / 4;
  std::vector<std::uint32_t> host(count);
  for (std::uint64_t i = 0; i < count; ++i) host[i] = word_value(11, i);
  VMM_CUDA_CHECK(cudaMemcpy(words, host.data(), buffer.size(), cudaMemcpyDefault));
  EXPECT_EQ(
      count_on(devices_[1],
               [&](unsigned long long* c) { count_mismatches<<<blocks, threads>>>(words, count, 11, c); }),
      0u);
  write_words<<<blocks, threads>>>(words, count, 12);
  VMM_CUDA_CHECK(cudaGetLastError());
  VMM_CUDA_CHECK(cudaDeviceSynchronize());
  VMM_CUDA_CHECK(cudaMemcpy(host.data(), words, buffer.size(), cudaMemcpyDefault));
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < count; ++i) wrong += host[i] != word_value(12, i) ? 1 : 0;
  EXPECT_EQ(wrong, 0u);
}

// In a child: GPU 1, given `mode`, writes GPU 0's stripes with a kernel. 0 when the write
// went through and GPU 0 sees it; nonzero when it failed (a fault leaves the context
// unusable, hence the child). GPU 1 must be able to read in both modes.
int remote_kernel_write_in_child(access_mode mode) {
  try {
    if (cudaSetDevice(0) != cudaSuccess) return 7;
    const std::size_t g = provider_for(location::device(0))->capabilities().granularity;
    striped_buffer buffer(
        {0, 1}, 4 * g,
        {.stripe_size = g,
         .access = {{accessor::device(0), access_mode::read_write}, {accessor::device(1), mode}}});
    auto* words = static_cast<std::uint32_t*>(buffer.data());
    const std::uint64_t count = buffer.size() / 4;
    write_words<<<64, 256>>>(words, count, 21);
    if (cudaDeviceSynchronize() != cudaSuccess) return 9;
    if (cudaSetDevice(1) != cudaSuccess) return 7;
    unsigned long long* mismatches = nullptr;
    if (cudaMalloc(&mismatches, sizeof *mismatches) != cudaSuccess) return 7;
    if (cudaMemset(mismatches, 0, sizeof *mismatches) != cudaSuccess) return 7;
    count_mismatches<<<64, 256>>>(words, count, 21, mismatches);
    unsigned long long seen = 1;
    if (cudaMemcpy(&seen, mismatches, sizeof seen, cudaMemcpyDeviceToHost) != cudaSuccess || seen != 0)
      return 5;
    write_own_stripes<<<64, 256>>>(words, buffer.layout(), 0, 300);  // GPU 0's stripes, from GPU 1
    if (cudaDeviceSynchronize() != cudaSuccess) return 3;            // the write faulted
    if (cudaSetDevice(0) != cudaSuccess) return 7;
    std::vector<std::uint32_t> stripe(g / 4);
    if (cudaMemcpy(stripe.data(), words, g, cudaMemcpyDefault) != cudaSuccess) return 6;
    for (std::size_t i = 0; i < stripe.size(); ++i)
      if (stripe[i] != word_value(300, i)) return 6;
    return 0;
  } catch (const std::exception&) {
    return 8;
  }
}

TEST_F(multi_gpu_kernels, a_kernel_write_from_a_gpu_granted_read_only_access_fails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto failed = [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); };
  // The control: with read-write access the same kernel's writes land.
  EXPECT_EXIT(std::_Exit(remote_kernel_write_in_child(access_mode::read_write)), ::testing::ExitedWithCode(0),
              "");
  EXPECT_EXIT(std::_Exit(remote_kernel_write_in_child(access_mode::read_only)), failed, "");
}

TEST_F(multi_gpu_kernels, a_growable_buffer_spilled_across_gpus_is_one_pointer_for_kernels) {
  // GPU 0's pool capped at 4 chunks, then GPU 1: the buffer grows past GPU 0 in place.
  const std::size_t g = granularity_;
  auto first = chunk_pool::create(provider_for(location::device(0)), {.cap = 4 * g});
  auto second = chunk_pool::create(provider_for(location::device(1)));
  growable_buffer buffer(first, {.max_size = 32 * g, .policy = chunk_policy::fixed(g), .spill_to = {second}});
  buffer.resize(2 * g);
  void* const address = buffer.data();
  buffer.resize(10 * g);
  ASSERT_EQ(buffer.data(), address);
  const allocation_probe probe;
  for (std::size_t i = 0; i < 10; ++i)
    EXPECT_EQ(probe.device_of(static_cast<const char*>(buffer.data()) + i * g), i < 4 ? 0 : 1)
        << "chunk " << i;
  auto* words = static_cast<std::uint32_t*>(buffer.data());
  const std::uint64_t count = buffer.size() / 4;
  write_words<<<blocks, threads>>>(words, count, 41);  // GPU 0, over both GPUs' memory
  VMM_CUDA_CHECK(cudaGetLastError());
  VMM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(
      count_on(1, [&](unsigned long long* c) { count_mismatches<<<blocks, threads>>>(words, count, 41, c); }),
      0u);
  {
    on_device selected(1);
    write_words<<<blocks, threads>>>(words, count, 42);
    VMM_CUDA_CHECK(cudaGetLastError());
    VMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  EXPECT_EQ(
      count_on(0, [&](unsigned long long* c) { count_mismatches<<<blocks, threads>>>(words, count, 42, c); }),
      0u);
  synchronize_all();
}

}  // namespace
}  // namespace vmm::testing
