// append_view and append_from_kernel on GPU 0: kernels whose lanes diverge, in blocks whose
// last warp is partial, push through every form of the view (and both kinds of atomics);
// every element must be in the vector exactly once, however often the capacity ran out and
// windows were relaunched. An empty result, a launch the runtime refuses, and faults in the
// caller's kernel (a trap, an illegal address: each in a process of its own, since a fault
// leaves the CUDA context unusable) must leave the vector as it was and take no memory.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_support.hpp"
#include "vmm/append.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/error.hpp"

namespace vmm::testing {
namespace {

__host__ __device__ std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return x ^ (x >> 33);
}

// Input i produces elements_of(i) elements (0 to 3), i * 4 + j: all distinct.
__host__ __device__ unsigned elements_of(std::uint64_t i) {
  return static_cast<unsigned>(mix(i) % 4);
}
__host__ __device__ std::uint32_t element(std::uint64_t i, unsigned j) {
  return static_cast<std::uint32_t>(i * 4 + j);
}

constexpr int blocks = 37;
constexpr int threads = 100;  // three warps and a partial one of 4 lanes

// Neighbouring lanes take different branches (i % 4) and push different numbers of
// elements, through each form of the view.
template <append_atomics Atomics>
__global__ void push_divergent(std::uint64_t first, std::uint64_t n, append_view<std::uint32_t> view,
                               bool stop_when_overflowed) {
  if (stop_when_overflowed && view.overflowed()) return;
  const std::uint64_t end = view.limit(n);
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = first + std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < end; i += stride) {
    const unsigned count = elements_of(i);
    const std::uint32_t values[3] = {element(i, 0), element(i, 1), element(i, 2)};
    switch (i % 4) {
      case 0:
        for (unsigned j = 0; j < count; ++j) view.push<Atomics>(values[j]);
        break;
      case 1:
        view.push<Atomics>(values, count);
        break;
      case 2:
        view.push_selected<Atomics>(values, (1u << count) - 1);
        break;
      default:
        if (count > 0) {
          view.push<Atomics>(values[0]);
          if (count > 1) view.push<Atomics>(values + 1, count - 1);
        }
        break;
    }
  }
}

// The block-wide form: every thread of a block of block_form_threads calls
// push_selected_block for each tile of inputs, those past the end with nothing to keep.
constexpr int block_form_threads = 96;

__global__ void __launch_bounds__(block_form_threads)
    push_block_divergent(std::uint64_t first, std::uint64_t n, append_view<std::uint32_t> view,
                         bool stop_when_overflowed) {
  __shared__ append_block_storage<std::uint32_t, block_form_threads, 3> storage;
  if (stop_when_overflowed && __syncthreads_or(view.overflowed())) return;
  const std::uint64_t end = view.limit(n);
  for (std::uint64_t tile = first + std::uint64_t{blockIdx.x} * block_form_threads; tile < end;
       tile += std::uint64_t{gridDim.x} * block_form_threads) {
    const std::uint64_t i = tile + threadIdx.x;
    const std::uint32_t values[3] = {element(i, 0), element(i, 1), element(i, 2)};
    const std::uint32_t keep = i < end ? (1u << elements_of(i)) - 1 : 0;
    view.push_selected_block(values, keep, storage);
  }
}

__global__ void trap_kernel(append_view<std::uint32_t> view) {
  view.push(1u);
  __trap();
}

__global__ void illegal_address_kernel(append_view<std::uint32_t> view, std::uint32_t* nowhere) {
  view.push(1u);
  nowhere[threadIdx.x] = 1;
}

__global__ void tally(const std::uint32_t* values, std::uint64_t n, std::uint32_t* counts,
                      std::uint64_t range, unsigned long long* out_of_range) {
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (values[i] < range) {
      atomicAdd(&counts[values[i]], 1u);
    } else {
      atomicAdd(out_of_range, 1ull);
    }
  }
}

