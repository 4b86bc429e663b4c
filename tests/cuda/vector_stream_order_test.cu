// device_vector queues its fills and copies on its own stream. A kernel queued on that
// stream before (while a gate holds the stream) runs first; one queued after reads the new
// contents. Were the fill or copy on any other stream, it would run at once, the earlier
// kernel would overwrite it, and the reader would see that kernel's pattern instead.

#include <vector>

#include "cuda_support.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/device_vector.hpp"

namespace vmm::testing {
namespace {

__global__ void fill_with(int* target, std::size_t n, int value) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) target[i] = value;
}

__global__ void copy_elements(const int* source, int* destination, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) destination[i] = source[i];
}

class vector_stream_order : public gpu_test {
 protected:
  void SetUp() override {
    gpu_test::SetUp();
    if (IsSkipped()) return;
    pool_ = chunk_pool::create(provider_for(location::device(0)));
    n_ = 3 * pool_->granularity() / sizeof(int);
    load_kernel(fill_with);
    load_kernel(copy_elements);
  }
  std::shared_ptr<chunk_pool> pool_;
  std::size_t n_ = 0;
};

TEST_F(vector_stream_order, a_zeroed_resize_is_ordered_between_kernels_on_the_vectors_stream) {
  cuda_stream stream;
  device_vector<int> vector(pool_, {.max_size = 16 * pool_->granularity(), .stream = stream.get()});
  vector.reserve(n_);                      // mapped now: nothing below maps memory while the stream is held
  vector.resize(1, element_init::zeroed);  // a first fill before the gate, as for kernels
  vector.clear();
  stream.synchronize();
  device_array<int> out(n_);
  {
    stream_gate gate(stream.get());
    fill_with<<<64, 256, 0, stream.get()>>>(vector.data(), n_, 0x5a5a5a5a);
    VMM_CUDA_CHECK(cudaGetLastError());
    vector.resize(n_, element_init::zeroed);
    copy_elements<<<64, 256, 0, stream.get()>>>(vector.data(), out.get(), n_);
    VMM_CUDA_CHECK(cudaGetLastError());
  }
  EXPECT_EQ(out.to_host(stream.get()), std::vector<int>(n_, 0));
}

TEST_F(vector_stream_order, an_append_is_ordered_between_kernels_on_the_vectors_stream) {
  cuda_stream stream;
  device_vector<int> vector(pool_, {.max_size = 16 * pool_->granularity(), .stream = stream.get()});
  vector.reserve(n_);
  device_array<int> out(n_);
  pinned_array<int> source(n_);  // page-locked: the copy is queued, not staged at once
  std::vector<int> expected(n_);
  for (std::size_t i = 0; i < n_; ++i) expected[i] = source.span()[i] = 7 * static_cast<int>(i) + 1;
  {
    stream_gate gate(stream.get());
    fill_with<<<64, 256, 0, stream.get()>>>(vector.data(), n_, -1);
    VMM_CUDA_CHECK(cudaGetLastError());
    vector.append(std::span<const int>(source.span()));
    copy_elements<<<64, 256, 0, stream.get()>>>(vector.data(), out.get(), n_);
    VMM_CUDA_CHECK(cudaGetLastError());
  }
  EXPECT_EQ(out.to_host(stream.get()), expected);
  EXPECT_EQ(vector.to_host(), expected);
}

}  // namespace
}  // namespace vmm::testing
