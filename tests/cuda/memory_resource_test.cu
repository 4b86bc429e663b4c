// memory_resource in stream order on a real GPU, with kernels: what the reuse policies let
// another stream have while a kernel still uses a freed block, and when.
//
// The kernel at the centre (hold_and_check) runs for at least ~50 ms and then until the test
// releases it, re-writing a pattern over its block and reading it back on every round: if
// any other work writes the block while it runs, it sets a flag in pinned memory. Because
// the test holds it, "the kernel is still running" is a fact while the test looks, not a
// race against a timer, and "nothing waited for it" is checkable: a kernel that reaches its
// 3 s cap says so (a host wait inside allocate, or a stream wrongly made to wait for it,
// ends only at the cap).
//
// "Gets the block" means gets its physical memory: the resource may hand it out at another
// address (stitching, vmm/memory_resource.hpp), so the tests compare the pages under each
// pointer (memory_resource::pages_of), and pointers only where the contract names them
// (same-stream reuse). Every test skips with the reason where there is no GPU; the
// static_asserts of CCCL's concepts are checked wherever this file compiles.

#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "cuda_support.hpp"
#include "vmm/cuda_mr.hpp"
#include "vmm/error.hpp"
#include "vmm/memory_resource.hpp"

namespace vmm::testing {
namespace {

// ---- CCCL 3.0's concepts, at compile time -------------------------------------------------

static_assert(cuda::mr::resource<memory_resource>);
static_assert(cuda::mr::async_resource<memory_resource>);
static_assert(cuda::mr::async_resource_with<memory_resource, cuda::mr::device_accessible>);
static_assert(cuda::has_property<memory_resource, cuda::mr::device_accessible>);
// Not declared: a resource over device memory is not host-dereferenceable (vmm/cuda_mr.hpp).
static_assert(!cuda::has_property<memory_resource, cuda::mr::host_accessible>);

// ---- kernels ------------------------------------------------------------------------------

__host__ __device__ std::uint32_t word_at(std::uint32_t seed, std::uint64_t index) {
  std::uint64_t x = (index + 1) * 0x9e3779b97f4a7c15ull ^ (std::uint64_t{seed} << 32);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<std::uint32_t>(x);
}

// In pinned host memory, written by the host (release) and by the kernel (the rest).
struct held_flags {
  int release = 0;    // set by the host: the kernel may end (after its minimum time)
  int mismatch = 0;   // the pattern changed under the kernel: other work wrote its block
  int timed_out = 0;  // the kernel was never released and ran to its cap
};

// Rewrites and re-checks word_at(seed + round, i) over `words`, round after round, for at
// least min_cycles and until the host sets release (at most cap_cycles). Volatile accesses:
// each read goes to memory (L2), where another stream's writes land, not to this SM's L1.
__global__ void hold_and_check(std::uint32_t* words, std::uint64_t count, std::uint32_t seed,
                               long long min_cycles, long long cap_cycles, held_flags* flags) {
  volatile std::uint32_t* const memory = words;
  volatile held_flags* const shared = flags;
  const long long start = clock64();
  const std::uint64_t first = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint32_t round = 0;; ++round) {
    for (std::uint64_t i = first; i < count; i += stride) memory[i] = word_at(seed + round, i);
    for (std::uint64_t i = first; i < count; i += stride)
      if (memory[i] != word_at(seed + round, i)) shared->mismatch = 1;
    const long long elapsed = clock64() - start;
    if (elapsed >= min_cycles && shared->release != 0) break;
    if (elapsed >= cap_cycles) {
      shared->timed_out = 1;
      break;
    }
  }
}

__global__ void fill_words(std::uint32_t* words, std::uint64_t count, std::uint32_t value) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    words[i] = value;
}

// ---- helpers ------------------------------------------------------------------------------

constexpr long long min_ms = 50;
constexpr long long cap_ms = 3000;

