// Growth ahead (growable_buffer_options::growth_ahead) on every provider: the next grow finds
// its chunks prepared, nothing leaks, the strong guarantee holds when the thread fails, and
// a buffer may go (or shrink) while its chunks are being prepared. Also run under TSan.

#include <gtest/gtest.h>

#include <cerrno>
#include <vector>

#include "fault_injection.hpp"
#include "growth_worker.hpp"
#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/retirement.hpp"

namespace vmm::testing {
namespace {

// Waits for whatever the process's growth thread still has (a buffer destroyed with a
// request in flight leaves it running).
void wait_for_the_growth_thread() {
  detail::growth_worker::shared()->wait_idle();
}

template <class Kind>
class growth_ahead : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->provider_ != nullptr) pool_ = chunk_pool::create(this->provider_);
  }
  growable_buffer make(std::size_t max_chunks, growth_ahead_options ahead,
                       chunk_policy policy = chunk_policy::fixed(std::size_t{1})) {
    return growable_buffer(
        pool_, {.max_size = max_chunks * this->granularity_, .policy = policy, .growth_ahead = ahead});
  }
  void write(const growable_buffer& buffer, std::size_t offset, const std::vector<std::uint8_t>& bytes) {
    write_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(buffer.data()) + offset, bytes);
  }
  std::vector<std::uint8_t> read(const growable_buffer& buffer, std::size_t offset, std::size_t n) {
    return read_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(buffer.data()) + offset, n);
  }
  std::shared_ptr<chunk_pool> pool_;
};
TYPED_TEST_SUITE(growth_ahead, all_memory_kinds, memory_kind_names);

TYPED_TEST(growth_ahead, a_resize_after_the_thread_finished_creates_no_chunk_itself) {
  const std::size_t g = this->granularity_;
  // Room for three granules: once the buffer is full it asks for nothing more, so the
  // pool's count of chunks created is the buffer's own doing.
  growable_buffer buffer = this->make(3, {.bytes = 2 * g});  // fixed chunks of one granule
  buffer.resize(g);  // creates its chunk itself, then asks for two more
  buffer.wait_for_growth_ahead();
  EXPECT_EQ(buffer.ready_ahead(), 2 * g);
  const pool_statistics s = this->pool_->statistics();
  EXPECT_EQ(s.chunks_created, 3u);
  EXPECT_EQ(s.used_current, 3 * g);  // ready chunks are lent to the buffer
  EXPECT_EQ(buffer.capacity(), g);   // but not mapped: capacity changes only in the user's calls
  const auto head = pattern(g, 7);
  this->write(buffer, 0, head);

  buffer.resize(3 * g);  // both ready chunks, no cuMemCreate here
  EXPECT_EQ(this->pool_->statistics().chunks_created, 3u);
  EXPECT_EQ(this->pool_->statistics().chunks_reused, 0u);
  EXPECT_EQ(buffer.ready_ahead(), 0u);
  EXPECT_EQ(buffer.capacity(), 3 * g);
  EXPECT_EQ(buffer.chunk_count(), 3u);
  const auto tail = pattern(2 * g, 8);
  this->write(buffer, g, tail);
  EXPECT_EQ(this->read(buffer, 0, g), head);
  EXPECT_EQ(this->read(buffer, g, 2 * g), tail);
}

// The thread works on while the buffer grows: each check waits for it and counts the chunks
// it made for the next request (fresh ones: the pool holds no idle chunk here).
TYPED_TEST(growth_ahead, with_the_geometric_policy_the_next_grows_find_their_chunks) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make(256, {.bytes = 8 * g}, chunk_policy::geometric());
  buffer.resize(g);
  for (int i = 0; i < 7; ++i) {
    buffer.wait_for_growth_ahead();
    ASSERT_EQ(buffer.ready_ahead(), 8 * g);  // one chunk, as the policy picks it
    const std::size_t created = this->pool_->statistics().chunks_created;
    buffer.resize(buffer.size() + 8 * g);  // exactly the bytes kept ready
    buffer.wait_for_growth_ahead();
    EXPECT_EQ(buffer.ready_ahead(), 8 * g);
    EXPECT_EQ(this->pool_->statistics().chunks_created, created + 1) << "append " << i;  // the next one
  }
  EXPECT_EQ(buffer.capacity(), buffer.size());
}

TYPED_TEST(growth_ahead, learning_from_the_last_grows_keeps_the_next_append_ready) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make(64, {.learn = true});
  buffer.resize(3 * g);  // learns 3 granules
  for (int i = 0; i < 6; ++i) {
    buffer.wait_for_growth_ahead();
    ASSERT_EQ(buffer.ready_ahead(), 3 * g) << "append " << i;
    const std::size_t created = this->pool_->statistics().chunks_created;
    buffer.resize(buffer.size() + 3 * g);
    buffer.wait_for_growth_ahead();
    EXPECT_EQ(this->pool_->statistics().chunks_created, created + 3) << "append " << i;  // the next three
  }
  EXPECT_EQ(buffer.size(), 21 * g);
}

