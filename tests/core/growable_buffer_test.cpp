// growable_buffer on every provider: stable address, contents, policies, rollback, sharing.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"

namespace vmm::testing {
namespace {

template <class Kind>
class growable_buffers : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->provider_ != nullptr) pool_ = chunk_pool::create(this->provider_);
  }
  growable_buffer make(std::size_t max_chunks, chunk_policy policy = chunk_policy::geometric()) {
    return growable_buffer(pool_, {.max_size = max_chunks * this->granularity_, .policy = policy});
  }
  void write(const growable_buffer& buffer, std::size_t offset, const std::vector<std::uint8_t>& bytes) {
    write_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(buffer.data()) + offset, bytes);
  }
  std::vector<std::uint8_t> read(const growable_buffer& buffer, std::size_t offset, std::size_t n) {
    return read_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(buffer.data()) + offset, n);
  }
  std::shared_ptr<chunk_pool> pool_;
};
TYPED_TEST_SUITE(growable_buffers, all_memory_kinds, memory_kind_names);

TYPED_TEST(growable_buffers, growing_keeps_the_address_and_every_byte) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make(64);
  void* const address = buffer.data();
  ASSERT_NE(address, nullptr);
  EXPECT_EQ(buffer.size(), 0u);
  EXPECT_EQ(buffer.capacity(), 0u);
  std::vector<std::uint8_t> expected;
  // Appends of uneven sizes, some inside a chunk, some across several.
  for (std::size_t step : {g / 3, g, 5 * g / 2, std::size_t{100}, 7 * g, g + 17}) {
    const std::size_t old_size = buffer.size();
    buffer.resize(old_size + step);
    ASSERT_EQ(buffer.data(), address);
    ASSERT_GE(buffer.capacity(), buffer.size());
    const auto slice = pattern(step, static_cast<std::uint32_t>(old_size));
    this->write(buffer, old_size, slice);
    expected.insert(expected.end(), slice.begin(), slice.end());
    ASSERT_EQ(this->read(buffer, 0, buffer.size()), expected);
  }
  EXPECT_EQ(this->pool_->statistics().used_current, buffer.capacity());
}

TYPED_TEST(growable_buffers, shrinking_keeps_the_prefix_and_regrowing_reuses_the_chunks) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make(32, chunk_policy::fixed(g));
  buffer.resize(8 * g);
  const auto bytes = pattern(8 * g, 21);
  this->write(buffer, 0, bytes);
  EXPECT_EQ(buffer.chunk_count(), 8u);
  buffer.resize(3 * g + 1);
  EXPECT_EQ(buffer.capacity(), 4 * g);
  EXPECT_EQ(this->read(buffer, 0, 3 * g + 1),
            std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + 3 * g + 1));
  buffer.collect_retired();
  EXPECT_EQ(buffer.chunk_count(), 4u);
  EXPECT_EQ(this->pool_->statistics().used_current, 4 * g);
  const std::size_t created = this->pool_->statistics().chunks_created;
  buffer.resize(8 * g);  // the four idle chunks come back from the pool
  EXPECT_EQ(this->pool_->statistics().chunks_created, created);
  EXPECT_EQ(this->read(buffer, 0, 3 * g + 1),
            std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + 3 * g + 1));
  buffer.resize(0);
  buffer.collect_retired();
  EXPECT_EQ(buffer.capacity(), 0u);
  EXPECT_EQ(this->pool_->statistics().used_current, 0u);
}

TYPED_TEST(growable_buffers, geometric_chunks_keep_handles_logarithmic_and_slack_under_an_eighth) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make(1024);
  // 512 appends of a quarter chunk each: 128 chunks' worth.
  for (int i = 0; i < 512; ++i) {
    buffer.resize(buffer.size() + g / 4);
    const std::size_t slack = buffer.capacity() - buffer.size();
    ASSERT_LT(slack, std::max(g, buffer.size() / 8 + 1)) << "after append " << i;
  }
  // Each chunk is at least 1/16 of the size it was made for: about 11 chunks a doubling.
  const double doublings = std::log2(static_cast<double>(buffer.size()) / static_cast<double>(g));
  EXPECT_LE(static_cast<double>(buffer.chunk_count()), 8 + 12 * doublings) << buffer.chunk_count();
  EXPECT_LT(buffer.chunk_count(), 128u / 2);
}