// hold_and_check on `stream` over [data, data + bytes), launched by the constructor and held
// until release(). The destructor releases it and waits for the stream, so that no test ends
// (an assertion included) with a kernel spinning on memory that is about to go.
class held_kernel {
 public:
  held_kernel(cudaStream_t stream, void* data, std::size_t bytes, std::uint32_t seed, held_flags* flags,
              long long cycles_per_ms)
      : stream_(stream), flags_(flags) {
    *flags_ = held_flags{};  // visible to the kernel: the launch comes after
    hold_and_check<<<8, 256, 0, stream>>>(static_cast<std::uint32_t*>(data), bytes / sizeof(std::uint32_t),
                                          seed, min_ms * cycles_per_ms, cap_ms * cycles_per_ms, flags);
    VMM_CUDA_CHECK(cudaGetLastError());
  }
  held_kernel(const held_kernel&) = delete;
  held_kernel& operator=(const held_kernel&) = delete;
  ~held_kernel() {
    release();
    cudaStreamSynchronize(stream_);
  }
  void release() noexcept { std::atomic_ref<int>(flags_->release).store(1, std::memory_order_release); }
  // What the kernel saw, once released and its stream synchronized.
  [[nodiscard]] const held_flags& flags() const noexcept { return *flags_; }

 private:
  cudaStream_t stream_;
  held_flags* flags_;
};

// Whether work queued on `stream` is still pending (cudaStreamQuery, which never blocks).
bool busy(cudaStream_t stream) {
  const cudaError_t result = cudaStreamQuery(stream);
  if (result == cudaErrorNotReady) {
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();  // not an error
    return true;
  }
  cuda_check(result, "cudaStreamQuery");
  return false;
}

class resource_stream_order : public gpu_test {
 protected:
  void SetUp() override {
    gpu_test::SetUp();
    if (IsSkipped()) return;
    pool_ = chunk_pool::create(provider_for(location::device(0)));
    page_ = pool_->granularity();
    words_ = page_ / sizeof(std::uint32_t);
    // Loaded now: a kernel's first launch loads its module, which waits for the device, so
    // a first launch behind a held kernel would wait for it (runtime_support.hpp).
    load_kernel(hold_and_check);
    load_kernel(fill_words);
    int khz = 0;
    VMM_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    cycles_per_ms_ = khz;
    flags_.emplace(1);
  }

  // Whether a kernel on one stream runs and ends while a kernel on another is held. The tests
  // of a block freed under a running kernel that let another stream work meanwhile need it.
  // compute-sanitizer serializes kernels: there a launch returns only once its kernel has
  // ended, so the held kernel runs to its cap before the other is even queued. Measured once,
  // by the first test that asks.
  bool kernels_overlap() {
    static const bool overlap = [this] {
      cuda_stream a;
      cuda_stream b;
      auto resource = make();
      void* held = resource->allocate(a.get(), page_);
      void* other = resource->allocate(b.get(), page_);
      bool ran = false;
      {
        held_kernel kernel = hold(a.get(), held, 0);
        fill(other, 1, b.get());
        for (int waited_ms = 0; waited_ms < 1000 && !(ran = !busy(b.get())); ++waited_ms)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ran = ran && busy(a.get());  // b's kernel ended while a's was still held
      }                              // released and waited for
      b.synchronize();
      resource->deallocate(a.get(), held, page_);
      resource->deallocate(b.get(), other, page_);
      return ran;
    }();
    return overlap;
  }

  // A resource of its own pool, bounded so that a test never takes the GPU's memory.
  std::unique_ptr<memory_resource> make(memory_resource_properties properties = {},
                                        reuse_policies policies = {}) {
    if (properties.max_size == 0) properties.max_size = 256 * page_;
    return std::make_unique<memory_resource>(pool_, properties, policies);
  }
  held_kernel hold(cudaStream_t stream, void* data, std::uint32_t seed) {
    return held_kernel(stream, data, page_, seed, flags_->span().data(), cycles_per_ms_);
  }
  void fill(void* data, std::uint32_t value, cudaStream_t stream) {
    fill_words<<<64, 256, 0, stream>>>(static_cast<std::uint32_t*>(data), words_, value);
    VMM_CUDA_CHECK(cudaGetLastError());
  }
  // How many of the block's words differ from `value`, after the work queued on `stream`.
  std::size_t words_other_than(const void* data, std::uint32_t value, cudaStream_t stream) {
    std::vector<std::uint32_t> host(words_);
    VMM_CUDA_CHECK(cudaMemcpyAsync(host.data(), data, page_, cudaMemcpyDeviceToHost, stream));
    VMM_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::size_t other = 0;
    for (std::uint32_t word : host) other += word != value ? 1 : 0;
    return other;
  }
  // The physical pages under a live allocation.
  static std::vector<physical_handle> pages(const memory_resource& resource, const void* p,
                                            std::size_t bytes) {
    std::vector<physical_handle> handles;
    for (const shared_chunk& chunk : resource.pages_of(p, bytes).pages)
      handles.push_back(chunk->memory().get());
    return handles;
  }

