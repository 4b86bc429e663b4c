// chunk_view on every provider: aliases see each other's writes, read-only views fault,
// memory lives while any view maps it, re-layout (concatenate, permute, splice), bad arguments.
// Host-side copies through the provider are stream-ordered, so every test stays inside the
// coherency rule of vmm/chunk_view.hpp.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <optional>
#include <set>

#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/chunk_view.hpp"
#include "vmm/error.hpp"

namespace vmm::testing {
namespace {

template <class Kind>
class chunk_views : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->provider_ != nullptr) pool_ = chunk_pool::create(this->provider_);
  }
  // A buffer of `chunks` chunks of one granularity each, filled with pattern(seed).
  growable_buffer filled(std::size_t chunks, std::uint32_t seed) {
    growable_buffer buffer(
        pool_, {.max_size = 16 * this->granularity_, .policy = chunk_policy::fixed(this->granularity_)});
    if (chunks == 0) return buffer;
    buffer.resize(chunks * this->granularity_);
    write(buffer.data(), 0, pattern(buffer.size(), seed));
    return buffer;
  }
  void write(const void* base, std::size_t offset, const std::vector<std::uint8_t>& bytes) {
    write_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(base) + offset, bytes);
  }
  std::vector<std::uint8_t> read(const void* base, std::size_t offset, std::size_t n) {
    return read_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(base) + offset, n);
  }
  // Bytes [first_chunk, first_chunk + count) chunks of pattern(size, seed).
  std::vector<std::uint8_t> chunks_of(const std::vector<std::uint8_t>& bytes, std::size_t first_chunk,
                                      std::size_t count) {
    const auto begin = bytes.begin() + static_cast<std::ptrdiff_t>(first_chunk * this->granularity_);
    return {begin, begin + static_cast<std::ptrdiff_t>(count * this->granularity_)};
  }
  std::size_t used() const { return pool_->statistics().used_current; }

  std::shared_ptr<chunk_pool> pool_;
};
TYPED_TEST_SUITE(chunk_views, all_memory_kinds, memory_kind_names);

TYPED_TEST(chunk_views, writes_through_one_view_are_seen_through_another) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->filled(4, 1);
  const auto bytes = pattern(4 * g, 1);
  chunk_view first = alias(buffer, g, 2 * g);
  chunk_view second = alias(buffer, g, 2 * g);
  ASSERT_NE(first.data(), nullptr);
  EXPECT_NE(first.data(), buffer.data());
  EXPECT_NE(first.data(), second.data());
  EXPECT_EQ(first.size(), 2 * g);
  EXPECT_EQ(first.chunk_count(), 2u);
  EXPECT_EQ(this->read(first.data(), 0, 2 * g), this->chunks_of(bytes, 1, 2));

  // Across the chunk boundary inside the view, and seen through the buffer and the other view.
  const auto update = pattern(g, 2);
  this->write(first.data(), g / 2, update);
  EXPECT_EQ(this->read(buffer.data(), g + g / 2, g), update);
  EXPECT_EQ(this->read(second.data(), g / 2, g), update);
  // And the other way: a write through the buffer is seen through both views.
  const auto back = pattern(g, 3);
  this->write(buffer.data(), 2 * g, back);
  EXPECT_EQ(this->read(first.data(), g, g), back);
  EXPECT_EQ(this->read(second.data(), g, g), back);
  // The chunks outside the alias are untouched.
  EXPECT_EQ(this->read(buffer.data(), 3 * g, g), this->chunks_of(bytes, 3, 1));
  // No physical memory was created for the views.
  EXPECT_EQ(this->used(), 4 * g);
}

TYPED_TEST(chunk_views, a_chunk_listed_twice_is_mapped_twice) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->filled(1, 4);
  const shared_chunk chunk = buffer.chunks(0, g).front();
  chunk_view doubled({chunk, chunk});
  EXPECT_EQ(doubled.size(), 2 * g);
  const auto bytes = pattern(g, 5);
  this->write(doubled.data(), 0, bytes);
  EXPECT_EQ(this->read(doubled.data(), g, g), bytes);
  EXPECT_EQ(this->read(buffer.data(), 0, g), bytes);
  EXPECT_EQ(this->used(), g);
}

