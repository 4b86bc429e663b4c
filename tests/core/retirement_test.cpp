// The retirement list with events that have not passed: a test executor whose events pass
// only when the test says so (or when someone synchronizes them), so that the list's
// behaviour with pending work runs on a machine without a GPU.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "vmm/detail/retirement.hpp"
#include "vmm/retirement.hpp"
#include "vmm/stream_executor.hpp"

namespace vmm::testing {
namespace {

// Events are numbers; an event has passed once it is in `passed`.
class manual_executor final : public stream_executor {
 public:
  void copy(void*, const void*, std::size_t, stream_ref) override {}
  void fill(void*, std::uint8_t, std::size_t, stream_ref) override {}
  void synchronize(stream_ref) override {}
  void synchronize_device() override {}
  event_handle create_event() override { return next_.fetch_add(1); }
  void destroy_event(event_handle) noexcept override {}
  void record(event_handle, stream_ref) override {}
  bool done(event_handle event) override {
    std::lock_guard lock(mutex_);
    return passed_.count(event) != 0;
  }
  void synchronize_event(event_handle event) override {
    std::lock_guard lock(mutex_);
    passed_.insert(event);
    ++synchronized_;
  }
  void enqueue_wait(stream_ref, event_handle) override {}
  stream_ref create_stream() override { return {}; }
  void destroy_stream(stream_ref) noexcept override {}

  void pass_all() {
    std::lock_guard lock(mutex_);
    for (event_handle e = 1; e < next_.load(); ++e) passed_.insert(e);
  }
  [[nodiscard]] int synchronized() {
    std::lock_guard lock(mutex_);
    return synchronized_;
  }

 private:
  std::atomic<event_handle> next_{1};
  std::mutex mutex_;
  std::set<event_handle> passed_;
  int synchronized_ = 0;
};

std::vector<stream_event> one_point(stream_executor& executor) {
  std::vector<stream_event> points;
  points.emplace_back(executor, stream_ref());
  return points;
}

// One point shared by two retirements (the importer records one per release for all its
// pages): each stays until the point passes, and neither takes it from the other.
TEST(retirement, a_shared_point_holds_every_retirement_that_waits_for_it) {
  manual_executor executor;
  const auto point = std::make_shared<const stream_event>(executor, stream_ref());
  auto first = std::make_shared<int>(1);
  auto second = std::make_shared<int>(2);
  const std::weak_ptr<void> first_held = first;
  const std::weak_ptr<void> second_held = second;
  detail::retire(std::vector<std::shared_ptr<const stream_event>>{point}, std::move(first));
  detail::retire(std::vector<std::shared_ptr<const stream_event>>{point}, std::move(second));
  collect_retired(false);
  EXPECT_FALSE(first_held.expired());
  EXPECT_FALSE(second_held.expired());
  EXPECT_FALSE(point->done());
  executor.pass_all();
  collect_retired(false);
  EXPECT_TRUE(first_held.expired());
  EXPECT_TRUE(second_held.expired());
  EXPECT_TRUE(point->done());  // still the caller's, and still valid
}

TEST(retirement, collect_retirement_waits_for_and_destroys_only_the_retirement_asked_for) {
  manual_executor executor;
  const std::size_t before = retired_count();
  auto first = std::make_shared<int>(1);
  auto second = std::make_shared<int>(2);
  const std::weak_ptr<void> first_held = first;
  const std::weak_ptr<void> second_held = second;
  detail::retire(one_point(executor), std::move(first));
  detail::retire(one_point(executor), std::move(second));
  EXPECT_EQ(retired_count(), before + 2);
  EXPECT_FALSE(first_held.expired());

  detail::collect_retirement(first_held);
  EXPECT_TRUE(first_held.expired());
  EXPECT_FALSE(second_held.expired());
  EXPECT_EQ(executor.synchronized(), 1);  // its own event only
  EXPECT_EQ(retired_count(), before + 1);

  // Not in the list (any more): nothing happens, nothing waits.
  detail::collect_retirement(first_held);
  detail::collect_retirement(std::weak_ptr<void>());
  EXPECT_EQ(executor.synchronized(), 1);
  EXPECT_EQ(retired_count(), before + 1);

  executor.pass_all();
  collect_retired(false);
  EXPECT_TRUE(second_held.expired());
  EXPECT_EQ(retired_count(), before);
}

}  // namespace
}  // namespace vmm::testing