class append_kernels : public gpu_test {
 protected:
  void SetUp() override {
    gpu_test::SetUp();
    if (IsSkipped()) return;
    pool_ = chunk_pool::create(provider_for(location::device(0)));
  }

  device_vector<std::uint32_t> make(std::size_t max_bytes, chunk_policy policy = chunk_policy::geometric()) {
    return device_vector<std::uint32_t>(pool_, {.max_size = max_bytes, .policy = policy});
  }

  enum class form { per_warp, per_thread, block };
  static constexpr form every_form[] = {form::per_warp, form::per_thread, form::block};

  // A launch of inputs [first, view.limit(n)) through the pushes of `how`.
  static std::function<void(append_view<std::uint32_t>, std::size_t, stream_ref)> divergent_launch(
      form how, std::uint64_t n, bool stop_when_overflowed) {
    return [=](append_view<std::uint32_t> view, std::size_t first, stream_ref stream) {
      switch (how) {
        case form::per_warp:
          push_divergent<append_atomics::per_warp>
              <<<blocks, threads, 0, stream.get()>>>(first, n, view, stop_when_overflowed);
          break;
        case form::per_thread:
          push_divergent<append_atomics::per_thread>
              <<<blocks, threads, 0, stream.get()>>>(first, n, view, stop_when_overflowed);
          break;
        case form::block:
          push_block_divergent<<<blocks, block_form_threads, 0, stream.get()>>>(first, n, view,
                                                                                stop_when_overflowed);
          break;
      }
    };
  }

  // Every element of inputs [0, n) is in vector[from, size()) exactly once, and nothing else.
  void expect_each_once(const device_vector<std::uint32_t>& vector, std::size_t from, std::uint64_t n,
                        cudaStream_t stream) {
    const std::uint64_t range = 4 * n;
    device_array<std::uint32_t> counts(range);
    device_array<unsigned long long> out_of_range(1);
    VMM_CUDA_CHECK(cudaMemsetAsync(counts.get(), 0, range * sizeof(std::uint32_t), stream));
    VMM_CUDA_CHECK(cudaMemsetAsync(out_of_range.get(), 0, sizeof(unsigned long long), stream));
    tally<<<264, 256, 0, stream>>>(vector.data() + from, vector.size() - from, counts.get(), range,
                                   out_of_range.get());
    VMM_CUDA_CHECK(cudaGetLastError());
    EXPECT_EQ(out_of_range.to_host(stream)[0], 0u) << "elements no input produces";
    const std::vector<std::uint32_t> seen = counts.to_host(stream);
    std::uint64_t expected_total = 0;
    std::uint64_t wrong = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      const unsigned count = elements_of(i);
      expected_total += count;
      for (unsigned j = 0; j < 4; ++j) {
        const std::uint32_t times = seen[element(i, j)];
        if (times != (j < count ? 1u : 0u) && wrong++ < 5)
          ADD_FAILURE() << "element " << element(i, j) << " of input " << i << " appended " << times
                        << " times";
      }
    }
    EXPECT_EQ(wrong, 0u);
    EXPECT_EQ(vector.size() - from, expected_total);
  }

  std::shared_ptr<chunk_pool> pool_;
};

TEST_F(append_kernels, divergent_lanes_in_partial_warps_append_every_element_once) {
  cuda_stream stream;
  const std::uint64_t n = 1 << 20;
  for (const form how : every_form) {
    SCOPED_TRACE(static_cast<int>(how));
    auto vector = make(std::size_t{256} << 20);
    vector.push_back(0xffffffffu);
    vector.reserve(4 * n);  // room for every element: one round, one launch
    append_statistics statistics;
    const append_options options{.statistics = &statistics};
    const std::size_t appended =
        append_from_kernel(vector, divergent_launch(how, n, true), stream.get(), options);
    EXPECT_EQ(appended, vector.size() - 1);
    EXPECT_EQ(statistics.rounds, 1u);
    EXPECT_EQ(statistics.launches, 1u);
    expect_each_once(vector, 1, n, stream.get());
    std::uint32_t head = 0;
    vector.copy_to_host(0, std::span<std::uint32_t>(&head, 1));
    EXPECT_EQ(head, 0xffffffffu) << "the element already there";
  }
}