TYPED_TEST(growable_buffers, a_fixed_policy_maps_chunks_of_that_size) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make(64, chunk_policy::fixed(2 * g));
  buffer.resize(5 * g);
  EXPECT_EQ(buffer.chunk_count(), 3u);
  EXPECT_EQ(buffer.capacity(), 6 * g);
}

// What the policy says a grow maps is what it maps: small and large grows, grows of several
// of the largest chunks, a grow stopped by the maximum, and a fixed policy, from a fresh pool.
TYPED_TEST(growable_buffers, capacity_after_is_the_capacity_a_grow_maps) {
  const std::size_t g = this->granularity_;
  const std::size_t max = 200 * g;
  for (const chunk_policy policy :
       {chunk_policy::geometric(), chunk_policy::geometric(8, 4 * g), chunk_policy::fixed(3 * g)}) {
    // A pool of its own: chunks another buffer gave back may be of other sizes.
    growable_buffer buffer(chunk_pool::create(this->provider_), {.max_size = max, .policy = policy});
    for (const std::size_t size : {std::size_t{1}, g + 1, 5 * g, 37 * g + 3, 150 * g, 200 * g}) {
      const std::size_t predicted = policy.capacity_after(buffer.capacity(), size, g, max);
      buffer.resize(size);
      EXPECT_EQ(buffer.capacity(), predicted) << "size " << size << ", fixed " << policy.is_fixed();
    }
  }
}

TYPED_TEST(growable_buffers, a_failed_grow_leaves_the_buffer_exactly_as_it_was) {
  const std::size_t g = this->granularity_;
  this->pool_->set_cap(8 * g);
  growable_buffer buffer = this->make(64, chunk_policy::fixed(g));
  buffer.resize(5 * g);
  const auto bytes = pattern(5 * g, 31);
  this->write(buffer, 0, bytes);
  const pool_statistics before = this->pool_->statistics();
  void* const address = buffer.data();
  EXPECT_THROW(buffer.resize(12 * g), out_of_memory);   // the pool's cap
  EXPECT_THROW(buffer.reserve(65 * g), out_of_memory);  // past max_size
  EXPECT_EQ(buffer.data(), address);
  EXPECT_EQ(buffer.size(), 5 * g);
  EXPECT_EQ(buffer.capacity(), 5 * g);
  EXPECT_EQ(buffer.chunk_count(), 5u);
  EXPECT_EQ(this->read(buffer, 0, 5 * g), bytes);
  const pool_statistics after = this->pool_->statistics();
  EXPECT_EQ(after.used_current, before.used_current);
  EXPECT_EQ(after.reserved_current - before.reserved_current, 3 * g);  // idle in the pool now
  buffer.resize(8 * g);  // exactly the cap: works, from the idle chunks
  EXPECT_EQ(this->pool_->statistics().chunks_created, after.chunks_created);
}

TYPED_TEST(growable_buffers, tasks_sharing_a_pool_pass_physical_memory_between_them) {
  // A server: each task reserves address space for its largest size and maps memory only
  // while it needs it. Four tasks of 6 chunks each fit a pool capped at 8 chunks only
  // because each gives its memory back when it is done.
  const std::size_t g = this->granularity_;
  this->pool_->set_cap(8 * g);
  std::vector<growable_buffer> tasks;
  for (int i = 0; i < 4; ++i) tasks.push_back(this->make(6, chunk_policy::fixed(g)));
  for (int round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      tasks[i].resize(6 * g);
      const auto bytes = pattern(6 * g, static_cast<std::uint32_t>(round * 10 + i));
      this->write(tasks[i], 0, bytes);
      ASSERT_EQ(this->read(tasks[i], 0, 6 * g), bytes);
      tasks[i].resize(0);
      tasks[i].collect_retired();
    }
  }
  const pool_statistics s = this->pool_->statistics();
  EXPECT_LE(s.reserved_high, 8 * g);
  EXPECT_EQ(s.used_current, 0u);
  EXPECT_EQ(s.chunks_created, 6u);  // every later task reused the first one's chunks
}

