// The page supply of the memory resource (vmm/src/resource/page_supply.hpp) on its own, on
// OS host memory: pages come spare first, then stitched from idle places once the resource
// holds what it may, then created; a request past max_size changes nothing; idle pages go
// back past what may be kept. The arena set it works over is checked here too.

#include <gtest/gtest.h>

#include <cstdint>

#include "resource_parts.hpp"
#include "vmm/error.hpp"

namespace vmm::detail::testing {
namespace {

// Carves [offset, offset + size) of `a` out of the released block there (the pages an
// arena keeps state for are those its blocks have covered).
block* carve(arena& a, std::uint64_t offset, std::uint64_t size) {
  block* found = nullptr;
  a.released().candidates(size, [&](block* b) {
    if (b->offset <= offset && offset + size <= b->end()) found = b;
    return found != nullptr;
  });
  return found == nullptr ? nullptr : a.carve(found, offset, size);
}

// Held, then idle: pages [first, first + count) of `a` mapped with no block over them.
void map_idle(resource_parts& parts, arena& a, std::size_t first, std::size_t count) {
  block* b = carve(a, first * parts.page, count * parts.page);
  ASSERT_NE(b, nullptr);
  parts.supply.map(a, b->offset, b->size);
  a.free_released(b);
}

TEST(arena_set, finds_each_arena_by_address_in_the_order_made) {
  resource_parts parts(8);
  arena& first = parts.arenas.add(4 * parts.page, parts.page);
  arena& second = parts.arenas.add(4 * parts.page, parts.page);
  EXPECT_EQ(parts.arenas.count(), 2u);
  EXPECT_EQ(&parts.arenas.at(0), &first);
  EXPECT_EQ(parts.arenas.index_containing(second.base() + 1), 1u);
  EXPECT_EQ(parts.arenas.containing(first.base() + first.size() - 1), &first);
  EXPECT_EQ(parts.arenas.containing(0), nullptr);
  EXPECT_EQ(parts.arenas.index_containing(0), arena_set::max_arenas);
  EXPECT_EQ(parts.arenas.largest_released(), 4 * parts.page);
}

TEST(page_supply, maps_spare_pages_before_it_creates_any) {
  resource_parts parts(8);
  parts.supply.add_spare(1);
  EXPECT_EQ(parts.supply.page_counts().created, 1u);
  EXPECT_EQ(parts.supply.reserved_bytes(), parts.page);
  parts.used.add(2 * parts.page);  // in use: no idle page may be stitched instead
  arena& a = parts.arenas.add(4 * parts.page, parts.page);
  ASSERT_NE(carve(a, 0, 2 * parts.page), nullptr);
  parts.supply.map(a, 0, 2 * parts.page);
  EXPECT_TRUE(a.mapped(0));
  EXPECT_TRUE(a.mapped(1));
  EXPECT_FALSE(a.mapped(2));
  EXPECT_EQ(parts.supply.page_counts().created, 2u);  // one spare, one new
  EXPECT_EQ(parts.supply.reserved_bytes(), 2 * parts.page);
  EXPECT_EQ(parts.supply.reserved_high(), 2 * parts.page);
  EXPECT_EQ(parts.supply.handles(), 2u);
}

TEST(page_supply, stitches_idle_pages_once_it_holds_what_the_resource_may) {
  resource_parts parts(8);
  arena& a = parts.arenas.add(8 * parts.page, parts.page);
  // Nothing in use: the stitch limit is two pages, so the two idle pages mapped first move.
  map_idle(parts, a, 0, 2);
  ASSERT_NE(carve(a, 4 * parts.page, 2 * parts.page), nullptr);
  parts.supply.map(a, 4 * parts.page, 2 * parts.page);
  EXPECT_EQ(parts.supply.page_counts().created, 2u);
  EXPECT_EQ(parts.supply.page_counts().stitched, 2u);
  EXPECT_EQ(parts.supply.reserved_bytes(), 2 * parts.page);
  EXPECT_FALSE(a.mapped(0));
  EXPECT_TRUE(a.mapped(4));
  EXPECT_TRUE(a.mapped(5));
}

TEST(page_supply, a_run_past_max_size_is_refused_and_changes_nothing) {
  resource_parts parts(2);
  parts.used.add(2 * parts.page);
  arena& a = parts.arenas.add(4 * parts.page, parts.page);
  ASSERT_NE(carve(a, 0, 3 * parts.page), nullptr);
  EXPECT_THROW(parts.supply.map(a, 0, 3 * parts.page), out_of_memory);
  EXPECT_EQ(parts.supply.reserved_bytes(), 0u);
  EXPECT_FALSE(a.mapped(0));
  parts.supply.map(a, 0, 2 * parts.page);
  EXPECT_EQ(parts.supply.reserved_bytes(), 2 * parts.page);
}

TEST(page_supply, gives_back_spare_then_idle_pages_down_to_what_is_kept) {
  resource_parts parts(8);
  parts.supply.add_spare(1);
  parts.used.add(4 * parts.page);
  arena& a = parts.arenas.add(4 * parts.page, parts.page);
  map_idle(parts, a, 0, 3);  // one spare, two created
  parts.supply.give_back(parts.page);
  EXPECT_EQ(parts.supply.reserved_bytes(), parts.page);
  EXPECT_EQ(parts.supply.page_counts().released, 2u);
  EXPECT_TRUE(a.mapped(0));  // from the top down
  EXPECT_FALSE(a.mapped(2));
  parts.supply.give_back_all();
  EXPECT_EQ(parts.supply.reserved_bytes(), 0u);
  EXPECT_EQ(parts.supply.page_counts().released, 3u);
}

}  // namespace
}  // namespace vmm::detail::testing
