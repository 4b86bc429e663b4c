// stripe_layout: the placement arithmetic of striped buffers, on the host (it runs on CI).
// Worked examples for both modes, then every byte of many small layouts: the owner device_of
// names is the device whose stripes, walked as a kernel walks them, cover that byte.

#include "vmm/stripe_layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "vmm/error.hpp"

namespace vmm::testing {
namespace {

static_assert(std::is_trivially_copyable_v<stripe_layout>);

// Usable in constant expressions, as in device code.
constexpr stripe_layout four_by_three{40, 4, 3, stripe_mode::round_robin};
static_assert(four_by_three.device_of(0) == 0 && four_by_three.device_of(4) == 1 &&
              four_by_three.device_of(12) == 0);
static_assert(four_by_three.stripe_offset(2, 1) == 20);

TEST(stripe_layout, round_robin_deals_stripes_in_turn_and_the_last_one_is_short) {
  // 38 bytes in stripes of 4 over 3 devices: 10 stripes, the last of 2 bytes (on device 0).
  const stripe_layout layout = make_stripe_layout(38, 4, 3, stripe_mode::round_robin);
  EXPECT_EQ(layout.unit_count(), 10u);
  EXPECT_EQ(layout.stripe_count(), 10u);
  const std::uint32_t owners[] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0};
  for (std::uint64_t u = 0; u < 10; ++u) {
    EXPECT_EQ(layout.device_of(u * 4), owners[u]) << "stripe " << u;
    EXPECT_EQ(layout.device_of(u * 4 + (u == 9 ? 1 : 3)), owners[u]) << "end of stripe " << u;
  }
  EXPECT_EQ(layout.stripes_of(0), 4u);
  EXPECT_EQ(layout.stripes_of(1), 3u);
  EXPECT_EQ(layout.stripes_of(2), 3u);
  EXPECT_EQ(layout.stripe_offset(1, 2), 28u);
  EXPECT_EQ(layout.stripe_length(1, 2), 4u);
  EXPECT_EQ(layout.stripe_offset(0, 3), 36u);
  EXPECT_EQ(layout.stripe_length(0, 3), 2u);
  EXPECT_EQ(layout.bytes_on(0), 14u);
  EXPECT_EQ(layout.bytes_on(1), 12u);
  EXPECT_EQ(layout.bytes_on(2), 12u);
  const stripe_position p = layout.locate(30);
  EXPECT_EQ(p.device, 1u);
  EXPECT_EQ(p.index, 2u);
  EXPECT_EQ(p.extent.offset, 28u);
  EXPECT_EQ(p.extent.length, 4u);
  EXPECT_EQ(layout.local_to_offset(2, 5), 20u + 1);  // device 2's second stripe starts at 20
  EXPECT_EQ(layout.offset_to_local(21), 5u);
}

TEST(stripe_layout, contiguous_gives_each_device_one_block_as_even_as_whole_units_allow) {
  // 10 units of 4 bytes (the last of 2) over 3 devices: blocks of 4, 3 and 3 units.
  const stripe_layout layout = make_stripe_layout(38, 4, 3, stripe_mode::contiguous);
  EXPECT_EQ(layout.stripe_count(), 3u);
  for (std::uint32_t d = 0; d < 3; ++d) EXPECT_EQ(layout.stripes_of(d), 1u);
  EXPECT_EQ(layout.stripe_of(0, 0).offset, 0u);
  EXPECT_EQ(layout.stripe_of(0, 0).length, 16u);
  EXPECT_EQ(layout.stripe_of(1, 0).offset, 16u);
  EXPECT_EQ(layout.stripe_of(1, 0).length, 12u);
  EXPECT_EQ(layout.stripe_of(2, 0).offset, 28u);
  EXPECT_EQ(layout.stripe_of(2, 0).length, 10u);
  EXPECT_EQ(layout.device_of(15), 0u);
  EXPECT_EQ(layout.device_of(16), 1u);
  EXPECT_EQ(layout.device_of(27), 1u);
  EXPECT_EQ(layout.device_of(28), 2u);
  EXPECT_EQ(layout.device_of(37), 2u);
  EXPECT_EQ(layout.bytes_on(2), 10u);
  EXPECT_EQ(layout.local_to_offset(1, 3), 19u);
  EXPECT_EQ(layout.offset_to_local(19), 3u);
  EXPECT_EQ(layout.locate(20).extent.offset, 16u);
  EXPECT_EQ(layout.locate(20).index, 0u);
}

TEST(stripe_layout, devices_beyond_the_number_of_units_get_nothing) {
  for (stripe_mode mode : {stripe_mode::round_robin, stripe_mode::contiguous}) {
    const stripe_layout layout = make_stripe_layout(8, 4, 5, mode);
    EXPECT_EQ(layout.stripe_count(), 2u);
    EXPECT_EQ(layout.stripes_of(0), 1u);
    EXPECT_EQ(layout.stripes_of(1), 1u);
    for (std::uint32_t d = 2; d < 5; ++d) {
      EXPECT_EQ(layout.stripes_of(d), 0u);
      EXPECT_EQ(layout.bytes_on(d), 0u);
    }
    EXPECT_EQ(layout.device_of(7), 1u);
  }
}

TEST(stripe_layout, one_device_holds_everything) {
  const stripe_layout rr = make_stripe_layout(10, 4, 1, stripe_mode::round_robin);
  EXPECT_EQ(rr.stripes_of(0), 3u);
  EXPECT_EQ(rr.bytes_on(0), 10u);
  const stripe_layout block = make_stripe_layout(10, 4, 1, stripe_mode::contiguous);
  EXPECT_EQ(block.stripes_of(0), 1u);
  EXPECT_EQ(block.stripe_of(0, 0).length, 10u);
}

// Every byte of every small layout: walking each device's stripes as a kernel does covers
// each byte exactly once, by the device device_of names; local offsets run 0..bytes_on - 1
// in address order and invert.
TEST(stripe_layout, every_offsets_owner_agrees_with_iteration) {
  int layouts = 0;
  for (stripe_mode mode : {stripe_mode::round_robin, stripe_mode::contiguous})
    for (std::uint32_t devices = 1; devices <= 7; ++devices)
      for (std::uint64_t stripe = 1; stripe <= 6; ++stripe)
        for (std::uint64_t size = 1; size <= 61; size += (size < 20 ? 1 : 7)) {
          const stripe_layout layout = make_stripe_layout(size, stripe, devices, mode);
          SCOPED_TRACE(::testing::Message()
                       << (mode == stripe_mode::round_robin ? "round_robin" : "contiguous") << " size "
                       << size << " stripe " << stripe << " devices " << devices);
          std::vector<int> owner(size, -1);
          std::uint64_t stripes = 0;
          std::uint64_t total = 0;
          for (std::uint32_t d = 0; d < devices; ++d) {
            std::uint64_t local = 0;
            std::uint64_t previous_end = 0;
            for (std::uint64_t k = 0; k < layout.stripes_of(d); ++k) {
              const stripe_extent s = layout.stripe_of(d, k);
              ASSERT_GT(s.length, 0u);
              ASSERT_LE(s.offset + s.length, size);
              ASSERT_GE(s.offset, previous_end) << "stripes of a device in address order";
              ASSERT_EQ(s.offset % stripe, 0u) << "stripes start on unit boundaries";
              previous_end = s.offset + s.length;
              for (std::uint64_t i = 0; i < s.length; ++i) {
                const std::uint64_t at = s.offset + i;
                ASSERT_EQ(owner[at], -1) << "byte " << at << " in two stripes";
                owner[at] = static_cast<int>(d);
                ASSERT_EQ(layout.local_to_offset(d, local), at);
                ASSERT_EQ(layout.offset_to_local(at), local);
                const stripe_position p = layout.locate(at);
                ASSERT_EQ(p.device, d);
                ASSERT_EQ(p.index, k);
                ASSERT_EQ(p.extent.offset, s.offset);
                ASSERT_EQ(p.extent.length, s.length);
                ++local;
              }
            }
            ASSERT_EQ(layout.bytes_on(d), local);
            stripes += layout.stripes_of(d);
            total += local;
          }
          ASSERT_EQ(total, size);
          ASSERT_EQ(stripes, layout.stripe_count());
          for (std::uint64_t at = 0; at < size; ++at)
            ASSERT_EQ(static_cast<int>(layout.device_of(at)), owner[at]) << "byte " << at;
          if (mode == stripe_mode::contiguous) {
            // Blocks in device order, their sizes in units differing by at most one.
            std::uint64_t smallest = std::numeric_limits<std::uint64_t>::max();
            std::uint64_t largest = 0;
            for (std::uint32_t d = 0; d < devices; ++d) {
              const std::uint64_t units = layout.first_unit(d + 1) - layout.first_unit(d);
              smallest = std::min(smallest, units);
              largest = std::max(largest, units);
              if (d > 0 && layout.stripes_of(d) > 0) {
                ASSERT_GT(layout.stripe_offset(d, 0), layout.stripe_offset(d - 1, 0));
              }
            }
            ASSERT_LE(largest - smallest, 1u);
          }
          ++layouts;
        }
  EXPECT_EQ(layouts, 2 * 7 * 6 * 25);  // sizes 1..19, then 20, 27, ..., 55
}

TEST(stripe_layout, large_ranges_stay_exact) {
  // 200 GiB over 3 GPUs in 64 MiB stripes, with a short last stripe: no overflow, the end
  // of the range is owned by the device the formula names.
  constexpr std::uint64_t mib = std::uint64_t{1} << 20;
  const std::uint64_t size = (std::uint64_t{200} << 30) + 6 * mib;
  for (stripe_mode mode : {stripe_mode::round_robin, stripe_mode::contiguous}) {
    const stripe_layout layout = make_stripe_layout(size, 64 * mib, 3, mode);
    std::uint64_t total = 0;
    for (std::uint32_t d = 0; d < 3; ++d) total += layout.bytes_on(d);
    EXPECT_EQ(total, size);
    const stripe_position last = layout.locate(size - 1);
    EXPECT_EQ(last.extent.offset + last.extent.length, size);
    EXPECT_EQ(layout.stripe_of(last.device, last.index).offset, last.extent.offset);
    EXPECT_EQ(layout.local_to_offset(last.device, layout.bytes_on(last.device) - 1), size - 1);
  }
  // 200 GiB + 6 MiB is 3201 units of 64 MiB: 1067 each in both modes.
  EXPECT_EQ(make_stripe_layout(size, 64 * mib, 3, stripe_mode::round_robin).device_of(size - 1), 2u);
  EXPECT_EQ(make_stripe_layout(size, 64 * mib, 3, stripe_mode::contiguous).stripe_of(2, 0).offset,
            2 * 1067 * 64 * mib);
}

TEST(stripe_layout, bad_fields_are_refused) {
  EXPECT_THROW((void)make_stripe_layout(0, 4, 2, stripe_mode::round_robin), invalid_argument);
  EXPECT_THROW((void)make_stripe_layout(8, 0, 2, stripe_mode::round_robin), invalid_argument);
  EXPECT_THROW((void)make_stripe_layout(8, 4, 0, stripe_mode::contiguous), invalid_argument);
  EXPECT_THROW((void)make_stripe_layout(8, 4, 2, static_cast<stripe_mode>(7)), invalid_argument);
  EXPECT_THROW(
      (void)make_stripe_layout(std::numeric_limits<std::uint64_t>::max() - 3, 8, 2, stripe_mode::round_robin),
      invalid_argument);
  EXPECT_NO_THROW((void)make_stripe_layout(std::numeric_limits<std::uint64_t>::max() - 8, 8, 2,
                                           stripe_mode::round_robin));
}

}  // namespace
}  // namespace vmm::testing