// The output outgrows the first capacity a hundredfold. With the input count known, the
// first window (1/64 of the inputs) runs out, the vector grows from its rate, and the rest
// fits: a few rounds, and the capacity close to the size.
TEST_F(append_kernels, an_output_a_hundred_times_the_capacity_relaunches_only_what_did_not_fit) {
  cuda_stream stream;
  const std::uint64_t n = 36 << 20;  // about 54 M elements, 216 MB
  for (const auto& [how, stop] : {std::pair{form::per_warp, true}, std::pair{form::per_warp, false},
                                  std::pair{form::block, true}, std::pair{form::block, false}}) {
    SCOPED_TRACE(::testing::Message() << "form " << static_cast<int>(how) << ", stop " << stop);
    auto vector = make(std::size_t{1} << 30);
    vector.reserve(1);  // one granule: 524224 slots
    const std::uint32_t* const address = vector.data();
    append_statistics statistics;
    append_from_kernel(vector, divergent_launch(how, n, stop), stream.get(),
                       {.input_count = n, .statistics = &statistics});
    expect_each_once(vector, 0, n, stream.get());
    EXPECT_EQ(vector.data(), address);
    EXPECT_GE(statistics.growths, 1u);
    EXPECT_LE(statistics.rounds, 3u);
    const double capacity = static_cast<double>(vector.capacity() * sizeof(std::uint32_t));
    EXPECT_LE(capacity,
              1.13 * static_cast<double>(vector.size() * sizeof(std::uint32_t)) + pool_->granularity())
        << "capacity " << vector.capacity() << " for " << vector.size() << " elements";
  }
}

TEST_F(append_kernels, geometric_growth_relaunches_across_ten_growth_steps) {
  cuda_stream stream;
  // One 2 MiB granule holds 524224 slots; growing by 1.25, rounded up to whole granules,
  // gives 9.96 M slots after nine steps and 12.58 M after ten. 7.4 M inputs produce about
  // 11.1 M elements: ten growth steps.
  const std::uint64_t n = 7400000;
  for (const form how : {form::per_warp, form::block}) {
    SCOPED_TRACE(static_cast<int>(how));
    auto vector = make(std::size_t{1} << 30, chunk_policy::fixed(pool_->granularity()));
    const std::uint32_t* const address = vector.data();
    append_statistics statistics;
    append_from_kernel(vector, divergent_launch(how, n, true), stream.get(),
                       {.input_count = n, .growth_factor = 1.25, .statistics = &statistics});
    expect_each_once(vector, 0, n, stream.get());
    EXPECT_EQ(vector.data(), address);
    EXPECT_GE(statistics.growths, 10u);
    EXPECT_EQ(statistics.rounds, statistics.growths + 1);
  }
}

TEST_F(append_kernels, an_empty_result_appends_nothing) {
  cuda_stream stream;
  auto vector = make(std::size_t{64} << 20);
  vector.push_back(5);
  append_statistics statistics;
  const auto nothing = [](append_view<std::uint32_t> view, std::size_t first, stream_ref stream) {
    push_divergent<append_atomics::per_warp><<<blocks, threads, 0, stream.get()>>>(first, first, view, true);
  };
  EXPECT_EQ(
      append_from_kernel(vector, nothing, stream.get(), {.input_count = 1 << 20, .statistics = &statistics}),
      0u);
  EXPECT_EQ(vector.to_host(), std::vector<std::uint32_t>{5});
  EXPECT_EQ(statistics.rounds, 1u);
  EXPECT_EQ(statistics.growths, 0u);
}

