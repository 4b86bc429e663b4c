// memory_resource on every provider: sizes and alignments, statistics after every
// operation, bad input, out of memory, trim, access, stitching, a randomized run checked
// against a model, and many threads.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <chrono>
#include <limits>
#include <random>
#include <thread>

#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "resource/host_copies.hpp"
#include "vmm/error.hpp"
#include "vmm/memory_resource.hpp"

namespace vmm::testing {
namespace {

constexpr std::size_t kib = 1024;
constexpr std::size_t mib = 1024 * kib;

std::size_t rounded(std::size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

template <class Kind>
class memory_resources : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->provider_ != nullptr) pool_ = chunk_pool::create(this->provider_);
  }
  // A resource of its own pool, bounded so that tests never take a machine's memory.
  std::unique_ptr<memory_resource> make(memory_resource_properties properties = {},
                                        reuse_policies policies = {}) {
    if (properties.max_size == 0) properties.max_size = 256 * mib;
    return std::make_unique<memory_resource>(pool_, properties, policies);
  }
  void write(void* p, const std::vector<std::uint8_t>& bytes) {
    write_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(p), bytes);
  }
  std::vector<std::uint8_t> read(const void* p, std::size_t n) {
    return read_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(p), n);
  }
  std::shared_ptr<chunk_pool> pool_;
};
TYPED_TEST_SUITE(memory_resources, all_memory_kinds, memory_kind_names);

TYPED_TEST(memory_resources, any_size_is_aligned_usable_and_counted_exactly) {
  auto resource = this->make();
  std::vector<std::pair<void*, std::size_t>> held;
  std::size_t used = 0;
  for (std::size_t bytes : {std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{257}, 3 * kib,
                            mib - 1, mib, 3 * mib + 5, 17 * mib}) {
    void* p = resource->allocate({}, bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u) << bytes;
    const auto pattern_bytes = pattern(bytes, static_cast<std::uint32_t>(bytes));
    this->write(p, pattern_bytes);
    EXPECT_EQ(this->read(p, bytes), pattern_bytes);
    held.emplace_back(p, bytes);
    used += rounded(bytes);
    const memory_resource_statistics s = resource->statistics();
    EXPECT_EQ(s.used_current, used);
    EXPECT_EQ(s.allocations, held.size());
    EXPECT_GE(s.reserved_current, s.used_current);
    EXPECT_EQ(s.reserved_current % this->granularity_, 0u);
  }
  for (auto [p, bytes] : held) {
    resource->deallocate({}, p, bytes);
    used -= rounded(bytes);
    EXPECT_EQ(resource->statistics().used_current, used);
  }
  const memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.allocations_total, held.size());
  EXPECT_EQ(s.used_high, std::accumulate(held.begin(), held.end(), std::size_t{0},
                                         [](std::size_t sum, auto& h) { return sum + rounded(h.second); }));
  EXPECT_EQ(s.bad_deallocations, 0u);
}

TYPED_TEST(memory_resources, alignments_up_to_the_granularity_are_kept) {
  auto resource = this->make();
  for (std::size_t alignment = 1; alignment <= this->granularity_; alignment *= 4) {
    void* p = resource->allocate({}, 1000, alignment);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % std::max<std::size_t>(alignment, 256), 0u) << alignment;
    resource->deallocate({}, p, 1000, alignment);
  }
  void* p = resource->allocate({}, 5000, this->granularity_);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % this->granularity_, 0u);
  resource->deallocate({}, p, 5000, this->granularity_);
}

TYPED_TEST(memory_resources, zero_bytes_is_nullptr_and_freeing_nullptr_does_nothing) {
  auto resource = this->make();
  EXPECT_EQ(resource->allocate({}, 0), nullptr);
  resource->deallocate({}, nullptr, 0);
  resource->deallocate({}, nullptr, 100);
  const memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.allocations_total, 0u);
  EXPECT_EQ(s.bad_deallocations, 0u);
}

TYPED_TEST(memory_resources, bad_input_is_refused_and_changes_nothing) {
  auto resource = this->make();
  auto other = this->make();
  void* p = resource->allocate({}, 4 * kib);
  const memory_resource_statistics before = resource->statistics();
  EXPECT_THROW((void)resource->allocate({}, 100, 3), invalid_argument);
  EXPECT_THROW((void)resource->allocate({}, 100, 2 * this->granularity_), invalid_argument);
  EXPECT_THROW((void)resource->allocate({}, ~std::size_t{0}), invalid_argument);
  EXPECT_THROW((void)resource->allocate({}, std::size_t{1} << 50), invalid_argument);
  // Refused deallocations are reported and counted, never thrown (deallocate is noexcept).
  const auto quiet = set_cleanup_failure_handler([](const char*) noexcept {});
  int x = 0;
  resource->deallocate({}, &x, 4);                             // not this resource's
  resource->deallocate({}, static_cast<char*>(p) + 256, 256);  // inside an allocation
  resource->deallocate({}, p, 8 * kib);                        // another size
  void* q = other->allocate({}, 4 * kib);
  resource->deallocate({}, q, 4 * kib);  // another resource's
  set_cleanup_failure_handler(quiet);
  memory_resource_statistics after = resource->statistics();
  EXPECT_EQ(after.bad_deallocations, 4u);
  after.bad_deallocations = before.bad_deallocations;
  EXPECT_EQ(after.used_current, before.used_current);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.reserved_current, before.reserved_current);
  // p is still live and whole: a double free after the real one is refused too.
  const auto bytes = pattern(4 * kib, 9);
  this->write(p, bytes);
  EXPECT_EQ(this->read(p, 4 * kib), bytes);
  resource->deallocate({}, p, 4 * kib);
  set_cleanup_failure_handler([](const char*) noexcept {});
  resource->deallocate({}, p, 4 * kib);
  set_cleanup_failure_handler(quiet);
  EXPECT_EQ(resource->statistics().bad_deallocations, 5u);
  EXPECT_EQ(resource->statistics().allocations, 0u);
  other->deallocate({}, q, 4 * kib);
  EXPECT_TRUE(resource->owns(p));
  EXPECT_FALSE(resource->owns(q));
}

TYPED_TEST(memory_resources, out_of_memory_says_the_numbers_and_leaves_the_resource_intact) {
  const std::size_t g = this->granularity_;
  auto resource = this->make({.max_size = 8 * g});
  void* a = resource->allocate({}, 5 * g);
  const memory_resource_statistics before = resource->statistics();
  try {
    (void)resource->allocate({}, 4 * g);
    ADD_FAILURE() << "no out_of_memory";
  } catch (const out_of_memory& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(std::to_string(4 * g) + " bytes requested"), std::string::npos) << message;
    EXPECT_NE(message.find("reserved"), std::string::npos) << message;
    EXPECT_NE(message.find("largest free run"), std::string::npos) << message;
  }
  const memory_resource_statistics after = resource->statistics();
  EXPECT_EQ(after.used_current, before.used_current);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.reserved_current, before.reserved_current);
  // What fits still fits.
  void* b = resource->allocate({}, 3 * g);
  resource->deallocate({}, b, 3 * g);
  resource->deallocate({}, a, 5 * g);
  void* c = resource->allocate({}, 8 * g);
  resource->deallocate({}, c, 8 * g);
}

