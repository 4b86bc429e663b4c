// A CUDA graph captures the vector's pointer once; the vector then grows by many chunks and
// the graph, replayed, still reads the vector: growth never moves data().

#include <numeric>
#include <vector>

#include "cuda_support.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/device_vector.hpp"

namespace vmm::testing {
namespace {

__global__ void copy_elements(const int* source, int* destination, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) destination[i] = source[i];
}

class cuda_graphs : public gpu_test {};

TEST_F(cuda_graphs, a_captured_pointer_stays_valid_while_the_vector_grows_by_many_chunks) {
  constexpr std::size_t n = 4096;
  cuda_stream stream;
  auto pool = chunk_pool::create(provider_for(location::device(0)));
  const std::size_t per_chunk = pool->granularity() / sizeof(int);
  device_vector<int> vector(pool, {.max_size = 128 * pool->granularity(), .stream = stream.get()});
  std::vector<int> before(n);
  std::iota(before.begin(), before.end(), 1);
  vector.append(std::span<const int>(before));
  const int* const address = vector.data();
  const std::size_t capacity = vector.capacity();
  device_array<int> out(n);

  VMM_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  copy_elements<<<8, 256, 0, stream.get()>>>(vector.data(), out.get(), n);
  const cudaError_t launched = cudaGetLastError();
  const cuda_graph graph(stream.get());
  cuda_check(launched, "copy_elements<<<8, 256>>> (captured)");
  graph.launch(stream.get());
  ASSERT_EQ(out.to_host(stream.get()), before);

  // Far past the capacity, a granule at a time: one new mapping after another.
  for (int i = 0; i < 48; ++i) vector.resize(vector.size() + per_chunk, element_init::zeroed);
  EXPECT_GE(vector.capacity(), 40 * capacity);
  EXPECT_GE(vector.chunk_count(), 10u);
  EXPECT_EQ(vector.data(), address);

  std::vector<int> after(n);
  for (std::size_t i = 0; i < n; ++i) after[i] = -3 * static_cast<int>(i) - 11;
  vector.copy_from_host(0, after);  // on the vector's stream, before the replay
  graph.launch(stream.get());
  EXPECT_EQ(out.to_host(stream.get()), after);
  // The growth itself was zeroed and the prefix kept.
  std::vector<int> tail(per_chunk);
  vector.copy_to_host(vector.size() - per_chunk, tail);
  EXPECT_EQ(tail, std::vector<int>(per_chunk, 0));
}

}  // namespace
}  // namespace vmm::testing