TYPED_TEST(growth_ahead, nothing_leaks_through_shrinking_moves_and_destruction) {
  const std::size_t g = this->granularity_;
  const address_space_usage before = this->provider_->address_space().usage();
  {
    growable_buffer buffer = this->make(32, {.bytes = 4 * g});
    buffer.resize(2 * g);
    buffer.wait_for_growth_ahead();
    EXPECT_EQ(this->pool_->statistics().used_current, 6 * g);
    // The thread reserved no address range of its own.
    EXPECT_EQ(this->provider_->address_space().usage().ranges, before.ranges + 1);
    buffer.shrink_to_fit();  // gives the ready chunks back
    EXPECT_EQ(buffer.ready_ahead(), 0u);
    EXPECT_EQ(this->pool_->statistics().used_current, 2 * g);
    growable_buffer moved = std::move(buffer);
    moved.resize(4 * g);
    moved.wait_for_growth_ahead();
    EXPECT_EQ(moved.ready_ahead(), 4 * g);
    growable_buffer other = this->make(8, {.bytes = g});
    other.resize(g);
    other = std::move(moved);  // other's own memory and ready chunk go back
    wait_for_the_growth_thread();
    EXPECT_EQ(this->pool_->statistics().used_current, 8 * g);
  }
  wait_for_the_growth_thread();
  const pool_statistics s = this->pool_->statistics();
  EXPECT_EQ(s.used_current, 0u);
  EXPECT_EQ(this->provider_->address_space().usage().ranges, before.ranges);
  EXPECT_EQ(this->provider_->address_space().usage().mappings, before.mappings);
  this->pool_->trim_to(0);
  EXPECT_EQ(this->provider_->address_space().usage(), before);
}

TYPED_TEST(growth_ahead, a_buffer_destroyed_right_after_waking_the_thread_leaks_nothing) {
  const std::size_t g = this->granularity_;
  const address_space_usage before = this->provider_->address_space().usage();
  // Alone: the last buffer's destruction ends the thread, which first finishes its chunk.
  for (int i = 0; i < 8; ++i) {
    growable_buffer buffer = this->make(64, {.bytes = 16 * g}, chunk_policy::geometric());
    buffer.resize(g);  // wakes the thread
  }
  EXPECT_EQ(this->pool_->statistics().used_current, 0u);
  // Beside a buffer that keeps the thread: the request in flight delivers nothing.
  growable_buffer keeper = this->make(8, {.bytes = g});
  keeper.resize(g);
  for (int i = 0; i < 8; ++i) {
    growable_buffer buffer = this->make(64, {.bytes = 16 * g}, chunk_policy::geometric());
    buffer.resize(g);
  }
  wait_for_the_growth_thread();
  EXPECT_EQ(this->pool_->statistics().used_current, keeper.capacity() + keeper.ready_ahead());
  EXPECT_EQ(this->provider_->address_space().usage().ranges, before.ranges + 1);
  // Shrinking while the thread works for the buffer.
  for (int i = 0; i < 8; ++i) {
    growable_buffer buffer = this->make(64, {.bytes = 16 * g}, chunk_policy::geometric());
    buffer.resize(2 * g);
    buffer.resize(0);
    buffer.shrink_to_fit();
    wait_for_the_growth_thread();
    buffer.collect_retired(true);
    EXPECT_EQ(buffer.ready_ahead(), 0u);
    EXPECT_EQ(buffer.capacity(), 0u);
  }
  EXPECT_EQ(this->pool_->statistics().used_current, keeper.capacity() + keeper.ready_ahead());
}

TYPED_TEST(growth_ahead, a_failed_preparation_leaves_the_buffer_as_it_was) {
  // The thread's request passes the pool's cap; the buffer's own grows within it work.
  const std::size_t g = this->granularity_;
  this->pool_->set_cap(3 * g);
  growable_buffer buffer = this->make(16, {.bytes = 4 * g});
  buffer.resize(2 * g);  // asks for 4 more granules: one fits, the second fails
  buffer.wait_for_growth_ahead();
  const auto bytes = pattern(2 * g, 5);
  this->write(buffer, 0, bytes);
  EXPECT_EQ(buffer.size(), 2 * g);
  EXPECT_EQ(buffer.capacity(), 2 * g);
  EXPECT_EQ(buffer.ready_ahead(), g);  // what was made before the failure stays ready
  EXPECT_EQ(this->pool_->statistics().used_current, 3 * g);
  // Its own grow past the cap fails as without growth ahead, and changes nothing; the
  // ready chunk it mapped went back to the pool with the rest.
  EXPECT_THROW(buffer.resize(4 * g), out_of_memory);
  EXPECT_EQ(buffer.capacity(), 2 * g);
  EXPECT_EQ(buffer.size(), 2 * g);
  EXPECT_EQ(this->read(buffer, 0, 2 * g), bytes);
  EXPECT_EQ(this->pool_->statistics().used_current, 2 * g);
  EXPECT_EQ(this->pool_->statistics().reserved_current, 3 * g);
  buffer.resize(3 * g);  // from the pool's idle chunk
  EXPECT_EQ(this->pool_->statistics().chunks_created, 3u);
  EXPECT_EQ(this->read(buffer, 0, 2 * g), bytes);
}

