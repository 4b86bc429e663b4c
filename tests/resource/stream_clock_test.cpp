// The stream clock of the memory resource (vmm/src/resource/stream_clock.hpp) on its own:
// points close epochs, passed points advance `passed`, the host waits only where it must
// (and counts it), and wait_for orders one stream after another's point.

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "resource/stream_clock.hpp"
#include "vmm/stream_executor.hpp"

namespace vmm::detail {
namespace {

// A device whose work is done only when the test says so (or the host waits for it).
class held_device final : public stream_executor {
 public:
  void copy(void*, const void*, std::size_t, stream_ref) override {}
  void fill(void*, std::uint8_t, std::size_t, stream_ref) override {}
  void synchronize(stream_ref) override { synchronize_device(); }
  void synchronize_device() override {
    ++device_waits;
    finish_all();
  }
  event_handle create_event() override { return next_++; }
  void destroy_event(event_handle) noexcept override {}
  void record(event_handle event, stream_ref) override { done_.erase(event); }
  bool done(event_handle event) override { return done_.count(event) != 0; }
  void synchronize_event(event_handle event) override {
    ++event_waits;
    done_.insert(event);
  }
  void enqueue_wait(stream_ref stream, event_handle event) override { waits.emplace_back(stream, event); }
  stream_ref create_stream() override { return {}; }
  void destroy_stream(stream_ref) noexcept override {}

  void finish_all() {
    for (event_handle e = 1; e < next_; ++e) done_.insert(e);
  }

  int device_waits = 0;
  int event_waits = 0;
  std::vector<std::pair<stream_ref, event_handle>> waits;

