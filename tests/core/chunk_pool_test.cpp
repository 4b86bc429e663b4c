// chunk_pool on every provider: reuse, statistics, threshold, trim, cap, threads.

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "provider_kinds.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"

namespace vmm::testing {
namespace {

template <class Kind>
class chunk_pools : public provider_test<Kind> {
 protected:
  std::shared_ptr<chunk_pool> pool(chunk_pool_options options = {}) {
    return chunk_pool::create(this->provider_, options);
  }
};
TYPED_TEST_SUITE(chunk_pools, all_memory_kinds, memory_kind_names);

void expect_statistics(const pool_statistics& s, std::size_t reserved, std::size_t used) {
  EXPECT_EQ(s.reserved_current, reserved);
  EXPECT_EQ(s.used_current, used);
}

TYPED_TEST(chunk_pools, a_given_back_chunk_is_reused_without_creating_memory) {
  const std::size_t g = this->granularity_;
  auto pool = this->pool();
  physical_handle first_handle = 0;
  {
    pooled_chunk chunk = pool->acquire(g);
    first_handle = chunk.memory().get();
    expect_statistics(pool->statistics(), g, g);
  }
  expect_statistics(pool->statistics(), g, 0);
  pooled_chunk again = pool->acquire(1);  // rounded up to g: the same chunk
  EXPECT_EQ(again.memory().get(), first_handle);
  const pool_statistics s = pool->statistics();
  EXPECT_EQ(s.chunks_created, 1u);
  EXPECT_EQ(s.chunks_reused, 1u);
  expect_statistics(s, g, g);
  pooled_chunk other_size = pool->acquire(2 * g);  // no idle chunk of that size
  EXPECT_EQ(pool->statistics().chunks_created, 2u);
  expect_statistics(pool->statistics(), 3 * g, 3 * g);
  EXPECT_THROW((void)pool->acquire(0), invalid_argument);
}

TYPED_TEST(chunk_pools, high_water_marks_follow_usage_until_reset) {
  const std::size_t g = this->granularity_;
  auto pool = this->pool();
  {
    pooled_chunk a = pool->acquire(g);
    pooled_chunk b = pool->acquire(2 * g);
  }
  pool_statistics s = pool->statistics();
  EXPECT_EQ(s.used_high, 3 * g);
  EXPECT_EQ(s.reserved_high, 3 * g);
  pool->reset_high_water_marks();
  s = pool->statistics();
  EXPECT_EQ(s.used_high, 0u);
  EXPECT_EQ(s.reserved_high, 3 * g);  // the idle chunks are still reserved
  pool->trim_to(0);
  pool->reset_high_water_marks();
  EXPECT_EQ(pool->statistics().reserved_high, 0u);
}

TYPED_TEST(chunk_pools, release_threshold_and_trim_release_idle_chunks) {
  const std::size_t g = this->granularity_;
  auto pool = this->pool({.release_threshold = 2 * g});
  {
    pooled_chunk a = pool->acquire(g);
    pooled_chunk b = pool->acquire(g);
    pooled_chunk c = pool->acquire(g);
    expect_statistics(pool->statistics(), 3 * g, 3 * g);
  }
  // Giving back the third chunk left 3g reserved > threshold 2g: one was released.
  expect_statistics(pool->statistics(), 2 * g, 0);
  EXPECT_EQ(pool->statistics().chunks_released, 1u);
  pool->trim_to(g);
  expect_statistics(pool->statistics(), g, 0);
  pool->set_release_threshold(0);
  expect_statistics(pool->statistics(), 0, 0);
  EXPECT_EQ(pool->statistics().chunks_released, 3u);
}

TYPED_TEST(chunk_pools, the_cap_bounds_reserved_memory_and_a_refusal_changes_nothing) {
  const std::size_t g = this->granularity_;
  auto pool = this->pool({.cap = 3 * g});
  pooled_chunk a = pool->acquire(g);
  pooled_chunk b = pool->acquire(2 * g);
  const pool_statistics before = pool->statistics();
  EXPECT_THROW((void)pool->acquire(g), out_of_memory);
  const pool_statistics after = pool->statistics();
  EXPECT_EQ(after.reserved_current, before.reserved_current);
  EXPECT_EQ(after.used_current, before.used_current);
  EXPECT_EQ(after.chunks_created, before.chunks_created);
  // An idle chunk of another size is released to make room under the cap.
  b = pooled_chunk();
  expect_statistics(pool->statistics(), 3 * g, g);
  pooled_chunk c = pool->acquire(g);
  expect_statistics(pool->statistics(), 2 * g, 2 * g);
  EXPECT_THROW((void)pool->acquire(4 * g), out_of_memory);
}

TYPED_TEST(chunk_pools, acquire_idle_takes_the_largest_fitting_idle_chunk_and_never_creates) {
  const std::size_t g = this->granularity_;
  auto pool = this->pool();
  EXPECT_FALSE(pool->acquire_idle(8 * g));
  {
    pooled_chunk a = pool->acquire(g);
    pooled_chunk b = pool->acquire(2 * g);
    pooled_chunk c = pool->acquire(4 * g);
  }
  EXPECT_EQ(pool->acquire_idle(3 * g).size(), 2 * g);
  EXPECT_EQ(pool->statistics().chunks_created, 3u);
}

// For any stream: chunks given back without a stream are there for any stream at once.
TYPED_TEST(chunk_pools, a_request_for_any_stream_takes_chunks_every_stream_may_use) {
  const std::size_t g = this->granularity_;
  auto pool = this->pool();
  EXPECT_FALSE(pool->acquire_idle(g, any_stream));
  physical_handle first = 0;
  {
    pooled_chunk a = pool->acquire(g, any_stream);  // created
    first = a.memory().get();
  }
  EXPECT_EQ(pool->statistics().chunks_created, 1u);
  pooled_chunk again = pool->acquire_idle(2 * g, any_stream);
  ASSERT_TRUE(again);
  EXPECT_EQ(again.memory().get(), first);
  pooled_chunk more = pool->acquire(g, any_stream);  // nothing idle: created
  EXPECT_NE(more.memory().get(), first);
  const pool_statistics s = pool->statistics();
  EXPECT_EQ(s.chunks_created, 2u);
  EXPECT_EQ(s.chunks_reused, 1u);
}

TYPED_TEST(chunk_pools, many_threads_share_one_pool_and_the_books_balance) {
  const std::size_t g = this->granularity_;
  auto pool = this->pool({.release_threshold = 6 * g, .cap = 24 * g});
  constexpr int threads = 6;
  constexpr int rounds = 150;
  std::atomic<int> refused{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<pooled_chunk> held;
      for (int i = 0; i < rounds; ++i) {
        try {
          held.push_back(pool->acquire(g * (1 + random() % 3)));
        } catch (const out_of_memory&) {
          ++refused;
        }
        if (!held.empty() && (held.size() > 2 || random() % 2 == 0)) held.erase(held.begin());
        const pool_statistics s = pool->statistics();
        if (s.reserved_current > 24 * g || s.used_current > s.reserved_current) std::abort();
      }
    });
  }
  for (auto& worker : workers) worker.join();
  const pool_statistics s = pool->statistics();
  EXPECT_EQ(s.used_current, 0u);
  EXPECT_LE(s.reserved_current, 6 * g);
  EXPECT_LE(s.reserved_high, 24 * g);
  EXPECT_EQ(s.chunks_created + s.chunks_reused + static_cast<std::size_t>(refused.load()),
            static_cast<std::size_t>(threads * rounds));
  EXPECT_EQ((s.chunks_created - s.chunks_released) > 0, s.reserved_current > 0);
}

}  // namespace
}  // namespace vmm::testing