// The statistics a refused request must leave as they were: no address range, no page.
void expect_unchanged(const memory_resource_statistics& before, const memory_resource_statistics& after) {
  EXPECT_EQ(after.segments, before.segments);
  EXPECT_EQ(after.largest_free_block, before.largest_free_block);
  EXPECT_EQ(after.reserved_current, before.reserved_current);
  EXPECT_EQ(after.used_current, before.used_current);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.allocations_total, before.allocations_total);
  EXPECT_EQ(after.handles, before.handles);
  EXPECT_EQ(after.pages_created, before.pages_created);
}

TYPED_TEST(memory_resources, a_request_past_max_size_leaves_no_address_range_behind) {
  auto resource = this->make({.max_size = 64 * mib});
  // Before the stream's first allocation: not even its arenas are made.
  EXPECT_THROW((void)resource->allocate({}, std::size_t{1} << 40), out_of_memory);
  EXPECT_EQ(resource->statistics().segments, 0u);
  void* p = resource->allocate({}, 4 * kib);
  const memory_resource_statistics before = resource->statistics();
  void* q = nullptr;
  for (const std::size_t bytes : {std::size_t{1} << 40, 64 * mib + 1, 61 * mib}) {
    if (bytes == 61 * mib) q = resource->allocate({}, 4 * mib);  // 61 MiB more cannot fit now
    const memory_resource_statistics now = resource->statistics();
    try {
      (void)resource->allocate({}, bytes);
      ADD_FAILURE() << "no out_of_memory for " << bytes << " bytes";
    } catch (const out_of_memory& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(std::to_string(bytes) + " bytes requested"), std::string::npos) << message;
      EXPECT_NE(message.find("max_size"), std::string::npos) << message;
    }
    expect_unchanged(now, resource->statistics());
  }
  EXPECT_EQ(resource->statistics().segments, before.segments);
  resource->deallocate({}, q, 4 * mib);
  resource->deallocate({}, p, 4 * kib);
}

TYPED_TEST(memory_resources, exactly_two_to_the_48_bytes_is_out_of_memory_with_the_numbers) {
  // 2^48 bytes is a valid request (only more is invalid_argument); no memory holds it. Both
  // under a small max_size and under the default (the location's memory).
  for (const bool bounded : {true, false}) {
    auto resource = bounded ? this->make() : std::make_unique<memory_resource>(this->pool_);
    void* p = resource->allocate({}, 4 * kib);
    const memory_resource_statistics before = resource->statistics();
    try {
      (void)resource->allocate({}, std::size_t{1} << 48);
      ADD_FAILURE() << "no out_of_memory";
    } catch (const out_of_memory& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("281474976710656 bytes requested"), std::string::npos) << message;
      EXPECT_NE(message.find("reserved"), std::string::npos) << message;
      EXPECT_NE(message.find("in use"), std::string::npos) << message;
    }
    expect_unchanged(before, resource->statistics());
    resource->deallocate({}, p, 4 * kib);
  }
}

TYPED_TEST(memory_resources, a_deallocation_of_another_size_is_refused_even_within_the_rounding) {
  auto resource = this->make();
  const auto quiet = set_cleanup_failure_handler([](const char*) noexcept {});
  void* p = resource->allocate({}, 1000);
  const memory_resource_statistics before = resource->statistics();
  resource->deallocate({}, p, 1001);  // both round to 1024: still another size
  resource->deallocate({}, p, 999);
  resource->deallocate({}, p, 1024);
  EXPECT_THROW((void)resource->pages_of(p, 1001), invalid_argument);
  memory_resource_statistics after = resource->statistics();
  EXPECT_EQ(after.bad_deallocations, 3u);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.used_current, before.used_current);
  resource->deallocate({}, p, 1000);
  EXPECT_EQ(resource->statistics().allocations, 0u);
  // A block taken back from a quick bin (a size of the same rounding) carries its new size.
  void* q = resource->allocate({}, 1010);
  resource->deallocate({}, q, 1000);
  EXPECT_EQ(resource->statistics().bad_deallocations, 4u);
  resource->deallocate({}, q, 1010);
  // And one placed by the slow path.
  void* r = resource->allocate({}, 3 * mib + 7);
  resource->deallocate({}, r, 3 * mib + 8);
  EXPECT_EQ(resource->statistics().bad_deallocations, 5u);
  resource->deallocate({}, r, 3 * mib + 7);
  set_cleanup_failure_handler(quiet);
  EXPECT_EQ(resource->statistics().allocations, 0u);
  EXPECT_EQ(resource->statistics().bad_deallocations, 5u);
}

TYPED_TEST(memory_resources, trim_and_the_release_threshold_give_idle_pages_back_to_the_pool) {
  const std::size_t g = this->granularity_;
  auto resource = this->make();
  void* a = resource->allocate({}, 6 * g);
  resource->deallocate({}, a, 6 * g);
  EXPECT_EQ(resource->statistics().reserved_current, 6 * g);  // kept: the next one costs nothing
  void* b = resource->allocate({}, 6 * g);
  EXPECT_EQ(resource->statistics().pages_created, 6u);
  resource->deallocate({}, b, 6 * g);
  resource->trim_to(2 * g);  // on a GPU, b's free may not be known passed yet: kept
  resource->synchronize();   // now it is
  resource->trim_to(2 * g);
  EXPECT_EQ(resource->statistics().reserved_current, 2 * g);
  EXPECT_EQ(resource->statistics().pages_released, 4u);
  EXPECT_EQ(this->pool_->statistics().reserved_current, 6 * g);  // the pool holds them, idle
  resource->set_release_threshold(0);
  EXPECT_EQ(resource->statistics().reserved_current, 0u);
  void* c = resource->allocate_sync(3 * g);
  resource->deallocate_sync(c, 3 * g);
  EXPECT_EQ(resource->statistics().reserved_current, 0u);  // released at once above the threshold
}