 private:
  event_handle next_ = 1;
  std::set<event_handle> done_;
};

stream_ref stream_at(std::uintptr_t value) {
  return stream_ref(reinterpret_cast<CUstream_st*>(value));
}

TEST(stream_clock, a_point_closes_the_open_epoch) {
  held_device device;
  stream_clock clock(device, false);
  stream_record& record = clock.add(stream_at(0x100), false);
  record.frees.store(5);
  std::lock_guard lock(record.mutex);
  clock.record_point(record);
  EXPECT_EQ(record.epoch.load(), 2u);
  EXPECT_EQ(record.passed.load(), 0u);
  EXPECT_EQ(record.frees.load(), 0u);
  ASSERT_EQ(record.points.size(), 1u);
  EXPECT_EQ(record.points.front().first, 1u);
  EXPECT_EQ(record.outstanding.load(), 1u);
}

TEST(stream_clock, refresh_passes_only_what_is_done_unless_it_may_wait) {
  held_device device;
  stream_clock clock(device, false);
  stream_record& record = clock.add(stream_at(0x100), false);
  {
    std::lock_guard lock(record.mutex);
    clock.record_point(record);
  }
  clock.refresh(nullptr, false);
  EXPECT_EQ(record.passed.load(), 0u);
  EXPECT_EQ(clock.host_waits(), 0u);
  clock.refresh(nullptr, true);
  EXPECT_EQ(record.passed.load(), 1u);
  EXPECT_TRUE(record.points.empty());
  EXPECT_EQ(clock.host_waits(), 1u);
  EXPECT_EQ(device.event_waits, 1);
}

TEST(stream_clock, refresh_records_a_point_on_the_calling_stream_only) {
  held_device device;
  stream_clock clock(device, false);
  stream_record& caller = clock.add(stream_at(0x100), false);
  stream_record& other = clock.add(stream_at(0x200), false);
  caller.frees.store(1);
  other.frees.store(1);
  clock.refresh(&caller, false);
  EXPECT_EQ(caller.epoch.load(), 2u);
  EXPECT_EQ(other.epoch.load(), 1u);  // a stream not named by the call may be gone
}

TEST(stream_clock, point_after_records_where_the_epoch_is_open) {
  held_device device;
  stream_clock clock(device, false);
  stream_record& record = clock.add(stream_at(0x100), false);
  std::lock_guard lock(record.mutex);
  EXPECT_TRUE(clock.point_after(record, 1));
  EXPECT_EQ(record.points.size(), 1u);
  EXPECT_TRUE(clock.point_after(record, 1));  // closed already: no second point
  EXPECT_EQ(record.points.size(), 1u);
  EXPECT_EQ(clock.host_waits(), 0u);
}

TEST(stream_clock, a_stream_with_every_point_it_may_have_makes_the_host_wait_for_the_oldest) {
  held_device device;
  stream_clock clock(device, false);
  stream_record& record = clock.add(stream_at(0x100), false);
  std::lock_guard lock(record.mutex);
  for (std::size_t i = 0; i < stream_clock::max_points + 3; ++i) clock.record_point(record);
  EXPECT_EQ(record.points.size(), stream_clock::max_points);
  const std::uint64_t open = record.epoch.load();
  EXPECT_TRUE(clock.point_after(record, open));
  EXPECT_EQ(clock.host_waits(), 1u);
  EXPECT_EQ(record.passed.load(), 1u);
  EXPECT_GT(record.epoch.load(), open);
}

TEST(stream_clock, wait_past_counts_a_wait_only_where_the_stream_had_not_passed) {
  held_device device;
  stream_clock clock(device, false);
  stream_record& record = clock.add(stream_at(0x100), false);
  {
    std::lock_guard lock(record.mutex);
    clock.record_point(record);
  }
  device.finish_all();
  clock.wait_past(record, 1);
  EXPECT_EQ(clock.host_waits(), 0u);
  EXPECT_EQ(record.passed.load(), 1u);
  clock.wait_past(record, 2);  // the open epoch has no point: the device is waited for
  EXPECT_EQ(clock.host_waits(), 1u);
  EXPECT_EQ(device.device_waits, 1);
}

TEST(stream_clock, synchronize_closes_every_epoch_without_an_event) {
  held_device device;
  stream_clock clock(device, false);
  stream_record& a = clock.add(stream_at(0x100), false);
  stream_record& sync = clock.add({}, true);
  {
    std::lock_guard lock(a.mutex);
    clock.record_point(a);
  }
  clock.synchronize();
  EXPECT_EQ(device.device_waits, 1);
  EXPECT_EQ(a.passed.load(), 2u);
  EXPECT_TRUE(a.points.empty());
  EXPECT_EQ(a.outstanding.load(), 0u);
  EXPECT_EQ(sync.passed.load(), 1u);
}

TEST(stream_clock, order_after_enqueues_a_wait_on_a_new_point_and_keeps_the_latest_epoch) {
  held_device device;
  stream_clock clock(device, false);
  stream_record& freeing = clock.add(stream_at(0x100), false);
  const stream_ref waiting = stream_at(0x200);
  clock.order_after(waiting, freeing);
  clock.order_after(waiting, freeing);
  ASSERT_EQ(device.waits.size(), 2u);
  EXPECT_EQ(device.waits[0].first, waiting);
  ASSERT_EQ(freeing.waited_by.size(), 1u);
  EXPECT_EQ(freeing.waited_by[0].second, 2u);
}

TEST(stream_clock, the_points_to_retire_after_need_the_device_where_frees_follow_the_last_point) {
  held_device device;
  stream_clock clock(device, false);
  stream_record& record = clock.add(stream_at(0x100), false);
  {
    std::lock_guard lock(record.mutex);
    clock.record_point(record);
  }
  EXPECT_EQ(clock.points_to_retire_after().size(), 1u);
  record.frees.store(1);
  EXPECT_TRUE(clock.points_to_retire_after().empty());
  EXPECT_EQ(device.device_waits, 1);
}

TEST(stream_clock, a_synchronous_clock_never_waits) {
  held_device device;
  stream_clock clock(device, true);
  stream_record& record = clock.add(stream_at(0x100), false);
  record.frees.store(1);
  clock.refresh(&record, true);
  EXPECT_TRUE(record.points.empty());
  EXPECT_EQ(clock.host_waits(), 0u);
  EXPECT_TRUE(clock.points_to_retire_after().empty());
  EXPECT_EQ(device.device_waits, 0);
}

}  // namespace
}  // namespace vmm::detail