  std::shared_ptr<chunk_pool> pool_;
  std::size_t page_ = 0;
  std::size_t words_ = 0;
  long long cycles_per_ms_ = 0;
  std::optional<pinned_array<held_flags>> flags_;
};

constexpr std::uint32_t b_value = 0xb0b0b0b0u;

// (a) cudaFreeAsync's rule: work queued on a stream after the free is ordered after it, so
// the freeing stream takes the block back at once, even while a kernel still uses it.
TEST_F(resource_stream_order, the_freeing_stream_gets_the_same_block_back_at_once) {
  cuda_stream a;
  auto resource = make();
  void* p = resource->allocate(a.get(), page_);
  held_kernel kernel = hold(a.get(), p, 1);
  resource->deallocate(a.get(), p, page_);
  void* again = resource->allocate(a.get(), page_);
  EXPECT_EQ(again, p);
  EXPECT_TRUE(busy(a.get())) << "allocate waited for the stream's kernel; the same stream needs no wait";
  fill(again, b_value, a.get());  // after the held kernel, on the same stream
  kernel.release();
  a.synchronize();
  EXPECT_EQ(kernel.flags().mismatch, 0);
  EXPECT_EQ(kernel.flags().timed_out, 0) << "something waited for the held kernel";
  EXPECT_EQ(words_other_than(again, b_value, a.get()), 0u);
  resource->deallocate(a.get(), again, page_);
  EXPECT_EQ(resource->statistics().pages_created, 1u);
}

// (a) The same at any alignment: the block the stream freed fits the same request again.
TEST_F(resource_stream_order, the_freeing_stream_gets_the_same_block_back_at_any_alignment) {
  cuda_stream a;
  const std::size_t bytes = page_ + 100;  // not a multiple of the alignment
  for (const std::size_t alignment : {std::size_t{512}, std::size_t{64} << 10, page_}) {
    auto resource = make();
    void* p = resource->allocate(a.get(), bytes, alignment);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignment, 0u);
    resource->deallocate(a.get(), p, bytes, alignment);
    void* again = resource->allocate(a.get(), bytes, alignment);
    EXPECT_EQ(again, p) << "alignment " << alignment << ": the freed block was not taken back";
    resource->deallocate(a.get(), again, bytes, alignment);
    EXPECT_EQ(resource->statistics().pages_created, 2u) << "alignment " << alignment;
  }
}

// (b) Without internal dependencies, a block freed under a running kernel goes to no other
// stream: the other stream gets other memory, writes it while the kernel runs, and neither
// sees the other.
TEST_F(resource_stream_order, a_block_freed_under_a_running_kernel_goes_to_no_other_stream) {
  if (!kernels_overlap())
    GTEST_SKIP() << "kernels on two streams do not run at once here (compute-sanitizer serializes "
                    "launches): this test needs another stream's kernel to run under a held one";
  cuda_stream a;
  cuda_stream b;
  auto resource = make({}, {.allow_internal_dependencies = false});
  void* p = resource->allocate(a.get(), page_);
  const std::vector<physical_handle> under_p = pages(*resource, p, page_);
  held_kernel kernel = hold(a.get(), p, 2);
  resource->deallocate(a.get(), p, page_);

  void* q = resource->allocate(b.get(), page_);
  EXPECT_NE(q, p);
  for (physical_handle h : pages(*resource, q, page_))
    EXPECT_EQ(std::count(under_p.begin(), under_p.end(), h), 0) << "b got a page the held kernel uses";
  fill(q, b_value, b.get());
  b.synchronize();  // with a held: b was not made to wait for a
  EXPECT_TRUE(busy(a.get()));
  kernel.release();
  a.synchronize();
  EXPECT_EQ(kernel.flags().mismatch, 0) << "the held kernel's block changed under it";
  EXPECT_EQ(kernel.flags().timed_out, 0) << "b's allocation or b's kernel waited for the held kernel";
  EXPECT_EQ(words_other_than(q, b_value, b.get()), 0u) << "the held kernel wrote into b's block";
  resource->deallocate(b.get(), q, page_);
}