// A small block freed waits whole for the next request of its size (a quick bin); every
// other request, the statistics and trim see it freed and merged, as if it never waited.
TYPED_TEST(memory_resources, small_blocks_freed_are_taken_back_whole_and_merge_when_needed) {
  auto resource = this->make();
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(resource->allocate({}, 3 * kib));
  for (std::size_t i = 1; i < blocks.size(); ++i)
    ASSERT_EQ(static_cast<char*>(blocks[i]), static_cast<char*>(blocks[i - 1]) + 3 * kib);
  resource->deallocate({}, blocks[5], 3 * kib);
  EXPECT_EQ(resource->allocate({}, 3 * kib), blocks[5]);  // the same block, at once
  const auto quiet = set_cleanup_failure_handler([](const char*) noexcept {});
  resource->deallocate({}, blocks[5], 3 * kib);
  resource->deallocate({}, blocks[5], 3 * kib);  // freed twice: refused, even while it waits
  set_cleanup_failure_handler(quiet);
  memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.bad_deallocations, 1u);
  EXPECT_EQ(s.allocations, 63u);
  EXPECT_EQ(s.used_current, 63 * 3 * kib);
  EXPECT_EQ(s.allocations_total, 65u);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    if (i != 5) resource->deallocate({}, blocks[i], 3 * kib);
  s = resource->statistics();
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.used_current, 0u);
  // All of it merged again, once every free has passed (a GPU's stream may still be behind
  // some: pending and passed runs do not merge): one request of every block's bytes starts
  // where the first did, on the pages mapped already.
  resource->synchronize();
  const std::size_t created = s.pages_created;
  void* whole = resource->allocate({}, 64 * 3 * kib);
  EXPECT_EQ(whole, blocks[0]);
  EXPECT_EQ(resource->statistics().pages_created, created);
  resource->deallocate({}, whole, 64 * 3 * kib);
  void* again = resource->allocate({}, 3 * kib);
  resource->deallocate({}, again, 3 * kib);
  resource->synchronize();
  resource->trim_to(0);  // what waits in a bin is given back too
  EXPECT_EQ(resource->statistics().reserved_current, 0u);
}

TYPED_TEST(memory_resources, idle_pages_are_stitched_where_a_large_block_needs_them) {
  const std::size_t g = this->granularity_;
  // Sixteen blocks of two pages; every other one freed: eight idle page pairs, scattered.
  auto resource = this->make({.max_size = 32 * g});
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(resource->allocate({}, 2 * g));
  for (int i = 0; i < 16; i += 2) resource->deallocate({}, blocks[i], 2 * g);
  const memory_resource_statistics before = resource->statistics();
  // Sixteen pages in one piece fit in no hole: the idle pages move under a new run.
  void* big = resource->allocate({}, 16 * g);
  const memory_resource_statistics after = resource->statistics();
  EXPECT_EQ(after.pages_stitched - before.pages_stitched, 16u);
  EXPECT_EQ(after.reserved_current, before.reserved_current);
  const auto bytes = pattern(16 * g, 3);
  this->write(big, bytes);
  EXPECT_EQ(this->read(big, 16 * g), bytes);
  resource->deallocate({}, big, 16 * g);
  for (int i = 1; i < 16; i += 2) resource->deallocate({}, blocks[i], 2 * g);
}

TYPED_TEST(memory_resources, large_requests_get_large_pages_and_idle_pages_change_size) {
  const std::size_t g = this->granularity_;
  const std::size_t large = g * memory_resource::default_large_page_granules;
  auto resource = this->make({.max_size = 4 * large});
  ASSERT_EQ(resource->properties().large_page_size, large);
  // Two large pages and a bit: three pages of the large size.
  const std::size_t big_bytes = 2 * large + 256;
  void* big = resource->allocate({}, big_bytes);
  {
    const memory_resource::allocation_pages pages = resource->pages_of(big, big_bytes);  // holds them
    EXPECT_EQ(pages.page_size, large);
    EXPECT_EQ(pages.pages.size(), 3u);
  }
  EXPECT_EQ(resource->statistics().handles, 3u);
  EXPECT_EQ(resource->statistics().reserved_current, 3 * large);
  EXPECT_EQ(resource->statistics().reserved_large_pages, 3 * large);
  EXPECT_EQ(resource->statistics().reserved_small_pages, 0u);
  const auto big_pattern = pattern(big_bytes, 11);
  this->write(big, big_pattern);
  EXPECT_EQ(this->read(big, big_bytes), big_pattern);
  // Just under one large page: small pages.
  void* medium = resource->allocate({}, large - g);
  EXPECT_EQ(resource->pages_of(medium, large - g).page_size, g);
  {
    const memory_resource_statistics s = resource->statistics();
    EXPECT_GE(s.reserved_small_pages, large - g);
    EXPECT_EQ(s.reserved_large_pages, 3 * large);
    EXPECT_EQ(s.reserved_small_pages + s.reserved_large_pages, s.reserved_current);
  }
  resource->deallocate({}, medium, large - g);
  resource->deallocate({}, big, big_bytes);
  resource->synchronize();
  // Three idle large pages and room for one more: blocks of small pages worth nearly all
  // of max_size fit only if the idle large pages go back to be made again as small ones.
  const memory_resource_statistics before = resource->statistics();
  std::vector<void*> smalls;
  for (std::size_t used = 0; used + 2 * g <= 4 * large - 2 * g; used += 2 * g)
    smalls.push_back(resource->allocate({}, 2 * g));
  memory_resource_statistics s = resource->statistics();
  EXPECT_LE(s.reserved_current, 4 * large);
  EXPECT_GE(s.reserved_small_pages, smalls.size() * 2 * g);
  EXPECT_EQ(s.reserved_small_pages + s.reserved_large_pages, s.reserved_current);
  EXPECT_GE(s.pages_released - before.pages_released, 3u);
  EXPECT_LE(this->pool_->statistics().reserved_current, 4 * large);
  for (std::size_t i = 0; i < smalls.size(); ++i) {
    this->write(smalls[i], pattern(2 * g, static_cast<std::uint32_t>(i)));
  }
  for (std::size_t i = 0; i < smalls.size(); ++i) {
    EXPECT_EQ(this->read(smalls[i], 2 * g), pattern(2 * g, static_cast<std::uint32_t>(i))) << i;
    resource->deallocate({}, smalls[i], 2 * g);
  }
  resource->synchronize();
  // And back: the idle small pages make room for large ones.
  void* again = resource->allocate({}, 3 * large);
  this->write(again, pattern(3 * large, 5));
  EXPECT_EQ(this->read(again, 3 * large), pattern(3 * large, 5));
  s = resource->statistics();
  EXPECT_LE(s.reserved_current, 4 * large);
  EXPECT_EQ(s.used_current, 3 * large);
  resource->deallocate({}, again, 3 * large);
  EXPECT_EQ(resource->statistics().allocations, 0u);
}

TYPED_TEST(memory_resources, access_applies_to_pages_mapped_now_and_later) {
  auto resource = this->make();
  const accessor first = this->provider_->capabilities().default_accessors.front();
  EXPECT_EQ(resource->access(first), access_mode::read_write);
  void* p = resource->allocate({}, 4 * mib);
  const access_grant read_only[] = {{first, access_mode::read_only}};
  resource->set_access(read_only);
  EXPECT_EQ(resource->access(first), access_mode::read_only);
  const access_grant foreign[] = {{accessor::device(1 << 20), access_mode::read_write}};
  EXPECT_THROW(resource->set_access(foreign), invalid_argument);
  EXPECT_EQ(resource->access(first), access_mode::read_only);
  std::vector<access_grant> all;
  for (const accessor& who : this->provider_->capabilities().default_accessors)
    all.push_back({who, access_mode::read_write});
  resource->set_access(all);
  const auto bytes = pattern(4 * mib, 5);
  this->write(p, bytes);
  void* q = resource->allocate({}, 8 * mib);  // mapped later: read-write too
  this->write(q, pattern(8 * mib, 6));
  EXPECT_EQ(this->read(p, 4 * mib), bytes);
  resource->deallocate({}, p, 4 * mib);
  resource->deallocate({}, q, 8 * mib);
}

