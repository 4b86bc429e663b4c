// device_vector<T> on every provider: contents, stable address, zeroed and uninitialized
// growth, reserve, shrink, rollback of failed growth, geometric chunks.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <list>
#include <numeric>

#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/retirement.hpp"
#include "vmm/error.hpp"

namespace vmm::testing {
namespace {

// Iterators are raw pointers: thrust and kernels take them as they are.
static_assert(std::is_same_v<device_vector<int>::iterator, int*>);
static_assert(std::is_same_v<device_vector<int>::const_iterator, const int*>);

// 12 bytes: elements straddle chunk boundaries.
struct record {
  std::uint32_t key;
  std::uint32_t value;
  std::uint32_t check;
  friend bool operator==(const record&, const record&) = default;
};
static_assert(sizeof(record) == 12);

std::vector<record> records(std::size_t first, std::size_t count) {
  std::vector<record> result;
  for (std::size_t i = first; i < first + count; ++i) {
    const auto key = static_cast<std::uint32_t>(i);
    result.push_back({key, key * 2654435761u + 1, ~key});
  }
  return result;
}

// Non-zero in every element.
std::vector<std::uint32_t> non_zero_words(std::size_t count, std::uint32_t seed) {
  std::vector<std::uint32_t> words(count);
  for (std::size_t i = 0; i < count; ++i)
    words[i] = (static_cast<std::uint32_t>(i) * 2654435761u + seed) | 0x80000000u;
  return words;
}

template <class T>
std::vector<T> prefix(const std::vector<T>& values, std::size_t count) {
  return {values.begin(), values.begin() + static_cast<std::ptrdiff_t>(count)};
}

template <class Kind>
class device_vectors : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->provider_ != nullptr) pool_ = chunk_pool::create(this->provider_);
  }
  template <class T>
  device_vector<T> make(std::size_t max_chunks, chunk_policy policy = chunk_policy::geometric()) {
    return device_vector<T>(pool_, {.max_size = max_chunks * this->granularity_, .policy = policy});
  }
  // Elements of T in one granule.
  template <class T>
  std::size_t per_chunk() const {
    return this->granularity_ / sizeof(T);
  }
  std::shared_ptr<chunk_pool> pool_;
};
TYPED_TEST_SUITE(device_vectors, all_memory_kinds, memory_kind_names);

TYPED_TEST(device_vectors, push_back_keeps_every_value_and_the_address) {
  auto vector = this->template make<std::uint64_t>(16);
  const std::uint64_t* const address = vector.data();
  ASSERT_NE(address, nullptr);
  EXPECT_TRUE(vector.empty());
  EXPECT_EQ(vector.capacity(), 0u);
  std::vector<std::uint64_t> expected;
  std::size_t capacity_changes = 0;
  for (std::uint64_t i = 0; i < 10000; ++i) {
    const std::size_t capacity = vector.capacity();
    vector.push_back(i * i + 7);
    expected.push_back(i * i + 7);
    if (vector.capacity() != capacity) ++capacity_changes;
    ASSERT_EQ(vector.data(), address);
    ASSERT_EQ(vector.size(), expected.size());
    ASSERT_GE(vector.capacity(), vector.size());
  }
  EXPECT_EQ(vector.to_host(), expected);
  // The raw memory agrees with to_host().
  const auto bytes = read_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(address),
                                expected.size() * sizeof(std::uint64_t));
  EXPECT_EQ(std::memcmp(bytes.data(), expected.data(), bytes.size()), 0);
  // 80000 bytes fit in one granule: one chunk, mapped once, for 10000 push_backs.
  EXPECT_EQ(vector.chunk_count(), 1u);
  EXPECT_EQ(capacity_changes, 1u);
  const pool_statistics s = this->pool_->statistics();
  EXPECT_EQ(s.chunks_created, 1u);
  EXPECT_EQ(s.used_current, vector.capacity() * sizeof(std::uint64_t));
  EXPECT_EQ(vector.pool(), this->pool_);
  EXPECT_EQ(vector.provider(), this->provider_);
}