TYPED_TEST(growable_buffers, destruction_and_moves_give_everything_back) {
  const std::size_t g = this->granularity_;
  {
    growable_buffer buffer = this->make(16);
    buffer.resize(5 * g);
    void* const address = buffer.data();
    growable_buffer moved = std::move(buffer);
    EXPECT_EQ(moved.data(), address);
    EXPECT_EQ(moved.size(), 5 * g);
    EXPECT_EQ(buffer.data(), nullptr);  // NOLINT(bugprone-use-after-move): the contract under test
    EXPECT_EQ(buffer.size(), 0u);       // NOLINT(bugprone-use-after-move)
    growable_buffer other = this->make(16);
    other.resize(g);
    other = std::move(moved);
    EXPECT_EQ(other.data(), address);
    EXPECT_EQ(this->pool_->statistics().used_current, other.capacity());
  }
  EXPECT_EQ(this->pool_->statistics().used_current, 0u);
}

TYPED_TEST(growable_buffers, chunk_ranges_must_be_whole_chunks_and_keep_memory_out_of_the_pool) {
  const std::size_t g = this->granularity_;
  std::vector<shared_chunk> kept;
  {
    growable_buffer buffer = this->make(16, chunk_policy::fixed(g));
    buffer.resize(4 * g);
    EXPECT_EQ(buffer.chunks(g, 2 * g).size(), 2u);
    EXPECT_EQ(buffer.chunks(0, 4 * g).size(), 4u);
    EXPECT_THROW((void)buffer.chunks(0, 0), invalid_argument);
    EXPECT_THROW((void)buffer.chunks(g / 2, g), invalid_argument);
    EXPECT_THROW((void)buffer.chunks(g, g + 1), invalid_argument);
    EXPECT_THROW((void)buffer.chunks(3 * g, 2 * g), invalid_argument);
    kept = buffer.chunks(2 * g, g);
  }
  // The buffer is gone, but the chunk someone still holds is not back in the pool.
  EXPECT_EQ(this->pool_->statistics().used_current, g);
  kept.clear();
  EXPECT_EQ(this->pool_->statistics().used_current, 0u);
}

TYPED_TEST(growable_buffers, a_full_pool_spills_onto_the_next_with_one_pointer_throughout) {
  // Two pools capped as if they were two small devices.
  const std::size_t g = this->granularity_;
  this->pool_->set_cap(3 * g);
  auto second = chunk_pool::create(this->provider_, {.cap = 6 * g});
  growable_buffer buffer(this->pool_, {.max_size = 16 * g, .spill_to = {second}});
  buffer.resize(2 * g);
  const auto head = pattern(2 * g, 41);
  this->write(buffer, 0, head);
  void* const address = buffer.data();
  buffer.resize(8 * g);  // 3 chunks' worth in the first pool at most, the rest in the second
  EXPECT_EQ(buffer.data(), address);
  EXPECT_EQ(this->pool_->statistics().used_current, 3 * g);
  EXPECT_EQ(second->statistics().used_current, buffer.capacity() - 3 * g);
  const auto tail = pattern(6 * g, 42);
  this->write(buffer, 2 * g, tail);
  EXPECT_EQ(this->read(buffer, 0, 2 * g), head);
  EXPECT_EQ(this->read(buffer, 2 * g, 6 * g), tail);
  // Past both pools: out of memory, and nothing changed.
  const std::size_t capacity = buffer.capacity();
  EXPECT_THROW(buffer.resize(10 * g), out_of_memory);
  EXPECT_EQ(buffer.capacity(), capacity);
  EXPECT_EQ(second->statistics().used_current, capacity - 3 * g);
  EXPECT_EQ(this->read(buffer, 2 * g, 6 * g), tail);
  EXPECT_THROW(growable_buffer(this->pool_, {.spill_to = {nullptr}}), invalid_argument);
}