// Thousands of operations on several streams, against a model of what each live
// allocation holds: no two live allocations overlap, every byte written is read back.
TYPED_TEST(memory_resources, a_random_run_on_several_streams_matches_a_model) {
  auto resource = this->make({.max_size = 128 * mib});
  stream_executor& executor = this->provider_->executor();
  std::vector<owned_stream> owned(3);
  for (auto& s : owned) s = owned_stream(executor);
  const stream_ref streams[] = {stream_ref(), owned[0].get(), owned[1].get(), owned[2].get()};
  struct live {
    std::size_t bytes;
    std::size_t stream;
    std::uint32_t seed;
  };
  std::map<std::uintptr_t, live> model;
  std::mt19937_64 random(42);
  std::size_t used = 0;
  const std::size_t steps = 3000;
  for (std::size_t step = 0; step < steps; ++step) {
    const bool free_one = !model.empty() && (random() % 100 < 45 || used > 48 * mib);
    if (free_one) {
      auto it = std::next(model.begin(), static_cast<std::ptrdiff_t>(random() % model.size()));
      const std::size_t check = std::min<std::size_t>(it->second.bytes, 4 * kib);
      ASSERT_EQ(this->read(reinterpret_cast<void*>(it->first), check), pattern(check, it->second.seed))
          << "step " << step;
      resource->deallocate(streams[it->second.stream], reinterpret_cast<void*>(it->first), it->second.bytes);
      used -= rounded(it->second.bytes);
      model.erase(it);
    } else {
      const std::size_t shift = random() % 23;  // 1 byte to 4 MiB, log-uniform
      const std::size_t bytes = 1 + random() % (std::size_t{1} << shift);
      const std::size_t stream = random() % 4;
      void* p = resource->allocate(streams[stream], bytes);
      const auto address = reinterpret_cast<std::uintptr_t>(p);
      auto next = model.lower_bound(address);
      if (next != model.end()) {
        ASSERT_GE(next->first, address + bytes) << "overlaps the next live block";
      }
      if (next != model.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.bytes, address) << "overlaps the previous live block";
      }
      const auto seed = static_cast<std::uint32_t>(step);
      const std::size_t written = std::min<std::size_t>(bytes, 4 * kib);
      this->write(p, pattern(written, seed));
      model.emplace(address, live{bytes, stream, seed});
      used += rounded(bytes);
    }
    if (step % 100 == 0) {
      const memory_resource_statistics s = resource->statistics();
      ASSERT_EQ(s.used_current, used);
      ASSERT_EQ(s.allocations, model.size());
      ASSERT_GE(s.reserved_current, s.used_current);
    }
    if (step % 700 == 699) resource->trim_to(0);
  }
  for (auto& [address, entry] : model)
    resource->deallocate(streams[entry.stream], reinterpret_cast<void*>(address), entry.bytes);
  for (auto& s : owned) executor.synchronize(s.get());
  EXPECT_EQ(resource->statistics().used_current, 0u);
  EXPECT_EQ(resource->statistics().bad_deallocations, 0u);
}

TYPED_TEST(memory_resources, many_threads_on_one_resource) {
  auto resource = this->make({.max_size = 128 * mib});
  stream_executor& executor = this->provider_->executor();
  constexpr int threads = 4;
  std::vector<std::thread> workers;
  std::atomic<bool> failed{false};
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      owned_stream stream(executor);
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 400; ++i) {
        if (!mine.empty() && random() % 2 == 0) {
          auto [p, bytes] = mine.back();
          mine.pop_back();
          resource->deallocate(t % 2 == 0 ? stream.get() : stream_ref(), p, bytes);
        } else {
          const std::size_t bytes = 1 + random() % (2 * mib);
          try {
            mine.emplace_back(resource->allocate(t % 2 == 0 ? stream.get() : stream_ref(), bytes), bytes);
          } catch (const std::exception&) {
            failed = true;
          }
        }
      }
      for (auto [p, bytes] : mine) resource->deallocate(stream.get(), p, bytes);
      executor.synchronize(stream.get());
    });
  for (auto& w : workers) w.join();
  EXPECT_FALSE(failed);
  const memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.used_current, 0u);
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.bad_deallocations, 0u);
}

TYPED_TEST(memory_resources, properties_are_checked_and_initial_size_is_spare) {
  const std::size_t g = this->granularity_;
  auto resource = this->make({.initial_size = 3 * g});
  EXPECT_EQ(resource->statistics().reserved_current, 3 * g);
  EXPECT_EQ(resource->statistics().handles, 3u);
  void* p = resource->allocate({}, 2 * g);
  EXPECT_EQ(resource->statistics().pages_created, 3u);  // no new page: the spare ones
  resource->deallocate({}, p, 2 * g);
  if (this->provider_->capabilities().export_kind == handle_kind::none) {
    EXPECT_THROW(this->make({.handle_type = handle_kind::posix_fd}), invalid_argument);
  }
  EXPECT_THROW(memory_resource(std::shared_ptr<chunk_pool>()), invalid_argument);
  // Large pages: the granularity times a power of two, at most 1 GiB.
  for (std::size_t bad : {g / 2, 3 * g, 2 * g + 4096, std::size_t{2} << 30})
    EXPECT_THROW(this->make({.large_page_size = bad}), invalid_argument) << bad;
  EXPECT_EQ(this->make({.large_page_size = g})->properties().large_page_size, g);  // off
  EXPECT_EQ(this->make()->properties().large_page_size, g * memory_resource::default_large_page_granules);
  // Headroom: a share from 0 to 1; 0 is the default, which properties() says.
  for (double bad : {-0.01, 1.01, std::numeric_limits<double>::quiet_NaN()})
    EXPECT_THROW(this->make({.headroom = bad}), invalid_argument) << bad;
  EXPECT_EQ(this->make()->properties().headroom, 1.0 / 128);                      // large pages on
  EXPECT_EQ(this->make({.large_page_size = g})->properties().headroom, 1.0 / 8);  // off
  EXPECT_EQ(this->make({.headroom = 0.25})->properties().headroom, 0.25);
}