TEST_F(append_kernels, a_launch_the_runtime_refuses_is_reported_and_changes_nothing) {
  cuda_stream stream;
  auto vector = make(std::size_t{64} << 20);
  vector.push_back(5);
  const std::size_t capacity = vector.capacity();
  const auto too_many_threads = [](append_view<std::uint32_t> view, std::size_t first, stream_ref stream) {
    push_divergent<append_atomics::per_warp><<<1, 4096, 0, stream.get()>>>(first, first + 10, view, true);
  };
  EXPECT_THROW(append_from_kernel(vector, too_many_threads, stream.get()), driver_error);
  EXPECT_EQ(vector.to_host(), std::vector<std::uint32_t>{5});
  EXPECT_EQ(vector.capacity(), capacity);
}

// ---- faults in the caller's kernel, each in a child process ----------------------------

enum class fault { trap, illegal_address, wrong_block_size };

// Runs in the death test's child: exits 0 after printing "reported: ..." when the fault came
// back as a vmm::driver_error, with the vector's size and the pool's memory as before.
// std::_Exit: after a fault the context is unusable, and destructors would only report that.
[[noreturn]] void fault_in_child(fault kind) {
  int code = 1;
  try {
    VMM_CUDA_CHECK(cudaSetDevice(0));
    auto pool = chunk_pool::create(provider_for(location::device(0)));
    device_vector<std::uint32_t> vector(pool, {.max_size = std::size_t{64} << 20});
    vector.push_back(5);
    cuda_stream stream;
    stream.synchronize();
    const std::size_t used = pool->statistics().used_current;
    const auto launch = [&](append_view<std::uint32_t> view, std::size_t, stream_ref s) {
      switch (kind) {
        case fault::trap:
          trap_kernel<<<4, 64, 0, s.get()>>>(view);
          break;
        case fault::illegal_address:
          illegal_address_kernel<<<4, 64, 0, s.get()>>>(view, nullptr);
          break;
        case fault::wrong_block_size:  // push_selected_block traps rather than hang or corrupt
          push_block_divergent<<<4, block_form_threads - 32, 0, s.get()>>>(0, 1000, view, false);
          break;
      }
    };
    try {
      append_from_kernel(vector, launch, stream.get());
      std::fprintf(stderr, "append_from_kernel returned after a fault\n");
    } catch (const driver_error& error) {
      if (vector.size() != 1) {
        std::fprintf(stderr, "the size changed to %zu\n", vector.size());
      } else if (pool->statistics().used_current != used) {
        std::fprintf(stderr, "the pool lends %zu bytes, %zu before\n", pool->statistics().used_current, used);
      } else {
        std::fprintf(stderr, "reported: %s\n", error.what());
        code = 0;
      }
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "unexpected: %s\n", error.what());
  }
  std::fflush(stderr);
  std::_Exit(code);
}

class append_faults : public gpu_test {
 protected:
  void SetUp() override {
    gpu_test::SetUp();
    // A fresh process (fork and exec) for the child: the CUDA context does not survive fork.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
  }
};

TEST_F(append_faults, a_trap_in_the_kernel_is_reported_and_leaves_the_vector_as_it_was) {
  EXPECT_EXIT(fault_in_child(fault::trap), ::testing::ExitedWithCode(0), "reported: .*");
}

TEST_F(append_faults, an_illegal_address_in_the_kernel_is_reported_and_leaves_the_vector_as_it_was) {
  EXPECT_EXIT(fault_in_child(fault::illegal_address), ::testing::ExitedWithCode(0), "reported: .*");
}

TEST_F(append_faults, a_block_push_from_a_block_of_another_size_is_reported_and_leaves_the_vector_as_it_was) {
  EXPECT_EXIT(fault_in_child(fault::wrong_block_size), ::testing::ExitedWithCode(0), "reported: .*");
}

}  // namespace
}  // namespace vmm::testing