TYPED_TEST(growable_buffers, the_default_maximum_is_the_locations_memory) {
  growable_buffer buffer(this->pool_);
  EXPECT_EQ(buffer.max_size(),
            round_up(this->provider_->capabilities().physical_memory_size, this->granularity_));
  EXPECT_THROW(growable_buffer(std::shared_ptr<chunk_pool>{}), invalid_argument);
}

// The geometric policy's chunks: as large as the growth, at least 1/8 of the new size, at
// most the largest chunk (a larger grow maps several); the largest is checked.
TEST(chunk_policies, geometric_chunks_grow_with_the_size_up_to_the_largest_chunk) {
  constexpr std::size_t m = std::size_t{1} << 20;
  const chunk_policy policy = chunk_policy::geometric();
  EXPECT_EQ(policy.next_chunk(0, 1, 2 * m), 2 * m);                  // at least a granule
  EXPECT_EQ(policy.next_chunk(0, 40 * m, 2 * m), 40 * m);            // what the growth asks
  EXPECT_EQ(policy.next_chunk(256 * m, 258 * m, 2 * m), 32 * m);     // 1/8 of the new size
  EXPECT_EQ(policy.next_chunk(4096 * m, 4098 * m, 2 * m), 256 * m);  // capped: 256 MiB
  EXPECT_EQ(policy.next_chunk(0, 1024 * m, 2 * m), 256 * m);         // one of several
  const chunk_policy small = chunk_policy::geometric(8, 5 * m);
  EXPECT_EQ(small.next_chunk(0, 64 * m, 2 * m), 4 * m);  // rounded down to the granularity
  EXPECT_EQ(small.next_chunk(0, 64 * m, 8 * m), 8 * m);  // never below one granule
  EXPECT_THROW((void)chunk_policy::geometric(8, 0).next_chunk(0, m, 2 * m), invalid_argument);
  EXPECT_EQ(chunk_policy::fixed(3 * m).next_chunk(0, 64 * m, 2 * m), 4 * m);
}

// The capacity a grow reaches: several of the largest chunks at once, never past the maximum,
// nothing for a grow that the mapped bytes hold already.
TEST(chunk_policies, capacity_after_counts_the_chunks_the_policy_picks) {
  constexpr std::size_t m = std::size_t{1} << 20;
  const chunk_policy policy = chunk_policy::geometric();
  EXPECT_EQ(policy.capacity_after(0, 1, 2 * m, 1024 * m), 2 * m);
  EXPECT_EQ(policy.capacity_after(0, 1000 * m, 2 * m, 4096 * m), 1000 * m);      // 3 x 256 MiB, then the rest
  EXPECT_EQ(policy.capacity_after(256 * m, 258 * m, 2 * m, 4096 * m), 288 * m);  // 1/8 of the new size
  EXPECT_EQ(policy.capacity_after(0, 1000 * m, 2 * m, 64 * m), 64 * m);          // stopped by the maximum
  EXPECT_EQ(policy.capacity_after(8 * m, 6 * m, 2 * m, 64 * m), 8 * m);          // held already
  EXPECT_EQ(chunk_policy::fixed(3 * m).capacity_after(0, 9 * m, 2 * m, 64 * m), 12 * m);
  EXPECT_THROW((void)chunk_policy::geometric(8, 0).capacity_after(0, m, 2 * m, 64 * m), invalid_argument);
}

}  // namespace
}  // namespace vmm::testing