TYPED_TEST(memory_resources, a_request_takes_the_mapped_pages_inside_a_larger_free_run) {
  const std::size_t g = this->granularity_;
  // The largest blocks of a training step come and go at the top of an arena, with sizes
  // that change a little every step: the free run there is larger than any request, and the
  // pages its freed blocks left lie inside it, not at its start or end. A request goes
  // where they are instead of moving them.
  auto resource = this->make({.max_size = 64 * g});
  void* a = resource->allocate({}, 4 * g);
  void* b = resource->allocate({}, 4 * g);
  ASSERT_EQ(static_cast<std::byte*>(b), static_cast<std::byte*>(a) + 4 * g);
  resource->deallocate({}, a, 4 * g);
  // Past the stitch limit's room: two of a's idle pages (the highest) move up to c.
  void* c = resource->allocate({}, 6 * g);
  ASSERT_EQ(static_cast<std::byte*>(c), static_cast<std::byte*>(b) + 4 * g);
  memory_resource_statistics s = resource->statistics();
  ASSERT_EQ(s.pages_stitched, 2u);
  ASSERT_EQ(s.reserved_current, 12 * g);
  this->write(c, pattern(6 * g, 3));
  resource->deallocate({}, b, 4 * g);
  resource->deallocate({}, c, 6 * g);
  // One free run now, its pages mapped but for the two that moved: the ten above them fit
  // a request of ten pages, which maps nothing (at the run's start it lacked two).
  void* d = resource->allocate({}, 10 * g);
  EXPECT_EQ(static_cast<std::byte*>(d), static_cast<std::byte*>(a) + 4 * g);
  const memory_resource_statistics after = resource->statistics();
  EXPECT_EQ(after.pages_stitched, s.pages_stitched);
  EXPECT_EQ(after.pages_created, s.pages_created);
  EXPECT_EQ(after.reserved_current, 12 * g);
  EXPECT_EQ(this->read(static_cast<std::byte*>(d) + 4 * g, 6 * g), pattern(6 * g, 3))
      << "c's pages, in place";
  resource->deallocate({}, d, 10 * g);
  EXPECT_EQ(resource->statistics().used_current, 0u);
}

TYPED_TEST(memory_resources, two_page_sizes_stop_trading_a_large_page_back_and_forth) {
  const std::size_t g = this->granularity_;
  const std::size_t large = g * memory_resource::default_large_page_granules;
  // Steps in which the same bytes are in use, split between small and large pages in
  // shares that change by a large page from one step to the next. With less room than a
  // large page past the most in use, each step would give one size's idle pages back to
  // make the other's again. No headroom is learned here: the room is the resource's own.
  auto resource = this->make({.max_size = 160 * large, .headroom = 1e-9});
  void* base = resource->allocate({}, 128 * large);  // what the room is a share of
  std::uint64_t released_after_warm_up = 0;
  for (int step = 0; step < 8; ++step) {
    const bool more_small = step % 2 == 0;
    const std::size_t small = (more_small ? 10 : 2) * g;   // two blocks, each under a large page
    const std::size_t big = (more_small ? 2 : 3) * large;  // 2 * small + big: the same every step
    void* s1 = resource->allocate({}, small);
    void* s2 = resource->allocate({}, small);
    void* l = resource->allocate({}, big);
    EXPECT_EQ(resource->pages_of(l, big).page_size, large);
    EXPECT_EQ(resource->pages_of(s1, small).page_size, g);
    resource->deallocate({}, l, big);
    resource->deallocate({}, s2, small);
    resource->deallocate({}, s1, small);
    if (step == 1) released_after_warm_up = resource->statistics().pages_released;
  }
  const memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.pages_released, released_after_warm_up) << "pages given back after the first two steps";
  EXPECT_LE(s.reserved_high, 128 * large + 20 * g + 3 * large + large + 128 * large / 128);
  resource->deallocate({}, base, 128 * large);
  EXPECT_EQ(resource->statistics().used_current, 0u);
}

TYPED_TEST(memory_resources, more_headroom_stitches_fewer_pages_and_keeps_more) {
  const std::size_t g = this->granularity_;
  // Each round scatters idle pages and then asks for a run none of its holes fits: pages
  // move (stitched) or are made. A resource allowed more headroom learns to keep pages
  // instead of moving them every round.
  const auto run = [&](double headroom) {
    auto resource = this->make({.headroom = headroom});
    for (int round = 0; round < 12; ++round) {
      std::vector<void*> blocks;
      for (int i = 0; i < 16; ++i) blocks.push_back(resource->allocate({}, 2 * g));
      for (int i = 0; i < 16; i += 2) resource->deallocate({}, blocks[i], 2 * g);
      void* big = resource->allocate({}, (16 + round % 3) * g);
      resource->deallocate({}, big, (16 + round % 3) * g);
      for (int i = 1; i < 16; i += 2) resource->deallocate({}, blocks[i], 2 * g);
    }
    return resource->statistics();
  };
  const memory_resource_statistics least = run(0);
  const memory_resource_statistics most = run(1);
  EXPECT_LT(most.pages_stitched, least.pages_stitched);
  EXPECT_GT(most.reserved_high, least.reserved_high);
  EXPECT_EQ(most.used_current, 0u);
}

TYPED_TEST(memory_resources, a_block_grown_by_copies_keeps_freed_pages_in_place) {
  const std::size_t g = this->granularity_;
  // x = cat(x, y) in a loop: each step asks for one granule more than x, copies and frees x.
  // The freed x lies just below the live one, over the free addresses where earlier
  // steps' blocks were: the next request takes it at its far end, over its mapped pages,
  // instead of moving them all. Each step stamps every page of its block, and the stamps
  // are read back after the next request is placed.
  const auto stamp = [](std::size_t step, std::size_t page) {
    return pattern(256, static_cast<std::uint32_t>(step * 100 + page));
  };
  auto resource = this->make({.max_size = 64 * g});
  void* x = resource->allocate({}, g);
  this->write(x, stamp(1, 0));
  const memory_resource_statistics before = resource->statistics();
  constexpr std::size_t steps = 16;
  for (std::size_t k = 2; k <= steps; ++k) {
    void* y = resource->allocate({}, k * g);
    for (std::size_t i = 0; i < k; ++i) this->write(static_cast<std::byte*>(y) + i * g, stamp(k, i));
    for (std::size_t i = 0; i < k - 1; ++i)
      EXPECT_EQ(this->read(static_cast<std::byte*>(x) + i * g, 256), stamp(k - 1, i)) << k << " " << i;
    resource->deallocate({}, x, (k - 1) * g);
    x = y;
  }
  const memory_resource_statistics after = resource->statistics();
  // Pages are made as the peak grows (x and y: 2 * steps - 1 pages at the end); moving the
  // freed block's pages instead stitched 50 on the OS provider, against 12 at far ends.
  EXPECT_LE(after.pages_stitched - before.pages_stitched, steps);
  EXPECT_LE(after.reserved_high, (2 * steps + 1) * g);
  for (std::size_t i = 0; i < steps; ++i)
    EXPECT_EQ(this->read(static_cast<std::byte*>(x) + i * g, 256), stamp(steps, i)) << i;
  resource->deallocate({}, x, steps * g);
  EXPECT_EQ(resource->statistics().used_current, 0u);
}

}  // namespace
}  // namespace vmm::testing

