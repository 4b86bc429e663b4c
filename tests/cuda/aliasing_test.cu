// Virtual aliasing seen from kernels, on GPU memory and on pinned host memory: a kernel reads
// through one view what an earlier kernel wrote through another, a kernel write through a
// read-only view fails, kernels read ring windows across the wrap, and kernels produce and
// consume records in a ring buffer. Every test skips with the reason where there is no GPU.
//
// The coherency rule (vmm/chunk_view.hpp): accesses through two aliases are coherent in
// stream order across kernel launches, not within one grid. Every test here writes through
// one alias in one kernel and reads through another in a later kernel on the same stream.

#include <sys/wait.h>

#include <cstdint>
#include <vector>

#include "../provider_kinds.hpp"
#include "cuda_support.hpp"
#include "vmm/chunk_view.hpp"
#include "vmm/error.hpp"
#include "vmm/ring_buffer.hpp"

namespace vmm::testing {
namespace {

__host__ __device__ std::uint32_t word_at(std::uint32_t seed, std::uint64_t index) {
  std::uint64_t x = (index + 1) * 0x9e3779b97f4a7c15ull ^ (std::uint64_t{seed} << 32);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<std::uint32_t>(x);
}

__global__ void write_words(std::uint32_t* words, std::uint64_t count, std::uint32_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    words[i] = word_at(seed, i);
}

// Counts the words of `words[i]` that differ from word_at(seed, expected_index(i)), where the
// view's word i is the source's word map[i / words_per_chunk] * words_per_chunk + i % ...
__global__ void count_mismatches(const std::uint32_t* words, std::uint64_t count, std::uint32_t seed,
                                 const std::uint32_t* chunk_map, std::uint64_t words_per_chunk,
                                 unsigned long long* mismatches) {
  unsigned long long local = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t source = chunk_map[i / words_per_chunk] * words_per_chunk + i % words_per_chunk;
    if (words[i] != word_at(seed, source)) ++local;
  }
  if (local != 0) atomicAdd(mismatches, local);
}

using gpu_memory_kinds = ::testing::Types<device_memory, pinned_host_memory>;

template <class Kind>
class gpu_aliasing : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->IsSkipped()) return;
    // The runtime on GPU 0's primary context, the one vmm's driver layer uses.
    VMM_CUDA_CHECK(cudaSetDevice(0));
    VMM_CUDA_CHECK(cudaFree(nullptr));
    pool_ = chunk_pool::create(this->provider_);
  }
  // Runs count_mismatches over a view whose chunk i is the source's chunk map[i].
  unsigned long long mismatches(const void* view, std::size_t bytes, std::uint32_t seed,
                                const std::vector<std::uint32_t>& map) {
    device_array<std::uint32_t> device_map(map.size());
    device_array<unsigned long long> count(1);
    VMM_CUDA_CHECK(
        cudaMemcpy(device_map.get(), map.data(), map.size() * sizeof map[0], cudaMemcpyHostToDevice));
    VMM_CUDA_CHECK(cudaMemset(count.get(), 0, sizeof(unsigned long long)));
    count_mismatches<<<264, 256>>>(static_cast<const std::uint32_t*>(view), bytes / 4, seed, device_map.get(),
                                   this->granularity_ / 4, count.get());
    VMM_CUDA_CHECK(cudaGetLastError());
    return count.to_host(nullptr).front();
  }
  growable_buffer make_buffer(std::size_t chunks) {
    growable_buffer buffer(
        pool_, {.max_size = chunks * this->granularity_, .policy = chunk_policy::fixed(this->granularity_)});
    buffer.resize(chunks * this->granularity_);
    return buffer;
  }

  std::shared_ptr<chunk_pool> pool_;
};
TYPED_TEST_SUITE(gpu_aliasing, gpu_memory_kinds, memory_kind_names);