TYPED_TEST(chunk_views, each_view_has_its_own_access) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->filled(2, 6);
  chunk_view reader = alias(buffer, 0, 2 * g, access_mode::read_only);
  // The buffer stays writable; the read-only view sees what it writes.
  const auto bytes = pattern(2 * g, 7);
  this->write(buffer.data(), 0, bytes);
  EXPECT_EQ(this->read(reader.data(), 0, 2 * g), bytes);
  // Access can change over the whole view in one call, with explicit grants too.
  std::vector<access_grant> grants;
  for (const accessor& who : this->provider_->capabilities().default_accessors)
    grants.push_back({who, access_mode::read_write});
  reader.set_access(grants);
  const auto more = pattern(g, 8);
  this->write(reader.data(), g, more);
  EXPECT_EQ(this->read(buffer.data(), g, g), more);
  chunk_view granted = alias(buffer, g, g, grants);
  EXPECT_EQ(this->read(granted.data(), 0, g), more);
}

// Runs in a child (a death test re-executes this binary): a write through a read-only view
// faults on the host and poisons the context on the GPU. Returns 0 when the write went
// through; the read-write control proves the child can succeed.
template <class Kind>
int write_through_view_in_child(access_mode mode) {
  std::string reason;
  auto provider = provider_or_skip_reason<Kind>(&reason);
  if (provider == nullptr) return 4;
  const std::size_t g = provider->capabilities().granularity;
  auto pool = chunk_pool::create(provider);
  growable_buffer buffer(pool, {.max_size = 2 * g, .policy = chunk_policy::fixed(g)});
  buffer.resize(2 * g);
  const auto bytes = pattern(2 * g, 9);
  write_bytes(*provider, reinterpret_cast<std::uintptr_t>(buffer.data()), bytes);
  chunk_view view = alias(buffer, 0, 2 * g, mode);
  if (read_bytes(*provider, view.address(), 2 * g) != bytes) return 5;  // reads work
  try {
    provider->executor().fill(view.data(), 0xab, g, {});
    provider->executor().synchronize({});
  } catch (const std::exception&) {
    return 3;
  }
  // The write went through: the buffer sees it.
  if (read_bytes(*provider, reinterpret_cast<std::uintptr_t>(buffer.data()), g) !=
      std::vector<std::uint8_t>(g, 0xab))
    return 6;
  return 0;
}

TYPED_TEST(chunk_views, a_write_through_a_read_only_view_fails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto failed = [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); };
  EXPECT_EXIT(std::_Exit(write_through_view_in_child<TypeParam>(access_mode::read_write)),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(std::_Exit(write_through_view_in_child<TypeParam>(access_mode::read_only)), failed, "");
}

TYPED_TEST(chunk_views, memory_lives_while_any_view_maps_it_in_every_destruction_order) {
  const std::size_t g = this->granularity_;
  const auto bytes = pattern(4 * g, 10);
  // 0: the buffer (chunks 0-3), 1: an alias of chunks 1-2, 2: chunks 3 and 1 (permuted).
  std::array<int, 3> order = {0, 1, 2};
  do {
    std::optional<growable_buffer> buffer(this->filled(4, 10));
    std::optional<chunk_view> middle(alias(*buffer, g, 2 * g));
    const std::size_t indices[] = {3, 1};
    std::optional<chunk_view> permuted(permute(*buffer, indices));
    const std::vector<std::set<std::size_t>> held = {{0, 1, 2, 3}, {1, 2}, {3, 1}};
    std::array<bool, 3> alive = {true, true, true};
    for (int victim : order) {
      if (victim == 0) buffer.reset();
      if (victim == 1) middle.reset();
      if (victim == 2) permuted.reset();
      alive[static_cast<std::size_t>(victim)] = false;
      std::set<std::size_t> still_held;
      for (std::size_t i = 0; i < 3; ++i)
        if (alive[i]) still_held.insert(held[i].begin(), held[i].end());
      ASSERT_EQ(this->used(), still_held.size() * g)
          << "order " << order[0] << order[1] << order[2] << " after destroying " << victim;
      // What is left still reads the original bytes.
      if (middle) {
        ASSERT_EQ(this->read(middle->data(), 0, 2 * g), this->chunks_of(bytes, 1, 2));
      }
      if (permuted) {
        ASSERT_EQ(this->read(permuted->data(), 0, g), this->chunks_of(bytes, 3, 1));
        ASSERT_EQ(this->read(permuted->data(), g, g), this->chunks_of(bytes, 1, 1));
      }
    }
    ASSERT_EQ(this->used(), 0u);
  } while (std::next_permutation(order.begin(), order.end()));
}

