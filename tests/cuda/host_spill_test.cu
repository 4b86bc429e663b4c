// A kernel reads and writes a device_vector across the boundary between its GPU part and its
// host part (a capped GPU pool, then pinned host memory): one pointer, every element checked.

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "cuda_support.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/device_vector.hpp"

namespace vmm::testing {
namespace {

__global__ void add_index(std::uint32_t* data, std::size_t count, std::uint32_t* wrong) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    if (data[i] != static_cast<std::uint32_t>(i) * 3u) atomicAdd(wrong, 1u);
    data[i] += static_cast<std::uint32_t>(i);
  }
}

class host_spill_kernels : public gpu_test {};

TEST_F(host_spill_kernels, a_kernel_reads_and_writes_across_the_gpu_and_host_parts) {
  const std::size_t g = provider_for(location::device(0))->capabilities().granularity;
  std::shared_ptr<chunk_pool> device;
  std::shared_ptr<chunk_pool> host;
  try {
    device = chunk_pool::create(provider_for(location::device(0)), {.cap = 3 * g});
    host = chunk_pool::create(provider_for(location::pinned_host(0)));
  } catch (const std::exception& error) {
    GTEST_SKIP() << "no pinned host memory through the driver here: " << error.what();
  }
  device_vector<std::uint32_t> vector(device, {.max_size = 16 * g, .spill_to = {host}});
  std::vector<std::uint32_t> values(7 * g / sizeof(std::uint32_t));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::uint32_t>(i) * 3u;
  vector.append(values);
  ASSERT_EQ(device->statistics().used_current, 3 * g);
  ASSERT_GT(host->statistics().used_current, 0u);
  std::uint32_t* wrong = nullptr;
  VMM_CUDA_CHECK(cudaMallocManaged(&wrong, sizeof *wrong));
  *wrong = 0;
  add_index<<<64, 256, 0, vector.stream().get()>>>(vector.data(), vector.size(), wrong);
  VMM_CUDA_CHECK(cudaGetLastError());
  const std::vector<std::uint32_t> back = vector.to_host();
  EXPECT_EQ(*wrong, 0u);
  for (std::size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(back[i], static_cast<std::uint32_t>(i) * 4u) << "element " << i << " (byte " << i * 4 << ")";
  VMM_CUDA_CHECK(cudaFree(wrong));
}

}  // namespace
}  // namespace vmm::testing