TYPED_TEST(device_vectors, append_copies_host_ranges_across_chunk_boundaries) {
  const std::size_t n = this->template per_chunk<record>();
  auto vector = this->template make<record>(32);
  const record* const address = vector.data();
  std::vector<record> expected;
  auto check = [&](const char* step) {
    SCOPED_TRACE(step);
    ASSERT_EQ(vector.data(), address);
    ASSERT_EQ(vector.size(), expected.size());
    ASSERT_EQ(vector.to_host(), expected);
  };
  for (std::size_t count : {n / 3, n, 5 * n / 2, std::size_t{1}, std::size_t{7}, 3 * n + 5}) {
    const auto batch = records(expected.size(), count);
    vector.append(std::span<const record>(batch));
    expected.insert(expected.end(), batch.begin(), batch.end());
    check("span");
  }
  const auto contiguous = records(expected.size(), n + 3);
  vector.append(contiguous.begin(), contiguous.end());
  expected.insert(expected.end(), contiguous.begin(), contiguous.end());
  check("contiguous iterators");
  const auto listed = records(expected.size(), n / 2 + 1);
  const std::list<record> list(listed.begin(), listed.end());
  vector.append(list.begin(), list.end());
  expected.insert(expected.end(), listed.begin(), listed.end());
  check("list iterators (gathered on the host)");
  const std::size_t size = vector.size();
  const std::size_t capacity = vector.capacity();
  vector.append(std::span<const record>{});
  EXPECT_EQ(vector.size(), size);
  EXPECT_EQ(vector.capacity(), capacity);
}

TYPED_TEST(device_vectors, append_converts_elements_of_another_type) {
  auto vector = this->template make<std::int64_t>(4);
  const std::deque<int> values = {-3, 5, 1 << 30, -(1 << 30)};
  vector.append(values.begin(), values.end());
  EXPECT_EQ(vector.to_host(), (std::vector<std::int64_t>{-3, 5, 1 << 30, -(1 << 30)}));
}

TYPED_TEST(device_vectors, zeroed_growth_is_zero_over_memory_that_held_data) {
  const std::size_t n = this->template per_chunk<std::uint32_t>();
  auto vector = this->template make<std::uint32_t>(16);
  const std::uint32_t* const address = vector.data();
  const auto words = non_zero_words(3 * n, 11);
  vector.append(std::span<const std::uint32_t>(words));
  const std::size_t capacity = vector.capacity();

  // Shrinking keeps the memory (and the pattern in it); growing again zeroed must clear it.
  vector.resize(n / 2, element_init::zeroed);
  EXPECT_EQ(vector.capacity(), capacity);
  EXPECT_EQ(vector.to_host(), prefix(words, n / 2));
  vector.resize(3 * n, element_init::zeroed);
  EXPECT_EQ(vector.capacity(), capacity);  // no memory mapped: only the fill
  EXPECT_EQ(vector.data(), address);
  std::vector<std::uint32_t> expected = prefix(words, n / 2);
  expected.resize(3 * n, 0);
  EXPECT_EQ(vector.to_host(), expected);

  // Past the capacity, over chunks that come back from the shrink or the pool.
  vector.append(std::span<const std::uint32_t>(words));  // 6n of pattern and zeros
  const std::size_t grown = vector.capacity();
  vector.resize(1, element_init::zeroed);
  vector.shrink_to_fit();
  EXPECT_LT(vector.capacity(), grown);
  vector.resize(6 * n + 5, element_init::zeroed);
  expected.assign(6 * n + 5, 0);
  expected[0] = words[0];
  EXPECT_EQ(vector.data(), address);
  EXPECT_EQ(vector.to_host(), expected);

  vector.clear();
  vector.resize(2 * n, element_init::zeroed);
  EXPECT_EQ(vector.to_host(), std::vector<std::uint32_t>(2 * n, 0));
}

TYPED_TEST(device_vectors, uninitialized_growth_writes_nothing_and_keeps_the_prefix) {
  const std::size_t n = this->template per_chunk<std::uint32_t>();
  auto vector = this->template make<std::uint32_t>(16);
  const auto words = non_zero_words(2 * n, 5);
  vector.append(std::span<const std::uint32_t>(words));
  vector.clear();
  // The memory stays mapped, so what was there is still there: nothing was written.
  vector.resize(2 * n, element_init::uninitialized);
  EXPECT_EQ(vector.to_host(), words);
  // Growing past the capacity keeps the elements already there.
  const std::uint32_t* const address = vector.data();
  vector.resize(vector.capacity() + n, element_init::uninitialized);
  EXPECT_EQ(vector.data(), address);
  EXPECT_EQ(prefix(vector.to_host(), 2 * n), words);
}

