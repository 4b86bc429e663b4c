// replicated_buffer seen from kernels: a kernel on every GPU reads its own replica through
// replica_view (and the driver says the replica lives on that GPU); updates from host memory
// and from device memory of either GPU reach every replica in stream order; growth keeps
// every address; the owner's kernel writes are published; a kernel write into a read-only
// replica fails (in a child process). Tests skip with the reason without a GPU, and those
// that need two without two that reach each other's memory.

#include <cuda.h>
#include <sys/wait.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/error.hpp"
#include "vmm/replicated_buffer.hpp"

namespace vmm::testing {
namespace {

__host__ __device__ std::uint32_t word_of(std::uint32_t seed, std::uint64_t index) {
  std::uint64_t x = (index + 1) * 0x9e3779b97f4a7c15ull ^ (std::uint64_t{seed} << 32);
  x ^= x >> 29;
  return static_cast<std::uint32_t>(x) | 1u;
}

__global__ void write_words(std::uint32_t* words, std::uint64_t count, std::uint32_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    words[i] = word_of(seed, i);
}

// One kernel source for every GPU: the view says which replica is this GPU's.
__global__ void count_mismatches(vmm::replica_view<std::uint32_t> view, std::uint64_t first,
                                 std::uint64_t count, std::uint32_t seed, unsigned long long* mismatches) {
  unsigned long long local = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    if (view[first + i] != word_of(seed, first + i)) ++local;
  if (local != 0) atomicAdd(mismatches, local);
}

std::vector<std::uint32_t> words(std::uint32_t seed, std::size_t count, std::size_t first = 0) {
  std::vector<std::uint32_t> result(count);
  for (std::size_t i = 0; i < count; ++i) result[i] = word_of(seed, first + i);
  return result;
}

update_source host_words(const std::vector<std::uint32_t>& values) {
  return update_source::host(std::as_bytes(std::span(values)));
}

class replicated_kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "no GPU here: " << why;
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    if (counted == cudaErrorInsufficientDriver)
      GTEST_SKIP() << "the driver is older than the CUDA runtime these tests were built with";
    VMM_CUDA_CHECK(counted);
    for (int d = 0; d < count && d < replica_table_size; ++d) {
      bool reachable = true;
      for (int e : devices_) reachable = reachable && can_access_peer(d, e) && can_access_peer(e, d);
      if (!reachable) continue;
      on_device selected(d);
      VMM_CUDA_CHECK(cudaFree(nullptr));  // the primary context, which vmm's driver layer uses too
      devices_.push_back(d);
      locations_.push_back(location::device(d));
    }
  }
  // GTEST_SKIP() returns from the function it is in: a test asks this and skips itself.
  [[nodiscard]] bool fewer_than_two() const { return devices_.size() < 2; }
  // Mismatches a kernel on every GPU finds in its replica, after buffer's last update.
  std::vector<unsigned long long> mismatches_everywhere(const replicated_buffer& buffer, std::uint32_t seed,
                                                        std::uint64_t first, std::uint64_t count) {
    std::vector<unsigned long long> result;
    const auto view = buffer.view<std::uint32_t>();
    for (int d : devices_) {
      on_device selected(d);
      cuda_stream stream;
      buffer.enqueue_wait(location::device(d), stream.get());  // the visibility rule
      device_array<unsigned long long> found(1);
      VMM_CUDA_CHECK(cudaMemsetAsync(found.get(), 0, sizeof(unsigned long long), stream.get()));
      count_mismatches<<<132, 256, 0, stream.get()>>>(view.on(d), first, count, seed, found.get());
      VMM_CUDA_CHECK(cudaGetLastError());
      result.push_back(found.to_host(stream.get())[0]);
    }
    return result;
  }

  std::vector<int> devices_;
  std::vector<location> locations_;
};

TEST_F(replicated_kernels, a_kernel_on_every_gpu_reads_its_own_replica) {
  replicated_buffer buffer(locations_, {.max_size = std::size_t{1} << 30});
  const auto values = words(1, std::size_t{3} << 20);
  {
    on_device selected(devices_.front());
    cuda_stream stream;
    buffer.append(host_words(values), stream.get());
    stream.synchronize();
  }
  for (unsigned long long found : mismatches_everywhere(buffer, 1, 0, values.size())) EXPECT_EQ(found, 0u);
  for (int d : devices_) {
    cudaPointerAttributes attributes{};
    VMM_CUDA_CHECK(cudaPointerGetAttributes(&attributes, buffer.data(location::device(d))));
    EXPECT_EQ(attributes.device, d) << "the replica read on gpu " << d << " lives elsewhere";
  }
}