namespace vmm::testing {
namespace {

template <class Kind>
class sleeping_resources : public memory_resources<Kind> {};
TYPED_TEST_SUITE(sleeping_resources, all_memory_kinds, memory_kind_names);

// A stand-in for NCCL's registry: what is registered now, and every call in order. Each call
// reads the range's first and last bytes, so that it faults where the memory is not mapped
// then (on host memory), and keeps what register saw.
class recording_registrar : public memory_registrar {
 public:
  using reader = std::function<std::vector<std::uint8_t>(const void*, std::size_t)>;
  explicit recording_registrar(reader read) : read_(std::move(read)) {}
  void* register_memory(void* ptr, std::size_t bytes) override {
    calls.push_back("register " + std::to_string(reinterpret_cast<std::uintptr_t>(ptr)));
    if (fail_after >= 0 && fail_after-- == 0) throw std::runtime_error("the transport refused");
    seen.push_back(read_(ptr, bytes));
    const std::uintptr_t handle = ++next_handle;
    live[handle] = {ptr, bytes};
    return reinterpret_cast<void*>(handle);
  }
  void deregister_memory(void* handle) noexcept override {
    const auto it = live.find(reinterpret_cast<std::uintptr_t>(handle));
    if (it == live.end()) {
      calls.push_back("deregister of an unknown handle");
      return;
    }
    (void)read_(it->second.first, 1);  // still mapped
    calls.push_back("deregister " + std::to_string(reinterpret_cast<std::uintptr_t>(it->second.first)));
    live.erase(it);
  }
  std::map<std::uintptr_t, std::pair<void*, std::size_t>> live;  // by handle
  std::vector<std::string> calls;
  std::vector<std::vector<std::uint8_t>> seen;  // the bytes under each registration made
  int fail_after = -1;                          // registrations before one throws (-1: none)
  std::uintptr_t next_handle = 0;