// (a') A request of the freeing stream that does not fit where the busy block was, at the
// resource's maximum: the block's pages are lent to it at once, in stream order (work
// queued after the free), while the old mapping stays until the stream passes the free;
// no host wait, no memory beyond the maximum, and the addresses are usable again later.
TEST_F(resource_stream_order, pages_freed_under_a_running_kernel_are_lent_to_the_same_stream_in_order) {
  cuda_stream a;
  auto resource = make({.max_size = 4 * page_, .large_page_size = page_});
  void* p = resource->allocate(a.get(), 3 * page_);
  // Pins the page after p, so that q cannot grow over p (1 MiB: p's arena, not the small one).
  constexpr std::size_t r_bytes = std::size_t{1} << 20;
  void* r = resource->allocate(a.get(), r_bytes);
  const std::vector<physical_handle> under_p = pages(*resource, p, 3 * page_);
  held_kernel kernel = hold(a.get(), static_cast<std::byte*>(p) + page_, 2);
  resource->deallocate(a.get(), p, 3 * page_);

  const std::size_t q_bytes = 3 * page_ + 256;  // does not fit where p was
  void* q = resource->allocate(a.get(), q_bytes);
  EXPECT_TRUE(busy(a.get())) << "the allocation waited for the held kernel";
  const memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.pages_stitched, 3u);
  EXPECT_EQ(s.reserved_current, 4 * page_);
  std::size_t lent = 0;
  for (physical_handle h : pages(*resource, q, q_bytes))
    lent += std::count(under_p.begin(), under_p.end(), h);
  EXPECT_EQ(lent, 3u);
  fill_words<<<64, 256, 0, a.get()>>>(static_cast<std::uint32_t*>(q), q_bytes / sizeof(std::uint32_t),
                                      b_value);
  VMM_CUDA_CHECK(cudaGetLastError());
  kernel.release();
  a.synchronize();
  EXPECT_EQ(kernel.flags().mismatch, 0) << "q's writes reached the held kernel's block before it ended";
  EXPECT_EQ(kernel.flags().timed_out, 0);
  std::vector<std::uint32_t> host(q_bytes / sizeof(std::uint32_t));
  VMM_CUDA_CHECK(cudaMemcpy(host.data(), q, q_bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(static_cast<std::size_t>(std::count(host.begin(), host.end(), b_value)), host.size());

  // The old addresses take memory again once the stream has passed the free.
  resource->deallocate(a.get(), q, q_bytes);
  resource->deallocate(a.get(), r, r_bytes);
  a.synchronize();
  void* again = resource->allocate(a.get(), 4 * page_);
  fill_words<<<64, 256, 0, a.get()>>>(static_cast<std::uint32_t*>(again), 4 * words_, b_value + 1);
  VMM_CUDA_CHECK(cudaGetLastError());
  std::vector<std::uint32_t> whole(4 * words_);
  VMM_CUDA_CHECK(cudaMemcpyAsync(whole.data(), again, 4 * page_, cudaMemcpyDeviceToHost, a.get()));
  a.synchronize();
  EXPECT_EQ(static_cast<std::size_t>(std::count(whole.begin(), whole.end(), b_value + 1)), whole.size());
  EXPECT_LE(resource->statistics().reserved_current, 4 * page_);
  resource->deallocate(a.get(), again, 4 * page_);
}

// (b) With internal dependencies, and room for one block only, the other stream gets the
// busy block at once, and its stream is made to wait: its first kernel runs after the held
// one. No host wait: the held kernel is still running when allocate returns.
TEST_F(resource_stream_order, an_internal_dependency_hands_the_busy_block_over_in_stream_order) {
  cuda_stream a;
  cuda_stream b;
  auto resource = make({.max_size = page_}, {.follow_event_dependencies = false,
                                             .allow_opportunistic = false,
                                             .allow_internal_dependencies = true});
  void* p = resource->allocate(a.get(), page_);
  const std::vector<physical_handle> under_p = pages(*resource, p, page_);
  held_kernel kernel = hold(a.get(), p, 3);
  resource->deallocate(a.get(), p, page_);

  void* q = nullptr;
  ASSERT_NO_THROW(q = resource->allocate(b.get(), page_))
      << "the only memory is the block freed on a: an internal dependency should hand it to b";
  EXPECT_EQ(pages(*resource, q, page_), under_p);
  EXPECT_TRUE(busy(a.get())) << "allocate waited on the host for a's kernel instead of making b wait for it";
  fill(q, b_value, b.get());
  EXPECT_TRUE(busy(b.get())) << "b's kernel ran while a's kernel, on the same memory, was held";
  kernel.release();
  a.synchronize();
  b.synchronize();
  EXPECT_EQ(kernel.flags().mismatch, 0) << "b's kernel wrote the block while a's kernel used it";
  EXPECT_EQ(kernel.flags().timed_out, 0) << "something waited on the host for the held kernel";
  EXPECT_EQ(words_other_than(q, b_value, b.get()), 0u) << "b's kernel ran before a's last write";
  resource->deallocate(b.get(), q, page_);
}

// (c) Opportunistic reuse: once the freeing stream has passed the free (here: synchronized),
// another stream gets the memory; with no reuse policy at all it does not.
TEST_F(resource_stream_order, after_the_freeing_stream_passed_another_stream_reuses_the_memory) {
  cuda_stream a;
  cuda_stream b;
  {
    auto resource = make({.max_size = page_}, {.follow_event_dependencies = false,
                                               .allow_opportunistic = true,
                                               .allow_internal_dependencies = false});
    void* p = resource->allocate(a.get(), page_);
    const std::vector<physical_handle> under_p = pages(*resource, p, page_);
    fill(p, 1, a.get());
    resource->deallocate(a.get(), p, page_);
    a.synchronize();
    void* q = nullptr;
    ASSERT_NO_THROW(q = resource->allocate(b.get(), page_));
    EXPECT_EQ(pages(*resource, q, page_), under_p);
    fill(q, b_value, b.get());
    EXPECT_EQ(words_other_than(q, b_value, b.get()), 0u);
    resource->deallocate(b.get(), q, page_);
    EXPECT_EQ(resource->statistics().pages_created, 1u);
  }
  {
    auto resource = make({.max_size = page_}, {.follow_event_dependencies = false,
                                               .allow_opportunistic = false,
                                               .allow_internal_dependencies = false});
    void* p = resource->allocate(a.get(), page_);
    resource->deallocate(a.get(), p, page_);
    a.synchronize();
    EXPECT_THROW((void)resource->allocate(b.get(), page_), out_of_memory)
        << "no policy lets b have memory freed on a";
    void* again = resource->allocate(a.get(), page_);  // a itself may
    EXPECT_EQ(again, p);
    resource->deallocate(a.get(), again, page_);
  }
}

// (d) follow_event_dependencies: b made to wait for a through the resource (wait_for) gets
// the block a freed before, with no internal dependency and no host wait, and b's work runs
// after a's.
TEST_F(resource_stream_order, wait_for_lets_the_waiting_stream_reuse_the_block_at_once) {
  cuda_stream a;
  cuda_stream b;
  auto resource = make({.max_size = page_}, {.follow_event_dependencies = true,
                                             .allow_opportunistic = false,
                                             .allow_internal_dependencies = false});
  void* p = resource->allocate(a.get(), page_);
  const std::vector<physical_handle> under_p = pages(*resource, p, page_);
  held_kernel kernel = hold(a.get(), p, 4);
  resource->deallocate(a.get(), p, page_);
  resource->wait_for(b.get(), a.get());

  void* q = nullptr;
  ASSERT_NO_THROW(q = resource->allocate(b.get(), page_))
      << "b waits for a's free (wait_for): follow_event_dependencies should hand it a's block";
  EXPECT_EQ(pages(*resource, q, page_), under_p);
  EXPECT_TRUE(busy(a.get())) << "allocate waited on the host for a's kernel";
  fill(q, b_value, b.get());
  EXPECT_TRUE(busy(b.get())) << "b's kernel ran before a's, though b waits for a";
  kernel.release();
  a.synchronize();
  b.synchronize();
  EXPECT_EQ(kernel.flags().mismatch, 0);
  EXPECT_EQ(kernel.flags().timed_out, 0) << "something waited on the host for the held kernel";
  EXPECT_EQ(words_other_than(q, b_value, b.get()), 0u);
  resource->deallocate(b.get(), q, page_);
}

// (e) A block allocated on a and freed on b is b's until b passes the free: a (and any other
// stream) gets other memory while b's kernel runs; once b has passed, the memory is free.
TEST_F(resource_stream_order, a_block_freed_on_another_stream_is_kept_until_that_stream_passes) {
  if (!kernels_overlap())
    GTEST_SKIP() << "kernels on two streams do not run at once here (compute-sanitizer serializes "
                    "launches): this test needs another stream's kernel to run under a held one";
  cuda_stream a;
  cuda_stream b;
  cuda_stream c;
  {
    auto resource = make({}, {.allow_internal_dependencies = false});
    void* p = resource->allocate(a.get(), page_);
    const std::vector<physical_handle> under_p = pages(*resource, p, page_);
    held_kernel kernel = hold(b.get(), p, 5);  // b uses a's block...
    resource->deallocate(b.get(), p, page_);   // ...and frees it, in order after its kernel

    void* on_a = resource->allocate(a.get(), page_);
    void* on_c = resource->allocate(c.get(), page_);
    for (void* q : {on_a, on_c}) {
      EXPECT_NE(q, p);
      for (physical_handle h : pages(*resource, q, page_))
        EXPECT_EQ(std::count(under_p.begin(), under_p.end(), h), 0) << "got a page b's kernel uses";
    }
    fill(on_a, b_value, a.get());
    fill(on_c, b_value, c.get());
    a.synchronize();  // with b held: neither waited for b
    c.synchronize();
    EXPECT_TRUE(busy(b.get()));
    kernel.release();
    b.synchronize();
    EXPECT_EQ(kernel.flags().mismatch, 0) << "b's block changed under its kernel";
    EXPECT_EQ(kernel.flags().timed_out, 0);
    EXPECT_EQ(words_other_than(on_a, b_value, a.get()), 0u);
    EXPECT_EQ(words_other_than(on_c, b_value, c.get()), 0u);
    resource->deallocate(a.get(), on_a, page_);
    resource->deallocate(c.get(), on_c, page_);
  }
  {
    auto resource = make({.max_size = page_}, {.allow_internal_dependencies = false});
    void* p = resource->allocate(a.get(), page_);
    const std::vector<physical_handle> under_p = pages(*resource, p, page_);
    fill(p, 1, b.get());
    resource->deallocate(b.get(), p, page_);
    b.synchronize();
    void* q = nullptr;
    ASSERT_NO_THROW(q = resource->allocate(a.get(), page_)) << "b has passed the free: the memory is free";
    EXPECT_EQ(pages(*resource, q, page_), under_p);
    resource->deallocate(a.get(), q, page_);
  }
}

// (f) Through CCCL's type-erased reference, as a library that takes any
// cuda::mr::async_resource_ref<device_accessible> would use it.
TEST_F(resource_stream_order, allocates_and_frees_through_a_cccl_async_resource_ref) {
  cuda_stream s;
  auto resource = make();
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{*resource};
  const cuda::stream_ref stream{s.get()};
  const std::size_t bytes = page_ + 100;
  void* p = ref.allocate_async(bytes, cuda::mr::default_cuda_malloc_alignment, stream);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(resource->owns(p));
  EXPECT_EQ(resource->statistics().allocations, 1u);
  fill(p, b_value, s.get());
  EXPECT_EQ(words_other_than(p, b_value, s.get()), 0u);
  ref.deallocate_async(p, bytes, cuda::mr::default_cuda_malloc_alignment, stream);
  EXPECT_EQ(resource->statistics().allocations, 0u);
  // Stream order holds through the reference: the same stream gets the block back.
  void* again = ref.allocate_async(bytes, cuda::mr::default_cuda_malloc_alignment, stream);
  EXPECT_EQ(again, p);
  ref.deallocate_async(again, bytes, cuda::mr::default_cuda_malloc_alignment, stream);
  // The alignment asked for is kept.
  void* aligned = ref.allocate_async(1000, 4096, stream);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(aligned) % 4096, 0u);
  ref.deallocate_async(aligned, 1000, 4096, stream);
  // The synchronous pair of the concept.
  void* sync = ref.allocate(4096, 256);
  EXPECT_TRUE(resource->owns(sync));
  ref.deallocate(sync, 4096, 256);
  s.synchronize();
  const memory_resource_statistics stats = resource->statistics();
  EXPECT_EQ(stats.allocations, 0u);
  EXPECT_EQ(stats.allocations_total, 4u);
  EXPECT_EQ(stats.bad_deallocations, 0u);
}

}  // namespace
}  // namespace vmm::testing
