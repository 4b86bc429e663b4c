// Sleep and wake of the memory resource (vmm/src/resource/sleep_wake.hpp) on its own, on OS
// host memory: sleep keeps the bytes of the offloaded tags in host copies and gives every
// page back; wake maps pages again under the waking tags and copies the bytes back.

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "resource_parts.hpp"
#include "vmm/error.hpp"

namespace vmm::detail::testing {
namespace {

TEST(sleep_wake, keeps_the_offloaded_bytes_and_gives_every_page_back) {
  resource_parts parts(16);
  auto* kept = static_cast<unsigned char*>(parts.allocate(parts.page, 1));
  auto* dropped = static_cast<unsigned char*>(parts.allocate(parts.page, 2));
  ASSERT_NE(kept, nullptr);
  ASSERT_NE(dropped, nullptr);
  std::memset(kept, 0x5a, parts.page);
  parts.sleeper.prepare_sleep();
  const allocation_tag offload[] = {allocation_tag{1}};
  parts.sleeper.sleep(offload, {});
  EXPECT_TRUE(parts.sleeper.asleep());
  EXPECT_EQ(parts.supply.reserved_bytes(), 0u);
  EXPECT_EQ(parts.sleeper.host_copy_bytes(), parts.page);
  EXPECT_THROW(parts.sleeper.prepare_sleep(), invalid_argument);

  const allocation_tag wake_first[] = {allocation_tag{1}};
  parts.sleeper.wake(wake_first, {}, after_wake::keep_host_copies);
  EXPECT_TRUE(parts.sleeper.asleep());  // tag 2 sleeps still
  std::vector<unsigned char> expected(parts.page, 0x5a);
  EXPECT_EQ(std::memcmp(kept, expected.data(), parts.page), 0);
  parts.sleeper.wake({}, {}, after_wake::give_back_host_copies);
  EXPECT_FALSE(parts.sleeper.asleep());
  EXPECT_EQ(parts.sleeper.host_copy_bytes(), 0u);
  EXPECT_EQ(parts.supply.reserved_bytes(), 2 * parts.page);
  EXPECT_THROW(parts.sleeper.wake({}, {}, after_wake::give_back_host_copies), invalid_argument);
}

TEST(sleep_wake, a_wake_without_the_pages_changes_nothing) {
  resource_parts parts(2);
  ASSERT_NE(parts.allocate(2 * parts.page, 1), nullptr);
  parts.sleeper.prepare_sleep();
  parts.sleeper.sleep({}, {});
  parts.supply.add_spare(1);  // a page the wake cannot count on: max_size is two
  EXPECT_THROW(parts.sleeper.wake({}, {}, after_wake::give_back_host_copies), out_of_memory);
  EXPECT_TRUE(parts.sleeper.asleep());
  EXPECT_EQ(parts.supply.reserved_bytes(), parts.page);
}

}  // namespace
}  // namespace vmm::detail::testing