TYPED_TEST(gpu_aliasing, a_later_kernel_reads_through_one_view_what_a_kernel_wrote_through_another) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(4);
  const std::size_t order[] = {2, 0, 3, 1};
  chunk_view shuffled = permute(buffer, order);
  const std::vector<std::uint32_t> identity = {0, 1, 2, 3};
  const std::vector<std::uint32_t> as_shuffled = {2, 0, 3, 1};

  // Written through the buffer, read through the permuted view by the next kernel.
  write_words<<<264, 256>>>(static_cast<std::uint32_t*>(buffer.data()), 4 * g / 4, 1);
  VMM_CUDA_CHECK(cudaGetLastError());
  EXPECT_EQ(this->mismatches(shuffled.data(), 4 * g, 1, as_shuffled), 0u);
  // Written through the view, read through the buffer (and through a read-only alias).
  write_words<<<264, 256>>>(static_cast<std::uint32_t*>(shuffled.data()), 4 * g / 4, 2);
  VMM_CUDA_CHECK(cudaGetLastError());
  // Buffer chunk order[i] holds what the view's chunk i got.
  std::vector<std::uint32_t> inverse(4);
  for (std::uint32_t i = 0; i < 4; ++i) inverse[order[i]] = i;
  EXPECT_EQ(this->mismatches(buffer.data(), 4 * g, 2, inverse), 0u);
  chunk_view reader = alias(buffer, 0, 4 * g, access_mode::read_only);
  EXPECT_EQ(this->mismatches(reader.data(), 4 * g, 2, inverse), 0u);
  // The control: the check does see a difference.
  EXPECT_GT(this->mismatches(buffer.data(), 4 * g, 2, identity), 0u);
  VMM_CUDA_CHECK(cudaDeviceSynchronize());
}

// In a child: a kernel writes through a view with `mode`. 0 when the write went through and
// is seen through the buffer; nonzero when it failed (the context is then unusable, hence
// the child).
template <class Kind>
int kernel_write_in_child(access_mode mode) {
  std::string reason;
  auto provider = provider_or_skip_reason<Kind>(&reason);
  if (provider == nullptr) return 4;
  const std::size_t g = provider->capabilities().granularity;
  auto pool = chunk_pool::create(provider);
  growable_buffer buffer(pool, {.max_size = g, .policy = chunk_policy::fixed(g)});
  buffer.resize(g);
  chunk_view view = alias(buffer, 0, g, mode);
  if (cudaSetDevice(0) != cudaSuccess) return 7;
  write_words<<<64, 256>>>(static_cast<std::uint32_t*>(view.data()), g / 4, 3);
  if (cudaDeviceSynchronize() != cudaSuccess) return 3;
  std::vector<std::uint32_t> words(g / 4);
  if (cudaMemcpy(words.data(), buffer.data(), g, cudaMemcpyDefault) != cudaSuccess) return 5;
  for (std::size_t i = 0; i < words.size(); ++i)
    if (words[i] != word_at(3, i)) return 6;
  return 0;
}

TYPED_TEST(gpu_aliasing, a_kernel_write_through_a_read_only_view_fails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto failed = [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); };
  EXPECT_EXIT(std::_Exit(kernel_write_in_child<TypeParam>(access_mode::read_write)),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(std::_Exit(kernel_write_in_child<TypeParam>(access_mode::read_only)), failed, "");
}

// Reads [start, start + length) of the ring through one pointer into `out`.
__global__ void read_window(const std::byte* ring, std::uint64_t start, std::uint64_t length,
                            std::byte* out) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < length;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    out[i] = ring[start + i];
}

TYPED_TEST(gpu_aliasing, kernels_read_windows_across_the_wrap_through_plain_pointers) {
  const std::size_t g = this->granularity_;
  const std::size_t capacity = 3 * g;
  ring_buffer ring(this->pool_, capacity);
  // A kernel writes the first copy; later kernels read windows that reach into the second.
  write_words<<<264, 256>>>(reinterpret_cast<std::uint32_t*>(ring.data()), capacity / 4, 4);
  VMM_CUDA_CHECK(cudaGetLastError());
  device_array<std::byte> out(capacity);
  std::vector<std::uint32_t> expected(capacity / 4);
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = word_at(4, i);
  const auto* expected_bytes = reinterpret_cast<const std::byte*>(expected.data());
  for (std::size_t start : {capacity - 4, capacity - g / 2 - 12, g + 4096, std::size_t{1}}) {
    const std::size_t length = capacity;  // every window as long as the ring: all cross the wrap
    read_window<<<264, 256>>>(ring.data(), start, length, out.get());
    VMM_CUDA_CHECK(cudaGetLastError());
    const std::vector<std::byte> got = out.to_host(nullptr);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < length; ++i)
      if (got[i] != expected_bytes[(start + i) % capacity]) ++wrong;
    EXPECT_EQ(wrong, 0u) << "window from " << start;
  }
}

// ---- records through a ring, produced and consumed by kernels ----------------------------
// A record: {length, id} then payload bytes payload_byte(id, j); lengths vary so records
// straddle the wrap point. One block per kernel: thread 0 drives the protocol, the block
// writes and checks the payload.

