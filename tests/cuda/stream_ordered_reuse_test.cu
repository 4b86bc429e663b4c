// Stream order on the GPU, made deterministic by holding a stream at a host function (a
// stream_gate) for as long as the test needs: a chunk given back on a busy stream goes to
// another stream only once that stream has passed the give-back, and a buffer shrunk on a
// busy stream keeps its chunks mapped until the stream has passed the shrink.

#include <vector>

#include "cuda_support.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/growable_buffer.hpp"

namespace vmm::testing {
namespace {

__global__ void write_and_copy(int* target, int* out, std::size_t n, int base) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    target[i] = base + static_cast<int>(i);
    out[i] = target[i];
  }
}

class stream_ordered_reuse : public gpu_test {};

TEST_F(stream_ordered_reuse, a_chunk_given_back_on_a_busy_stream_waits_for_it_before_other_streams_get_it) {
  cuda_stream a;
  cuda_stream b;
  auto pool = chunk_pool::create(provider_for(location::device(0)));
  const std::size_t g = pool->granularity();
  pooled_chunk chunk = pool->acquire(g, a.get());
  const physical_handle handle = chunk.memory().get();

  stream_gate gate(a.get());  // a is held here until gate.open()
  chunk.give_back(a.get());   // so a has not passed this give-back

  pooled_chunk for_b = pool->acquire(g, b.get());  // held to the end: b must not get `handle`
  EXPECT_NE(for_b.memory().get(), handle);
  EXPECT_EQ(pool->statistics().chunks_created, 2u);
  EXPECT_FALSE(pool->acquire_idle(g, b.get()));     // nothing idle that b may use
  EXPECT_FALSE(pool->acquire_idle(g, any_stream));  // nor that any stream may use

  pooled_chunk for_a = pool->acquire(g, a.get());  // a's own later work is ordered after
  EXPECT_EQ(for_a.memory().get(), handle);
  for_a.give_back(a.get());  // again behind the gate
  EXPECT_FALSE(pool->acquire_idle(g, b.get()));

  gate.open();
  a.synchronize();
  pooled_chunk later = pool->acquire(g, b.get());
  EXPECT_EQ(later.memory().get(), handle);
  const pool_statistics s = pool->statistics();
  EXPECT_EQ(s.chunks_created, 2u);
  EXPECT_EQ(s.chunks_reused, 2u);
}

TEST_F(stream_ordered_reuse, a_shrink_on_a_busy_stream_keeps_the_chunks_mapped_until_the_stream_passes) {
  cuda_stream a;
  auto pool = chunk_pool::create(provider_for(location::device(0)));
  const std::size_t g = pool->granularity();
  growable_buffer buffer(pool, {.max_size = 8 * g, .policy = chunk_policy::fixed(g), .stream = a.get()});
  buffer.resize(4 * g);
  ASSERT_EQ(buffer.chunk_count(), 4u);
  constexpr std::size_t n = 1 << 16;
  device_array<int> out(n);
  int* const last_chunk = reinterpret_cast<int*>(static_cast<char*>(buffer.data()) + 3 * g);
  load_kernel(write_and_copy);

  stream_gate gate(a.get());
  // Queued behind the gate: runs after the shrink below, in the chunk the shrink retires.
  write_and_copy<<<32, 256, 0, a.get()>>>(last_chunk, out.get(), n, 1000);
  VMM_CUDA_CHECK(cudaGetLastError());
  buffer.resize(g);
  EXPECT_EQ(buffer.capacity(), g);
  EXPECT_EQ(buffer.chunk_count(), 4u);  // retired, still mapped
  buffer.collect_retired(false);
  EXPECT_EQ(buffer.chunk_count(), 4u);  // a has not passed the shrink
  EXPECT_EQ(pool->statistics().used_current, 4 * g);

  gate.open();
  buffer.collect_retired(true);  // waits for a to pass the shrink, then unmaps
  EXPECT_EQ(buffer.chunk_count(), 1u);
  EXPECT_EQ(pool->statistics().used_current, g);
  a.synchronize();  // throws if the kernel touched unmapped memory
  std::vector<int> expected(n);
  for (std::size_t i = 0; i < n; ++i) expected[i] = 1000 + static_cast<int>(i);
  EXPECT_EQ(out.to_host(a.get()), expected);
}

}  // namespace
}  // namespace vmm::testing
