// Placement in the memory resource (vmm/src/resource/placement.hpp) on its own, on OS host
// memory: each stream's entry and home arenas, size classes, the slow path's block and the
// fast path's mapped run next to it.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "resource_parts.hpp"

namespace vmm::detail::testing {
namespace {

stream_ref stream_at(std::uintptr_t value) {
  return stream_ref(reinterpret_cast<CUstream_st*>(value));
}

TEST(placement, a_stream_gets_one_entry_with_its_home_arenas) {
  resource_parts parts(64);
  EXPECT_EQ(parts.places.find(stream_at(0x100), false), nullptr);
  placement::stream_entry& entry = parts.places.add_entry(stream_at(0x100), false);
  EXPECT_EQ(parts.places.find(stream_at(0x100), false), &entry);
  EXPECT_EQ(&parts.places.add_entry(stream_at(0x100), false), &entry);
  EXPECT_EQ(entry.record->stream, stream_at(0x100));
  EXPECT_EQ(entry.arenas[0].size(), 1u);
  EXPECT_EQ(entry.arenas[1].size(), 1u);
  EXPECT_TRUE(entry.arenas[2].empty());  // large pages off
  EXPECT_EQ(parts.arenas.count(), 2u);
  EXPECT_EQ(parts.places.find({}, true), nullptr);
  EXPECT_NE(&parts.places.add_entry({}, true), &entry);
}

TEST(placement, size_classes_split_at_the_small_limit) {
  resource_parts parts(8);
  EXPECT_EQ(parts.places.kind_of(placement::small_limit - 256), 0u);
  EXPECT_EQ(parts.places.kind_of(placement::small_limit), 1u);
  EXPECT_EQ(parts.places.kind_of(std::uint64_t{1} << 40), 1u);  // no large pages
}

TEST(placement, the_slow_path_maps_a_block_and_the_fast_path_serves_the_rest_of_its_page) {
  resource_parts parts(64);
  const std::size_t half = parts.page / 2;
  void* p = parts.allocate(half);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(parts.supply.reserved_bytes(), parts.page);
  placement::stream_entry& entry = *parts.places.find({}, true);
  arena& home = *entry.arenas[parts.places.kind_of(half)].back();
  EXPECT_TRUE(home.contains(reinterpret_cast<std::uintptr_t>(p)));
  void* q = parts.places.try_mapped(home, nullptr, half, 256, 7, 0);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(static_cast<std::byte*>(q), static_cast<std::byte*>(p) + half);
  EXPECT_EQ(home.allocated_at(reinterpret_cast<std::uintptr_t>(q) - home.base())->tag, 7u);
  EXPECT_EQ(parts.supply.reserved_bytes(), parts.page);  // no page mapped for it
  // Past the mapped page the fast path has nothing.
  EXPECT_EQ(parts.places.try_mapped(home, nullptr, parts.page, 256, 0, 0), nullptr);
}

TEST(placement, a_request_no_page_can_serve_reports_the_shortage) {
  resource_parts parts(1);
  ASSERT_NE(parts.allocate(parts.page), nullptr);
  placement::stream_entry& entry = *parts.places.find({}, true);
  std::string shortage;
  EXPECT_EQ(parts.places.place_slow(entry, parts.places.kind_of(parts.page), parts.page, 256, true, shortage),
            nullptr);
  EXPECT_NE(shortage.find("max_size"), std::string::npos) << shortage;
}

}  // namespace
}  // namespace vmm::detail::testing