TYPED_TEST(device_vectors, reserve_maps_ahead_so_later_growth_maps_nothing) {
  const std::size_t n = this->template per_chunk<record>();
  auto vector = this->template make<record>(16);
  vector.reserve(5 * n);
  EXPECT_EQ(vector.size(), 0u);
  EXPECT_GE(vector.capacity(), 5 * n);
  const std::size_t capacity = vector.capacity();
  const std::size_t chunks = vector.chunk_count();
  const std::size_t created = this->pool_->statistics().chunks_created;
  const record* const address = vector.data();
  const auto batch = records(0, 4 * n);
  vector.append(std::span<const record>(batch));
  std::vector<record> expected = batch;
  for (const record& r : records(4 * n, n)) {
    vector.push_back(r);
    expected.push_back(r);
  }
  vector.resize(capacity, element_init::zeroed);
  expected.resize(capacity, record{0, 0, 0});
  EXPECT_EQ(vector.capacity(), capacity);
  EXPECT_EQ(vector.chunk_count(), chunks);
  EXPECT_EQ(this->pool_->statistics().chunks_created, created);
  EXPECT_EQ(vector.data(), address);
  EXPECT_EQ(vector.to_host(), expected);
  vector.reserve(1);  // smaller than the capacity: nothing happens
  EXPECT_EQ(vector.capacity(), capacity);
}

// The geometric policy maps at least 1/8 of the new size per chunk; reserve_exact maps only
// what the count needs, in whole granules, and keeps the elements and the address.
TYPED_TEST(device_vectors, reserve_exact_maps_no_more_than_the_count_needs) {
  const std::size_t n = this->template per_chunk<std::uint64_t>();
  auto exact = this->template make<std::uint64_t>(64);
  auto amortized = this->template make<std::uint64_t>(64);
  for (auto* vector : {&exact, &amortized}) vector->reserve(18 * n);  // one chunk of 18 granules
  const std::vector<std::uint64_t> values(18 * n, 7);
  exact.append(std::span<const std::uint64_t>(values));
  const std::uint64_t* const address = exact.data();
  exact.reserve_exact(18 * n + 1);
  amortized.reserve(18 * n + 1);
  EXPECT_EQ(exact.capacity(), 19 * n) << "one granule more";
  EXPECT_EQ(amortized.capacity(), 20 * n) << "the policy's slack: bit_floor(size / 8) = 2 granules";
  EXPECT_EQ(exact.data(), address);
  EXPECT_EQ(exact.to_host(), values);
  exact.reserve_exact(5);  // below the capacity: nothing happens
  EXPECT_EQ(exact.capacity(), 19 * n);
  EXPECT_THROW(exact.reserve_exact(64 * n + 1), out_of_memory);
  EXPECT_EQ(exact.capacity(), 19 * n);
}

TYPED_TEST(device_vectors, shrink_to_fit_gives_capacity_back_and_keeps_the_elements) {
  const std::size_t n = this->template per_chunk<record>();
  auto vector = this->template make<record>(16, chunk_policy::fixed(this->granularity_));
  const auto values = records(0, 5 * n + 7);
  vector.append(std::span<const record>(values));
  EXPECT_EQ(vector.chunk_count(), 6u);
  vector.resize(n + 1, element_init::uninitialized);
  EXPECT_EQ(vector.capacity(), 6 * this->granularity_ / sizeof(record));  // kept on resize
  vector.shrink_to_fit();
  EXPECT_EQ(vector.capacity(), 2 * this->granularity_ / sizeof(record));  // n + 1 needs two
  EXPECT_EQ(vector.size(), n + 1);
  EXPECT_EQ(vector.to_host(), prefix(values, n + 1));
  // Growing again takes the chunks back (retired or idle in the pool): nothing is created.
  const std::size_t created = this->pool_->statistics().chunks_created;
  const record* const address = vector.data();
  const auto more = records(n + 1, 3 * n);
  vector.append(std::span<const record>(more));
  EXPECT_EQ(this->pool_->statistics().chunks_created, created);
  EXPECT_EQ(vector.data(), address);
  std::vector<record> expected = prefix(values, n + 1);
  expected.insert(expected.end(), more.begin(), more.end());
  EXPECT_EQ(vector.to_host(), expected);
}

TYPED_TEST(device_vectors, clear_keeps_the_capacity_and_the_address) {
  auto vector = this->template make<int>(4);
  for (int i = 0; i < 1000; ++i) vector.push_back(i);
  const std::size_t capacity = vector.capacity();
  const int* const address = vector.data();
  vector.clear();
  EXPECT_TRUE(vector.empty());
  EXPECT_EQ(vector.begin(), vector.end());
  EXPECT_EQ(vector.capacity(), capacity);
  EXPECT_EQ(vector.data(), address);
  vector.push_back(42);
  EXPECT_EQ(vector.to_host(), std::vector<int>{42});
  EXPECT_EQ(vector.end() - vector.begin(), 1);
}