TYPED_TEST(growth_ahead, device_vectors_grow_ahead_too) {
  const std::size_t g = this->granularity_;
  device_vector<std::uint32_t> vector(this->pool_, {.max_size = 64 * g, .growth_ahead = {.learn = true}});
  std::vector<std::uint32_t> batch(g / sizeof(std::uint32_t));
  std::vector<std::uint32_t> expected;
  for (std::uint32_t i = 0; i < 8; ++i) {
    for (std::size_t j = 0; j < batch.size(); ++j) batch[j] = i * 1000003u + static_cast<std::uint32_t>(j);
    vector.append(batch);
    expected.insert(expected.end(), batch.begin(), batch.end());
  }
  EXPECT_EQ(vector.to_host(), expected);
}

TYPED_TEST(growth_ahead, without_it_nothing_waits_and_nothing_is_ready) {
  growable_buffer buffer(this->pool_, {.max_size = 4 * this->granularity_});
  buffer.resize(this->granularity_);
  buffer.wait_for_growth_ahead();
  EXPECT_EQ(buffer.ready_ahead(), 0u);
  EXPECT_EQ(this->pool_->statistics().used_current, this->granularity_);
}

// Every OS call the thread makes for a request fails in turn: the buffer is as it was, the
// next grow does the work itself, and nothing leaks. (The OS provider: the thread's calls
// are told apart by order, the buffer's own calls coming first.)
TEST(growth_ahead_faults, every_failure_on_the_thread_leaves_the_buffer_as_it_was) {
  const auto provider = provider_for(location::os_host());
  const std::size_t g = provider->capabilities().granularity;
  const auto bytes = pattern(g, 9);
  int thread_failures = 0;
  for (std::uint64_t nth = 1;; ++nth) {
    auto pool = chunk_pool::create(provider);
    const address_space_usage before = provider->address_space().usage();
    bool fired = false;
    {
      growable_buffer buffer(
          pool, {.max_size = 8 * g, .policy = chunk_policy::fixed(g), .growth_ahead = {.bytes = g}});
      buffer.resize(g);  // the buffer's own chunk, then the request
      buffer.wait_for_growth_ahead();
      buffer.shrink_to_fit();  // drops the ready chunk, which the pool then releases
      pool->trim_to(0);
      write_bytes(*provider, reinterpret_cast<std::uintptr_t>(buffer.data()), bytes);
      detail::fault::arm(detail::fault::memfd_create | detail::fault::fallocate | detail::fault::mmap |
                             detail::fault::mprotect | detail::fault::fcntl,
                         nth, EINVAL);  // not ENOMEM: the pool retries a create that ran out
      buffer.resize(g);                 // nothing to map: only a request for one chunk, on the thread
      buffer.wait_for_growth_ahead();
      fired = detail::fault::fired();
      detail::fault::disarm();
      EXPECT_EQ(buffer.size(), g);
      EXPECT_EQ(buffer.capacity(), g);
      if (fired && buffer.ready_ahead() == 0) {
        ++thread_failures;  // dropped, and what it made is back in the pool
        EXPECT_EQ(pool->statistics().used_current, g) << "failure " << nth;
      } else {
        EXPECT_FALSE(fired) << "failure " << nth;  // the thread only creates: any failure is its own
        EXPECT_EQ(buffer.ready_ahead(), g) << "failure " << nth;
      }
      buffer.resize(2 * g);  // works: from the ready chunk, or by itself after a failure
      buffer.wait_for_growth_ahead();
      const pool_statistics s = pool->statistics();
      EXPECT_EQ(s.used_current, 2 * g + buffer.ready_ahead()) << "failure " << nth;
      EXPECT_EQ(s.reserved_current, s.used_current) << "failure " << nth;  // nothing stray
      EXPECT_EQ(read_bytes(*provider, reinterpret_cast<std::uintptr_t>(buffer.data()), g), bytes);
    }
    wait_for_the_growth_thread();
    EXPECT_EQ(pool->statistics().used_current, 0u) << "failure " << nth;
    pool->trim_to(0);
    EXPECT_EQ(provider->address_space().usage(), before) << "failure " << nth;
    if (!fired) break;
  }
  EXPECT_GE(thread_failures, 3);  // creating: memfd, size, seals
}

}  // namespace
}  // namespace vmm::testing