TEST_F(replicated_kernels, updates_from_the_host_and_from_either_gpu_reach_every_replica) {
  if (fewer_than_two())
    GTEST_SKIP() << "needs 2 GPUs that reach each other; this machine has " << devices_.size();
  replicated_buffer buffer(locations_, {.max_size = std::size_t{1} << 30});
  const std::size_t count = std::size_t{1} << 20;
  buffer.resize(count * 4);
  for (int source : {devices_[0], devices_[1]}) {
    on_device selected(source);
    cuda_stream stream;
    device_array<std::uint32_t> staged(count);
    write_words<<<132, 256, 0, stream.get()>>>(staged.get(), count, 10u + static_cast<unsigned>(source));
    buffer.update(0, count * 4, update_source::device(source, staged.get(), count * 4), stream.get());
    stream.synchronize();
    for (unsigned long long found :
         mismatches_everywhere(buffer, 10u + static_cast<unsigned>(source), 0, count))
      EXPECT_EQ(found, 0u) << "after an update from gpu " << source;
  }
  const auto part = words(30, count / 2, count / 4);
  {
    on_device selected(devices_.front());
    cuda_stream stream;
    buffer.update(count, part.size() * 4, host_words(part), stream.get());
    stream.synchronize();
  }
  for (unsigned long long found : mismatches_everywhere(buffer, 30, count / 4, count / 2))
    EXPECT_EQ(found, 0u);
}

TEST_F(replicated_kernels, growth_keeps_every_address_and_kernels_read_every_part) {
  replicated_buffer buffer(locations_, {.max_size = std::size_t{4} << 30});
  std::vector<const void*> addresses;
  std::size_t total = 0;
  on_device selected(devices_.front());
  cuda_stream stream;
  for (int step = 0; step < 5; ++step) {
    const auto part = words(40, (std::size_t{1} << 18) << step, total);
    buffer.append(host_words(part), stream.get());
    total += part.size();
    if (addresses.empty())
      for (const location& where : locations_) addresses.push_back(buffer.data(where));
    for (std::size_t i = 0; i < locations_.size(); ++i) EXPECT_EQ(buffer.data(locations_[i]), addresses[i]);
  }
  stream.synchronize();
  for (unsigned long long found : mismatches_everywhere(buffer, 40, 0, total)) EXPECT_EQ(found, 0u);
}

TEST_F(replicated_kernels, the_owners_kernel_writes_are_published_to_every_replica) {
  const location owner = locations_.back();
  replicated_buffer buffer(locations_, {.max_size = std::size_t{1} << 30, .owner = owner});
  const std::size_t count = std::size_t{1} << 20;
  buffer.resize(count * 4);
  on_device selected(owner.id);
  cuda_stream stream;
  write_words<<<132, 256, 0, stream.get()>>>(static_cast<std::uint32_t*>(buffer.owner_data()), count, 50);
  buffer.publish(0, count * 4, stream.get());
  stream.synchronize();
  for (unsigned long long found : mismatches_everywhere(buffer, 50, 0, count)) EXPECT_EQ(found, 0u);
}

// In a child: a kernel on GPU 0 writes its read-only replica (or, the control, the owner's
// replica). 0 when the write landed.
int kernel_write_in_child(bool owner) {
  try {
    if (cudaSetDevice(0) != cudaSuccess) return 7;
    replicated_buffer buffer({location::device(0)},
                             {.max_size = std::size_t{64} << 20,
                              .owner = owner ? std::optional<location>(location::device(0)) : std::nullopt});
    buffer.resize(std::size_t{1} << 20);
    auto* target = static_cast<std::uint32_t*>(const_cast<void*>(buffer.data(location::device(0))));
    write_words<<<64, 256>>>(target, (std::size_t{1} << 20) / 4, 60);
    if (cudaDeviceSynchronize() != cudaSuccess) return 3;  // the write faulted
    std::vector<std::uint32_t> back(16);
    if (cudaMemcpy(back.data(), target, 64, cudaMemcpyDefault) != cudaSuccess) return 6;
    return back == words(60, 16) ? 0 : 5;
  } catch (const std::exception&) {
    return 8;
  }
}

TEST_F(replicated_kernels, a_kernel_write_into_a_read_only_replica_fails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto failed = [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); };
  EXPECT_EXIT(std::_Exit(kernel_write_in_child(true)), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(std::_Exit(kernel_write_in_child(false)), failed, "");
}

}  // namespace
}  // namespace vmm::testing