TYPED_TEST(chunk_views, concatenate_maps_buffers_back_to_back_without_copying) {
  const std::size_t g = this->granularity_;
  std::vector<growable_buffer> buffers;
  buffers.push_back(this->filled(2, 11));
  buffers.push_back(this->filled(0, 0));  // empty: contributes nothing
  buffers.push_back(this->filled(1, 12));
  buffers.push_back(this->filled(3, 13));
  const std::size_t created = this->pool_->statistics().chunks_created;
  std::vector<const growable_buffer*> list;
  for (const growable_buffer& buffer : buffers) list.push_back(&buffer);
  chunk_view joined = concatenate(list);
  EXPECT_EQ(joined.size(), 6 * g);
  EXPECT_EQ(joined.chunk_count(), 6u);
  std::vector<std::uint8_t> expected;
  for (const auto& [index, seed] : {std::pair<std::size_t, std::uint32_t>{0, 11}, {2, 12}, {3, 13}}) {
    const auto part = pattern(buffers[index].size(), seed);
    expected.insert(expected.end(), part.begin(), part.end());
  }
  EXPECT_EQ(this->read(joined.data(), 0, 6 * g), expected);
  // Writes across the seam between two buffers land in both.
  const auto seam = pattern(g, 14);
  this->write(joined.data(), 2 * g + g / 2, seam);  // the middle of buffer 2, into buffer 3
  EXPECT_EQ(this->read(buffers[2].data(), g / 2, g - g / 2),
            std::vector<std::uint8_t>(seam.begin(), seam.begin() + static_cast<std::ptrdiff_t>(g - g / 2)));
  EXPECT_EQ(this->read(buffers[3].data(), 0, g / 2),
            std::vector<std::uint8_t>(seam.begin() + static_cast<std::ptrdiff_t>(g - g / 2), seam.end()));
  EXPECT_EQ(this->pool_->statistics().chunks_created, created);
}

TYPED_TEST(chunk_views, permute_reorders_and_may_repeat_chunks) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->filled(4, 15);
  const auto bytes = pattern(4 * g, 15);
  const std::size_t order[] = {3, 0, 2, 1, 0};
  chunk_view shuffled = permute(buffer, order);
  ASSERT_EQ(shuffled.size(), 5 * g);
  for (std::size_t i = 0; i < std::size(order); ++i)
    EXPECT_EQ(this->read(shuffled.data(), i * g, g), this->chunks_of(bytes, order[i], 1)) << "chunk " << i;
  // Chunk 0 appears twice: a write to one place is seen at the other.
  const auto update = pattern(g, 16);
  this->write(shuffled.data(), g, update);
  EXPECT_EQ(this->read(shuffled.data(), 4 * g, g), update);
  EXPECT_EQ(this->used(), 4 * g);
}

TYPED_TEST(chunk_views, splice_takes_pieces_of_several_buffers_and_views_of_views) {
  const std::size_t g = this->granularity_;
  growable_buffer a = this->filled(3, 17);
  growable_buffer b = this->filled(2, 18);
  const auto a_bytes = pattern(3 * g, 17);
  const auto b_bytes = pattern(2 * g, 18);
  // b's first chunk spliced between a's first and last two.
  const buffer_slice slices[] = {{&a, 0, g}, {&b, 0, g}, {&a, g, 2 * g}};
  chunk_view spliced = splice(slices);
  ASSERT_EQ(spliced.size(), 4 * g);
  std::vector<std::uint8_t> expected = this->chunks_of(a_bytes, 0, 1);
  for (const auto& part : {this->chunks_of(b_bytes, 0, 1), this->chunks_of(a_bytes, 1, 2)})
    expected.insert(expected.end(), part.begin(), part.end());
  EXPECT_EQ(this->read(spliced.data(), 0, 4 * g), expected);
  // A view of the view: its middle two chunks (b's first, a's second).
  chunk_view inner(spliced.chunks(g, 2 * g), access_mode::read_only);
  EXPECT_EQ(this->read(inner.data(), 0, 2 * g),
            std::vector<std::uint8_t>(expected.begin() + static_cast<std::ptrdiff_t>(g),
                                      expected.begin() + static_cast<std::ptrdiff_t>(3 * g)));
  EXPECT_THROW((void)spliced.chunks(g / 2, g), invalid_argument);
  EXPECT_THROW((void)spliced.chunks(3 * g, 2 * g), invalid_argument);
  EXPECT_EQ(this->used(), 5 * g);
}

// Expects `make` to throw vmm::invalid_argument whose message holds `words`.
template <class Fn>
void expect_refused(Fn&& make, const std::string& words) {
  try {
    (void)make();
    ADD_FAILURE() << "no exception; expected one saying \"" << words << "\"";
  } catch (const invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
  }
}