TYPED_TEST(device_vectors, a_failed_growth_leaves_the_vector_exactly_as_it_was) {
  const std::size_t g = this->granularity_;
  const std::size_t n = this->template per_chunk<std::uint32_t>();
  auto pool = chunk_pool::create(this->provider_, {.cap = 3 * g});
  device_vector<std::uint32_t> vector(pool, {.max_size = 16 * g});
  const auto words = non_zero_words(3 * n, 3);
  vector.append(std::span<const std::uint32_t>(words));  // one chunk of 3g: the whole cap
  ASSERT_EQ(vector.capacity(), 3 * n);
  vector.resize(3 * n - 10, element_init::uninitialized);  // a little room is left

  const std::uint32_t* const address = vector.data();
  const std::size_t size = vector.size();
  const std::size_t capacity = vector.capacity();
  const std::size_t chunks = vector.chunk_count();
  const std::vector<std::uint32_t> contents = vector.to_host();
  const std::size_t used = pool->statistics().used_current;
  auto expect_unchanged = [&](const char* step) {
    SCOPED_TRACE(step);
    EXPECT_EQ(vector.data(), address);
    EXPECT_EQ(vector.size(), size);
    EXPECT_EQ(vector.capacity(), capacity);
    EXPECT_EQ(vector.chunk_count(), chunks);
    EXPECT_EQ(vector.to_host(), contents);
    EXPECT_EQ(pool->statistics().used_current, used);
  };
  const auto batch = non_zero_words(20, 9);
  EXPECT_THROW(vector.append(std::span<const std::uint32_t>(batch)), out_of_memory);
  expect_unchanged("append past the cap");
  EXPECT_THROW(vector.resize(capacity + 1, element_init::zeroed), out_of_memory);
  expect_unchanged("zeroed resize past the cap");
  EXPECT_THROW(vector.resize(capacity + n, element_init::uninitialized), out_of_memory);
  expect_unchanged("uninitialized resize past the cap");
  EXPECT_THROW(vector.reserve(capacity + 1), out_of_memory);
  expect_unchanged("reserve past the cap");
  EXPECT_THROW(vector.reserve(vector.max_size() + 1), out_of_memory);
  expect_unchanged("reserve past max_size");
  EXPECT_THROW(vector.resize(std::numeric_limits<std::size_t>::max(), element_init::zeroed), out_of_memory);
  expect_unchanged("resize to SIZE_MAX");

  vector.resize(capacity, element_init::zeroed);  // the room that was left still works
  EXPECT_THROW(vector.push_back(1), out_of_memory);
  EXPECT_EQ(vector.size(), capacity);
  EXPECT_EQ(vector.chunk_count(), chunks);
  EXPECT_EQ(vector.data(), address);
  EXPECT_EQ(prefix(vector.to_host(), size), contents);
}

TYPED_TEST(device_vectors, growth_maps_chunks_geometrically_with_bounded_slack) {
  const std::size_t g = this->granularity_;
  auto vector = this->template make<std::uint64_t>(64);
  const std::size_t batch_size = g / 4 / sizeof(std::uint64_t);
  const std::vector<std::uint64_t> batch(batch_size, 0x0123456789abcdefu);
  std::size_t capacity_changes = 0;
  for (int i = 0; i < 128; ++i) {  // 32 granules' worth, a quarter granule at a time
    const std::size_t before = vector.capacity();
    vector.append(std::span<const std::uint64_t>(batch));
    const std::size_t after = vector.capacity();
    if (after == before) continue;
    ++capacity_changes;
    // Each new chunk is one granule, or more than 1/16 of the size it was mapped for.
    const std::size_t bytes = vector.size() * sizeof(std::uint64_t);
    const std::size_t added = (after - before) * sizeof(std::uint64_t);
    ASSERT_TRUE(added == g || added * 16 > bytes) << "append " << i << ": " << added;
    const std::size_t slack = after * sizeof(std::uint64_t) - bytes;
    ASSERT_LT(slack, std::max(g, bytes / 8 + 1)) << "append " << i;
  }
  EXPECT_EQ(vector.chunk_count(), capacity_changes);  // one chunk per growth
  EXPECT_EQ(this->pool_->statistics().chunks_created, capacity_changes);
  const double doublings = std::log2(static_cast<double>(vector.size() * sizeof(std::uint64_t) / g));
  EXPECT_LE(static_cast<double>(vector.chunk_count()), 8 + 12 * doublings);
  EXPECT_LT(vector.chunk_count(), 128u / 4);  // appends per chunk mapped: more than 4
}

