// thrust algorithms over begin()/end() of a device_vector spanning several chunks, on the
// vector's stream, compared with the same work done on the host.

#include <thrust/execution_policy.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda_support.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/device_vector.hpp"

namespace vmm::testing {
namespace {

class thrust_algorithms : public gpu_test {};

TEST_F(thrust_algorithms, sequence_reduce_and_sort_run_across_chunk_boundaries) {
  cuda_stream stream;
  auto pool = chunk_pool::create(provider_for(location::device(0)));
  const std::size_t g = pool->granularity();
  device_vector<int> vector(pool,
                            {.max_size = 64 * g, .policy = chunk_policy::fixed(g), .stream = stream.get()});
  const std::size_t n = 5 * g / sizeof(int) + 123;
  vector.resize(n, element_init::uninitialized);
  ASSERT_EQ(vector.chunk_count(), 6u);
  const auto on_stream = thrust::cuda::par.on(stream.get());

  thrust::sequence(on_stream, vector.begin(), vector.end(), -7);
  std::vector<int> expected(n);
  std::iota(expected.begin(), expected.end(), -7);
  EXPECT_EQ(vector.to_host(), expected);

  const long long sum = thrust::reduce(on_stream, vector.begin(), vector.end(), 0LL);
  EXPECT_EQ(sum, std::accumulate(expected.begin(), expected.end(), 0LL));

  // Scrambled, with duplicates and negatives; then one more chunk's worth appended.
  std::vector<int> scrambled(n + g / sizeof(int));
  for (std::size_t i = 0; i < scrambled.size(); ++i)
    scrambled[i] = static_cast<int>((i * 2654435761u) % 1000003u) - 500000;
  vector.copy_from_host(0, std::span<const int>(scrambled).first(n));
  vector.append(std::span<const int>(scrambled).subspan(n));
  EXPECT_EQ(vector.chunk_count(), 7u);
  thrust::sort(on_stream, vector.begin(), vector.end());
  std::sort(scrambled.begin(), scrambled.end());
  EXPECT_EQ(vector.to_host(), scrambled);
}

}  // namespace
}  // namespace vmm::testing