__host__ __device__ std::uint32_t record_length(std::uint32_t id, std::uint32_t max_payload) {
  return 8 + word_at(99, id) % max_payload;
}
__host__ __device__ std::byte payload_byte(std::uint32_t id, std::uint32_t j) {
  return static_cast<std::byte>((id * 131u + j * 7u + (j >> 8)) & 0xffu);
}

__global__ void produce(ring_buffer_view ring, std::uint32_t first, std::uint32_t end,
                        std::uint32_t max_payload, std::uint32_t* next, std::uint32_t* straddled) {
  __shared__ std::byte* place;
  for (std::uint32_t id = first; id < end; ++id) {
    const std::uint32_t length = record_length(id, max_payload);
    if (threadIdx.x == 0) {
      place = ring.reserve(length);
      if (place != nullptr && *ring.head % ring.capacity + length > ring.capacity) ++*straddled;
    }
    __syncthreads();
    std::byte* const target = place;
    __syncthreads();
    if (target == nullptr) {
      if (threadIdx.x == 0) *next = id;
      return;
    }
    if (threadIdx.x == 0) {
      const std::uint32_t header[2] = {length, id};
      memcpy(target, header, sizeof header);
    }
    for (std::uint32_t j = threadIdx.x; j < length - 8; j += blockDim.x) target[8 + j] = payload_byte(id, j);
    __syncthreads();  // the whole record is written before thread 0 publishes it
    if (threadIdx.x == 0) {
      __threadfence();
      ring.publish(length);
    }
  }
  if (threadIdx.x == 0) *next = end;
}

// results[id] = length when the record was whole and right, 0xffffffff when it was wrong.
__global__ void consume(ring_buffer_view ring, std::uint32_t* results, std::uint32_t result_count) {
  __shared__ const std::byte* place;
  __shared__ std::uint32_t header[2];
  __shared__ int bad;
  for (;;) {
    if (threadIdx.x == 0) {
      place = ring.peek(8);
      if (place != nullptr) {
        memcpy(header, place, sizeof header);
        place = ring.peek(header[0]);
      }
      bad = 0;
    }
    __syncthreads();
    const std::byte* const source = place;
    const std::uint32_t length = header[0];
    const std::uint32_t id = header[1];
    if (source == nullptr) return;
    for (std::uint32_t j = threadIdx.x; j < length - 8; j += blockDim.x)
      if (source[8 + j] != payload_byte(id, j)) bad = 1;
    __syncthreads();
    if (threadIdx.x == 0) {
      if (id < result_count) results[id] = bad ? 0xffffffffu : length;
      ring.consume(length);
    }
    __syncthreads();
  }
}

TYPED_TEST(gpu_aliasing, kernels_produce_and_consume_records_across_the_wrap) {
  const std::size_t g = this->granularity_;
  ring_buffer ring(this->pool_, g);
  const std::uint32_t records = 600;
  const std::uint32_t max_payload = static_cast<std::uint32_t>(g / 6);
  device_array<std::uint32_t> results(records);
  device_array<std::uint32_t> counters(2);  // [0]: next record to produce, [1]: records straddling
  VMM_CUDA_CHECK(cudaMemset(results.get(), 0, records * sizeof(std::uint32_t)));
  VMM_CUDA_CHECK(cudaMemset(counters.get(), 0, 2 * sizeof(std::uint32_t)));
  std::uint32_t next = 0;
  int rounds = 0;
  while (next < records && rounds < 10 * static_cast<int>(records)) {
    // Each kernel starts after the last one ended: the records cross between aliases only
    // across launches, as the coherency rule asks.
    produce<<<1, 256>>>(ring.view(), next, records, max_payload, counters.get(), counters.get() + 1);
    consume<<<1, 256>>>(ring.view(), results.get(), records);
    VMM_CUDA_CHECK(cudaGetLastError());
    VMM_CUDA_CHECK(cudaMemcpy(&next, counters.get(), sizeof next, cudaMemcpyDeviceToHost));
    ++rounds;
  }
  const std::vector<std::uint32_t> got = results.to_host(nullptr);
  const std::uint32_t straddled = counters.to_host(nullptr)[1];
  ASSERT_EQ(next, records);
  std::uint64_t bytes = 0;
  for (std::uint32_t id = 0; id < records; ++id) {
    ASSERT_EQ(got[id], record_length(id, max_payload)) << "record " << id;
    bytes += got[id];
  }
  EXPECT_GT(straddled, 10u);
  EXPECT_EQ(ring.head(), bytes);
  EXPECT_EQ(ring.tail(), bytes);
}

}  // namespace
}  // namespace vmm::testing