 private:
  reader read_;
};

TYPED_TEST(sleeping_resources, sleep_gives_every_page_back_and_wake_restores_the_saved_bytes) {
  const std::size_t g = this->granularity_;
  auto resource = this->make();
  constexpr allocation_tag weights{1};
  constexpr allocation_tag cache{2};
  void* w = resource->allocate({}, 3 * g + 1000, 256, weights);
  void* c = resource->allocate({}, 2 * g, 256, cache);
  void* small = resource->allocate({}, 5000, 256, weights);
  const auto w_bytes = pattern(3 * g + 1000, 11);
  const auto small_bytes = pattern(5000, 12);
  this->write(w, w_bytes);
  this->write(small, small_bytes);
  this->write(c, pattern(2 * g, 13));

  // The host copies: pinned host memory for a GPU, plain host memory on the OS provider.
  const std::size_t host_before = detail::host_copies::bytes_in_process();
  const allocation_tag offload[] = {weights};
  resource->sleep(offload);
  // The two weights allocations, each rounded up to 256 bytes.
  EXPECT_EQ(detail::host_copies::bytes_in_process(), host_before + (3 * g + 1024) + 5120);
  EXPECT_TRUE(resource->asleep());
  EXPECT_EQ(resource->statistics().reserved_current, 0u);
  EXPECT_EQ(this->pool_->statistics().reserved_current, 0u);  // back to the device
  EXPECT_THROW((void)resource->allocate({}, 100), invalid_argument);
  EXPECT_THROW(resource->sleep(offload), invalid_argument);
  const auto quiet = set_cleanup_failure_handler([](const char*) noexcept {});
  resource->deallocate({}, c, 2 * g);  // refused while asleep: nothing is lost
  set_cleanup_failure_handler(quiet);
  EXPECT_EQ(resource->statistics().bad_deallocations, 1u);
  EXPECT_EQ(resource->statistics().allocations, 3u);

  const allocation_tag first[] = {weights};
  resource->wake(first);  // the weights first: the cache stays asleep
  EXPECT_TRUE(resource->asleep());
  EXPECT_EQ(this->read(w, w_bytes.size()), w_bytes);  // same address, identical bytes
  EXPECT_EQ(this->read(small, small_bytes.size()), small_bytes);
  resource->wake();
  EXPECT_FALSE(resource->asleep());
  // The host copies go back on a thread of their own once wake() has restored everything.
  for (int i = 0; i < 10000 && detail::host_copies::bytes_in_process() > host_before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(detail::host_copies::bytes_in_process(), host_before) << "the host copies were not given back";
  this->write(c, pattern(2 * g, 14));  // mapped again (its old bytes are gone)
  EXPECT_EQ(this->read(c, 2 * g), pattern(2 * g, 14));
  EXPECT_THROW(resource->wake(), invalid_argument);
  void* more = resource->allocate({}, g);
  resource->deallocate({}, more, g);
  resource->deallocate({}, w, 3 * g + 1000);
  resource->deallocate({}, c, 2 * g);
  resource->deallocate({}, small, 5000);
  EXPECT_EQ(resource->statistics().allocations, 0u);
}

// A program that sleeps and wakes in a loop: a wake that keeps the host copies hands them
// to the next sleep, which makes no fresh host memory while they are large enough.
TYPED_TEST(sleeping_resources, registrations_are_withdrawn_by_sleep_and_renewed_over_the_new_memory) {
  const std::size_t g = this->granularity_;
  auto resource = this->make();
  constexpr allocation_tag weights{1};
  constexpr allocation_tag cache{2};
  void* w = resource->allocate({}, 2 * g + 100, 256, weights);
  void* c = resource->allocate({}, g, 256, cache);
  const auto w_bytes = pattern(2 * g + 100, 21);
  this->write(w, w_bytes);
  auto registry = std::make_shared<recording_registrar>(
      [this](const void* p, std::size_t n) { return this->read(p, n); });
  memory_registration rw = resource->register_memory(w, 2 * g + 100, registry);
  memory_registration rc = resource->register_memory(c, g / 2, registry);
  ASSERT_EQ(registry->live.size(), 2u);
  EXPECT_EQ(registry->seen.front(), w_bytes);
  EXPECT_NE(rw.handle(), nullptr);
  // A registered allocation cannot be freed: refused, counted, and nothing changes.
  const auto quiet = set_cleanup_failure_handler([](const char*) noexcept {});
  resource->deallocate({}, c, g);
  set_cleanup_failure_handler(quiet);
  EXPECT_EQ(resource->statistics().bad_deallocations, 1u);
  EXPECT_EQ(resource->statistics().allocations, 2u);

  const allocation_tag offload[] = {weights};
  resource->sleep(offload);
  EXPECT_TRUE(registry->live.empty()) << "a registration outlived its pages";
  EXPECT_EQ(rw.handle(), nullptr);
  EXPECT_TRUE(rw);  // still the resource's: a wake registers it again
  EXPECT_THROW((void)resource->register_memory(w, 100, registry), invalid_argument);

  const allocation_tag first[] = {weights};
  resource->wake(first);  // only the weights' registration comes back
  ASSERT_EQ(registry->live.size(), 1u);
  EXPECT_EQ(registry->live.begin()->second.first, w);
  EXPECT_EQ(registry->seen.back(), w_bytes) << "registered before the saved bytes were restored";
  EXPECT_NE(rw.handle(), nullptr);
  EXPECT_EQ(rc.handle(), nullptr);
  resource->wake();
  EXPECT_EQ(registry->live.size(), 2u);
  EXPECT_NE(rc.handle(), nullptr);
  EXPECT_EQ(registry->calls,
            (std::vector<std::string>{"register " + std::to_string(reinterpret_cast<std::uintptr_t>(w)),
                                      "register " + std::to_string(reinterpret_cast<std::uintptr_t>(c)),
                                      "deregister " + std::to_string(reinterpret_cast<std::uintptr_t>(w)),
                                      "deregister " + std::to_string(reinterpret_cast<std::uintptr_t>(c)),
                                      "register " + std::to_string(reinterpret_cast<std::uintptr_t>(w)),
                                      "register " + std::to_string(reinterpret_cast<std::uintptr_t>(c))}));

  rc.reset();  // ends it: deregistered, and the allocation may go
  EXPECT_FALSE(rc);
  EXPECT_EQ(registry->live.size(), 1u);
  resource->deallocate({}, c, g);
  EXPECT_EQ(resource->statistics().bad_deallocations, 1u);
  rw = memory_registration{};  // a move over it ends it too
  EXPECT_TRUE(registry->live.empty());
  resource->deallocate({}, w, 2 * g + 100);
  EXPECT_EQ(resource->statistics().allocations, 0u);
}

TYPED_TEST(sleeping_resources,
           a_registrar_that_fails_in_a_wake_leaves_the_tags_asleep_and_nothing_registered) {
  const std::size_t g = this->granularity_;
  auto resource = this->make();
  constexpr allocation_tag weights{1};
  void* a = resource->allocate({}, g, 256, weights);
  void* b = resource->allocate({}, 3 * g, 256, weights);
  this->write(a, pattern(g, 31));
  this->write(b, pattern(3 * g, 32));
  auto registry = std::make_shared<recording_registrar>(
      [this](const void* p, std::size_t n) { return this->read(p, n); });
  memory_registration ra = resource->register_memory(a, g, registry);
  memory_registration rb = resource->register_memory(b, 3 * g, registry);
  const allocation_tag offload[] = {weights};
  resource->sleep(offload);
  const memory_resource_statistics asleep = resource->statistics();

  registry->fail_after = 1;  // the second registration of the wake throws
  EXPECT_THROW(resource->wake(), std::runtime_error);
  EXPECT_TRUE(resource->asleep());
  EXPECT_TRUE(registry->live.empty()) << "the wake left a registration behind";
  EXPECT_EQ(ra.handle(), nullptr);
  EXPECT_EQ(resource->statistics().reserved_current, asleep.reserved_current);
  EXPECT_EQ(resource->statistics().host_copy_bytes, asleep.host_copy_bytes);
  EXPECT_EQ(registry->calls.back(), "deregister " + std::to_string(reinterpret_cast<std::uintptr_t>(a)));

  resource->wake();  // the transport takes them now
  EXPECT_FALSE(resource->asleep());
  EXPECT_EQ(registry->live.size(), 2u);
  EXPECT_EQ(this->read(b, 3 * g), pattern(3 * g, 32));

  // A registrar that refuses at once: nothing recorded, the allocation may go.
  registry->fail_after = 0;
  void* c = resource->allocate({}, 1000);
  EXPECT_THROW((void)resource->register_memory(c, 1000, registry), std::runtime_error);
  resource->deallocate({}, c, 1000);
  EXPECT_EQ(resource->statistics().bad_deallocations, 0u);
  // The other refusals of register_memory.
  void* d = resource->allocate({}, 1000);
  EXPECT_THROW((void)resource->register_memory(d, 1000, nullptr), invalid_argument);
  EXPECT_THROW((void)resource->register_memory(d, 1001, registry), invalid_argument);
  EXPECT_THROW((void)resource->register_memory(static_cast<char*>(d) + 256, 100, registry), invalid_argument);
  EXPECT_THROW((void)resource->register_memory(d, 0, registry), invalid_argument);
  EXPECT_EQ(registry->live.size(), 2u);
  resource->deallocate({}, d, 1000);

  // The resource going first deregisters what is live; the registrations are empty after.
  ra.reset();
  const auto quiet = set_cleanup_failure_handler([](const char*) noexcept {});
  resource->deallocate({}, a, g);
  set_cleanup_failure_handler(quiet);
  EXPECT_EQ(resource->statistics().bad_deallocations, 0u);
  static int reports = 0;
  reports = 0;
  const auto counting = set_cleanup_failure_handler([](const char*) noexcept { ++reports; });
  resource.reset();  // b still allocated and registered: both reported
  set_cleanup_failure_handler(counting);
  EXPECT_EQ(reports, 2);
  EXPECT_TRUE(registry->live.empty());
  EXPECT_FALSE(rb);
  EXPECT_EQ(rb.handle(), nullptr);
}

TYPED_TEST(sleeping_resources, host_copies_kept_by_a_wake_serve_the_next_sleep) {
  const std::size_t g = this->granularity_;
  auto resource = this->make();
  constexpr allocation_tag weights{1};
  const allocation_tag offload[] = {weights};
  const std::size_t host_before = detail::host_copies::bytes_in_process();
  void* w = resource->allocate({}, 3 * g, 256, weights);
  void* extra = resource->allocate({}, g, 256, weights);
  this->write(w, pattern(3 * g, 21));
  this->write(extra, pattern(g, 22));
  resource->sleep(offload);
  EXPECT_EQ(resource->statistics().host_copy_bytes, 4 * g);
  resource->wake({}, {}, after_wake::keep_host_copies);
  EXPECT_EQ(resource->statistics().host_copy_bytes, 4 * g) << "the wake gave its host copies back";
  EXPECT_EQ(detail::host_copies::bytes_in_process(), host_before + 4 * g);

  // Less to save: the kept 4 granules serve (fresh copies would be 3).
  resource->deallocate({}, extra, g);
  this->write(w, pattern(3 * g, 23));
  resource->sleep(offload);
  EXPECT_EQ(resource->statistics().host_copy_bytes, 4 * g);
  EXPECT_EQ(detail::host_copies::bytes_in_process(), host_before + 4 * g);
  resource->wake({}, {}, after_wake::keep_host_copies);
  EXPECT_EQ(this->read(w, 3 * g), pattern(3 * g, 23));

  // More to save than was kept: they go back, and fresh ones of the new size come.
  void* more = resource->allocate({}, 2 * g, 256, weights);
  this->write(more, pattern(2 * g, 24));
  resource->sleep(offload);
  EXPECT_EQ(resource->statistics().host_copy_bytes, 5 * g);
  EXPECT_EQ(detail::host_copies::bytes_in_process(), host_before + 5 * g);
  resource->wake({}, {}, after_wake::keep_host_copies);
  EXPECT_EQ(this->read(w, 3 * g), pattern(3 * g, 23));
  EXPECT_EQ(this->read(more, 2 * g), pattern(2 * g, 24));

  resource->trim_to(std::numeric_limits<std::size_t>::max());  // gives kept copies back, keeps pages
  EXPECT_EQ(resource->statistics().host_copy_bytes, 0u);
  EXPECT_EQ(detail::host_copies::bytes_in_process(), host_before);
  EXPECT_EQ(this->read(w, 3 * g), pattern(3 * g, 23));

  // Kept copies the resource still holds go back with it.
  resource->sleep(offload);
  resource->wake({}, {}, after_wake::keep_host_copies);
  EXPECT_EQ(detail::host_copies::bytes_in_process(), host_before + 5 * g);
  resource->deallocate({}, w, 3 * g);
  resource->deallocate({}, more, 2 * g);
  resource.reset();
  EXPECT_EQ(detail::host_copies::bytes_in_process(), host_before);
}

// wake() maps and grants its pages a few dozen at a time and copies each saved run as soon
// as its pages are granted: runs that cross those steps, pages shared by allocations of
// different tags, and a partial wake must all come back byte for byte.
TYPED_TEST(sleeping_resources, a_wake_of_many_pages_restores_runs_that_cross_its_steps) {
  const std::size_t g = this->granularity_;
  auto resource = this->make();
  constexpr allocation_tag a{1};
  constexpr allocation_tag b{2};
  constexpr allocation_tag dropped{3};
  // In address order (one arena): each allocation after the first starts on the page the
  // one before it ends on.
  const std::pair<std::size_t, allocation_tag> layout[] = {
      {20 * g + g / 2, a}, {g, b},           {30 * g + g / 4, a}, {3 * g, dropped},
      {15 * g + 4096, a},  {2 * g + 256, b}, {5 * g, dropped}};
  std::vector<void*> pointers;
  std::vector<std::vector<std::uint8_t>> contents;
  for (std::size_t i = 0; i < std::size(layout); ++i) {
    pointers.push_back(resource->allocate({}, layout[i].first, 256, layout[i].second));
    contents.push_back(pattern(layout[i].first, static_cast<std::uint32_t>(40 + i)));
    this->write(pointers.back(), contents.back());
  }
  const auto check = [&](allocation_tag tag) {
    for (std::size_t i = 0; i < std::size(layout); ++i) {
      if (layout[i].second.value == tag.value) {
        EXPECT_EQ(this->read(pointers[i], layout[i].first), contents[i]) << "allocation " << i;
      }
    }
  };
  const allocation_tag offload[] = {a, b};
  resource->sleep(offload);
  EXPECT_EQ(resource->statistics().reserved_current, 0u);
  const allocation_tag first[] = {a};
  resource->wake(first);
  EXPECT_TRUE(resource->asleep());
  check(a);
  resource->wake();
  EXPECT_FALSE(resource->asleep());
  check(a);
  check(b);
  for (std::size_t i = 0; i < std::size(layout); ++i) resource->deallocate({}, pointers[i], layout[i].first);
  EXPECT_EQ(resource->statistics().allocations, 0u);
}

// sleep() copies each run as the host memory under it becomes ready, a piece of
// host_copies::piece_bytes at a time, and wake() copies it back piece by piece: runs that
// start, end and lie across those pieces must come back byte for byte.
TYPED_TEST(sleeping_resources, runs_across_the_pieces_of_the_host_copies_come_back_whole) {
  constexpr std::size_t mib = std::size_t{1} << 20;
  auto resource = this->make();
  constexpr allocation_tag kept{1};
  constexpr allocation_tag dropped{2};
  // Host offsets of the kept runs: [0, 50), [50, 140) across both piece edges of 64 and 128
  // MiB, [140, 161) (the allocations are in one or two arenas: the runs' order may differ).
  const std::pair<std::size_t, allocation_tag> layout[] = {
      {50 * mib, kept}, {3 * mib, dropped}, {90 * mib, kept}, {21 * mib - 4096, kept}};
  std::vector<void*> pointers;
  std::vector<std::vector<std::uint8_t>> contents;
  for (std::size_t i = 0; i < std::size(layout); ++i) {
    pointers.push_back(resource->allocate({}, layout[i].first, 256, layout[i].second));
    contents.push_back(pattern(layout[i].first, static_cast<std::uint32_t>(70 + i)));
    this->write(pointers.back(), contents.back());
  }
  const allocation_tag offload[] = {kept};
  resource->sleep(offload);
  EXPECT_EQ(resource->statistics().reserved_current, 0u);
  resource->wake();
  for (std::size_t i = 0; i < std::size(layout); ++i)
    if (layout[i].second.value == kept.value) {
      EXPECT_EQ(this->read(pointers[i], layout[i].first), contents[i]) << "allocation " << i;
    }
  for (std::size_t i = 0; i < std::size(layout); ++i) resource->deallocate({}, pointers[i], layout[i].first);
}

TYPED_TEST(sleeping_resources, a_resource_destroyed_asleep_gives_its_host_copies_back) {
  const std::size_t g = this->granularity_;
  const std::size_t host_before = detail::host_copies::bytes_in_process();
  {
    auto resource = this->make();
    void* p = resource->allocate({}, 2 * g, 256, allocation_tag{1});
    const allocation_tag offload[] = {allocation_tag{1}};
    resource->sleep(offload);
    EXPECT_EQ(detail::host_copies::bytes_in_process(), host_before + 2 * g);
    const auto quiet = set_cleanup_failure_handler([](const char*) noexcept {});
    resource.reset();  // asleep, with a live allocation (reported)
    set_cleanup_failure_handler(quiet);
    (void)p;
  }
  EXPECT_EQ(detail::host_copies::bytes_in_process(), host_before) << "the host copies were kept";
}

TYPED_TEST(sleeping_resources,
           a_wake_that_runs_out_of_memory_gives_back_what_it_took_and_says_how_much_was_missing) {
  const std::size_t g = this->granularity_;
  auto resource = this->make();
  void* w = resource->allocate({}, 4 * g, 256, allocation_tag{1});
  const auto bytes = pattern(4 * g, 21);
  this->write(w, bytes);
  const allocation_tag offload[] = {allocation_tag{1}};
  resource->sleep(offload);
  // Another user takes all but two pages' worth of the pool.
  this->pool_->set_cap(2 * g);
  try {
    resource->wake();
    ADD_FAILURE() << "no out_of_memory";
  } catch (const out_of_memory& error) {
    EXPECT_NE(std::string(error.what()).find(std::to_string(2 * g) + " bytes were missing"),
              std::string::npos)
        << error.what();
  }
  EXPECT_TRUE(resource->asleep());
  EXPECT_EQ(resource->statistics().reserved_current, 0u);
  EXPECT_EQ(this->pool_->statistics().reserved_current, 0u);
  this->pool_->set_cap(~std::size_t{0});
  resource->wake();
  EXPECT_EQ(this->read(w, 4 * g), bytes);
  resource->deallocate({}, w, 4 * g);
}

}  // namespace
}  // namespace vmm::testing