TYPED_TEST(chunk_views, bad_arguments_are_refused_and_leave_nothing_behind) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->filled(4, 19);
  growable_buffer odd = this->filled(2, 20);
  odd.resize(g + 1);  // its size ends inside its second chunk
  expect_refused([&] { return alias(buffer, g / 2, g); }, "not on chunk boundaries");  // misaligned
  expect_refused([&] { return alias(buffer, g, g + 1); }, "not on chunk boundaries");
  expect_refused([&] { return alias(buffer, 3 * g, 2 * g); }, "runs past");  // past the end
  expect_refused([&] { return alias(buffer, 5 * g, g); }, "runs past");
  expect_refused([&] { return alias(buffer, g, 0); }, "length 0");  // zero-length view
  expect_refused([&] { return chunk_view(std::vector<shared_chunk>{}); }, "length 0");
  expect_refused([&] { return chunk_view(std::vector<shared_chunk>{nullptr}); }, "empty");
  expect_refused([&] { return alias(buffer, 0, g, std::span<const access_grant>{}); }, "no grants");
  const std::size_t past[] = {0, 4};
  expect_refused([&] { return permute(buffer, past); }, "chunk 4");
  expect_refused([&] { return permute(buffer, std::span<const std::size_t>{}); }, "length 0");
  expect_refused([&] { return splice(std::span<const buffer_slice>{}); }, "length 0");
  const buffer_slice null_slice[] = {{nullptr, 0, g}};
  expect_refused([&] { return splice(null_slice); }, "null");
  const buffer_slice bad_slices[] = {{&buffer, 0, g}, {&buffer, g / 2, g}};
  expect_refused([&] { return splice(bad_slices); }, "slice 1 of 2");
  growable_buffer empty = this->filled(0, 0);
  const growable_buffer* nothing[] = {&empty};
  expect_refused([&] { return concatenate(nothing); }, "no bytes");
  const growable_buffer* uneven[] = {&buffer, &odd};
  expect_refused([&] { return concatenate(uneven); }, "buffer 1 of 2");
  chunk_view none;
  EXPECT_THROW(none.set_access(access_mode::read_write), invalid_argument);
  EXPECT_EQ(none.data(), nullptr);
  EXPECT_EQ(none.size(), 0u);

  // Chunks of two providers: the message names both locations.
  auto other_pool = chunk_pool::create(make_os_host_provider({.granularity = g}));  // another provider object
  growable_buffer foreign(other_pool, {.max_size = 4 * g, .policy = chunk_policy::fixed(g)});
  foreign.resize(2 * g);
  const growable_buffer* mixed[] = {&buffer, &foreign};
  expect_refused([&] { return concatenate(mixed); },
                 "comes from os host but chunk 0 from " + to_string(this->provider_->capabilities().where));
  // A grant the provider cannot give: the mappings made are undone.
  const access_grant foreign_grant[] = {{accessor::device(1 << 20), access_mode::read_write}};
  EXPECT_ANY_THROW((void)alias(buffer, 0, 2 * g, foreign_grant));

  // Nothing was left mapped or held: the buffer's chunks can still be viewed and read.
  EXPECT_EQ(this->used(), 4 * g + 2 * g);
  chunk_view whole = alias(buffer, 0, 4 * g);
  EXPECT_EQ(this->read(whole.data(), 0, 4 * g), pattern(4 * g, 19));
}

TYPED_TEST(chunk_views, moves_hand_over_the_mapping_and_assignment_lets_go_of_the_old_one) {
  const std::size_t g = this->granularity_;
  std::optional<growable_buffer> buffer(this->filled(3, 21));
  chunk_view first = alias(*buffer, 0, g);
  chunk_view second = alias(*buffer, g, 2 * g);
  buffer.reset();
  EXPECT_EQ(this->used(), 3 * g);
  void* const address = second.data();
  chunk_view moved = std::move(second);
  EXPECT_EQ(moved.data(), address);
  EXPECT_EQ(second.data(), nullptr);    // NOLINT(bugprone-use-after-move): the contract under test
  EXPECT_EQ(second.chunk_count(), 0u);  // NOLINT(bugprone-use-after-move)
  first = std::move(moved);             // first's chunk goes back to the pool
  EXPECT_EQ(first.data(), address);
  EXPECT_EQ(this->used(), 2 * g);
  EXPECT_EQ(this->read(first.data(), g, g), this->chunks_of(pattern(3 * g, 21), 2, 1));
}

}  // namespace
}  // namespace vmm::testing