TYPED_TEST(device_vectors, moves_keep_the_address_and_destruction_gives_the_memory_back) {
  {
    auto vector = this->template make<int>(4);
    const auto values = non_zero_words(1000, 1);
    for (std::uint32_t v : values) vector.push_back(static_cast<int>(v));
    const int* const address = vector.data();
    device_vector<int> moved = std::move(vector);
    EXPECT_EQ(moved.data(), address);
    EXPECT_EQ(moved.size(), 1000u);
    EXPECT_EQ(vector.data(), nullptr);  // NOLINT(bugprone-use-after-move): the contract under test
    EXPECT_EQ(vector.size(), 0u);       // NOLINT(bugprone-use-after-move)
    auto other = this->template make<int>(4);
    other.push_back(1);
    other = std::move(moved);
    EXPECT_EQ(other.data(), address);
    EXPECT_EQ(other.size(), 1000u);
    EXPECT_EQ(other.to_host().back(), static_cast<int>(values.back()));
    // other's first chunk was retired in stream order: it is back once the stream passed
    // its point and the retirements are collected (to_host() waited for the stream).
    collect_retired();
    EXPECT_EQ(this->pool_->statistics().used_current, other.capacity() * sizeof(int));
  }
  collect_retired(/*wait=*/true);
  EXPECT_EQ(this->pool_->statistics().used_current, 0u);
}

TYPED_TEST(device_vectors, copies_to_and_from_host_check_their_ranges) {
  auto vector = this->template make<int>(4);
  vector.resize(10, element_init::zeroed);
  const std::vector<int> three = {7, 8, 9};
  vector.copy_from_host(2, three);
  EXPECT_EQ(vector.to_host(), (std::vector<int>{0, 0, 7, 8, 9, 0, 0, 0, 0, 0}));
  std::vector<int> out(4, -1);
  vector.copy_to_host(1, out);
  EXPECT_EQ(out, (std::vector<int>{0, 7, 8, 9}));
  vector.copy_to_host(10, std::span<int>{});  // empty, at the end: fine
  EXPECT_THROW(vector.copy_from_host(8, three), invalid_argument);
  EXPECT_THROW(vector.copy_to_host(11, std::span<int>{}), invalid_argument);
  EXPECT_THROW(vector.copy_to_host(7, out), invalid_argument);
  EXPECT_EQ(vector.to_host(), (std::vector<int>{0, 0, 7, 8, 9, 0, 0, 0, 0, 0}));
}

TYPED_TEST(device_vectors, a_location_uses_its_default_pool_and_the_options) {
  const std::size_t g = this->granularity_;
  device_vector<double> vector(TypeParam::where(), {.max_size = 3 * g + 1});
  EXPECT_EQ(vector.pool(), default_pool(TypeParam::where()));
  EXPECT_EQ(vector.max_size(), 4 * g / sizeof(double));  // rounded up to the granularity
  EXPECT_EQ(vector.stream(), nullptr);
  vector.push_back(2.5);
  vector.push_back(-1.0);
  EXPECT_EQ(vector.to_host(), (std::vector<double>{2.5, -1.0}));
  EXPECT_THROW(device_vector<int>(std::shared_ptr<chunk_pool>{}), invalid_argument);
}

// The growth rule at a scale where it shows: 4 KiB granules, 200000 push_backs (1.6 MB).
TEST(device_vector_growth, push_back_maps_a_chunk_only_every_sixteenth_of_growth) {
  constexpr std::size_t g = 4096;
  auto pool = chunk_pool::create(make_os_host_provider({.granularity = g}));
  device_vector<std::uint64_t> vector(pool, {.max_size = 4 << 20});
  std::size_t capacity_changes = 0;
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const std::size_t before = vector.capacity();
    vector.push_back(i);
    const std::size_t after = vector.capacity();
    if (after == before) continue;
    ++capacity_changes;
    const std::size_t added = (after - before) * sizeof(std::uint64_t);
    ASSERT_TRUE(added == g || added * 16 > vector.size() * sizeof(std::uint64_t))
        << "push_back " << i << ": " << added << " bytes added";
  }
  const std::size_t bytes = vector.size() * sizeof(std::uint64_t);
  EXPECT_EQ(vector.chunk_count(), capacity_changes);
  const double doublings = std::log2(static_cast<double>(bytes) / g);
  EXPECT_LE(static_cast<double>(vector.chunk_count()), 8 + 12 * doublings);
  EXPECT_LT(vector.chunk_count(), bytes / g / 4);  // a granule at a time would map 391
  const std::vector<std::uint64_t> host = vector.to_host();
  std::vector<std::uint64_t> expected(200000);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(host, expected);
}

}  // namespace
}  // namespace vmm::testing
