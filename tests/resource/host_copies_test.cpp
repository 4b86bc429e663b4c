// The host memory of memory_resource::sleep() (resource/host_copies.hpp): ready a piece at
// a time, in order, each pinned before it is handed out and unpinned when it goes; a
// failure at any step keeps nothing. With a recording executor, on any machine.

#include "resource/host_copies.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "fault_injection.hpp"
#include "vmm/error.hpp"

namespace vmm::testing {
namespace {

using detail::host_copies;
constexpr std::size_t piece = host_copies::piece_bytes;

// Copies with memcpy; records what is pinned and unpinned, and can fail the nth pin.
class recording_executor final : public stream_executor {
 public:
  void copy(void* destination, const void* source, std::size_t n, stream_ref) override {
    std::memcpy(destination, source, n);
  }
  void fill(void* destination, std::uint8_t value, std::size_t n, stream_ref) override {
    std::memset(destination, value, n);
  }
  void synchronize(stream_ref) override {}
  void synchronize_device() override {}
  event_handle create_event() override { return 0; }
  void destroy_event(event_handle) noexcept override {}
  void record(event_handle, stream_ref) override {}
  bool done(event_handle) override { return true; }
  void synchronize_event(event_handle) override {}
  void enqueue_wait(stream_ref, event_handle) override {}
  stream_ref create_stream() override { return {}; }
  void destroy_stream(stream_ref) noexcept override {}

  void pin_host(void* p, std::size_t n) override {
    std::lock_guard lock(mutex_);
    if (++pins_tried_ == fail_pin_) throw out_of_memory("recording_executor: the pin asked to fail");
    pinned_.emplace_back(p, n);
  }
  void unpin_host(void* p, std::size_t n) noexcept override {
    std::lock_guard lock(mutex_);
    unpinned_.emplace_back(p, n);
  }

  std::size_t fail_pin_ = 0;  // 1-based; 0: none fails
  std::size_t pins_tried_ = 0;
  std::vector<std::pair<void*, std::size_t>> pinned_;
  std::vector<std::pair<void*, std::size_t>> unpinned_;

 private:
  std::mutex mutex_;
};

TEST(host_copies, every_piece_is_pinned_before_it_is_handed_out_in_order_and_unpinned_when_they_go) {
  recording_executor executor;
  const std::size_t before = host_copies::bytes_in_process();
  const std::size_t bytes = 2 * piece + piece / 2 + 4096;
  std::vector<std::pair<std::size_t, std::size_t>> handed;
  {
    host_copies copies(bytes, executor);
    EXPECT_EQ(copies.size(), bytes);
    EXPECT_EQ(host_copies::bytes_in_process(), before + bytes);
    copies.prepare([&](std::size_t offset, std::size_t n) {
      EXPECT_EQ(executor.pinned_.size(), handed.size() + 1)
          << "piece " << handed.size() << " not pinned first";
      std::memset(copies.data() + offset, static_cast<int>(handed.size() + 1), n);  // writable, whole
      handed.emplace_back(offset, n);
    });
    const std::vector<std::pair<std::size_t, std::size_t>> expected = {
        {0, piece}, {piece, piece}, {2 * piece, piece / 2 + 4096}};
    EXPECT_EQ(handed, expected);
    ASSERT_EQ(executor.pinned_.size(), 3u);
    for (std::size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(executor.pinned_[k].first, copies.data() + k * piece);
      EXPECT_EQ(executor.pinned_[k].second, expected[k].second);
      EXPECT_EQ(static_cast<int>(copies.data()[expected[k].first + expected[k].second - 1]),
                static_cast<int>(k + 1));
    }
    // A copy never crosses from one pinned piece into the next.
    std::vector<std::pair<std::size_t, std::size_t>> parts;
    copies.for_each_piece(piece - 100, piece + 300,
                          [&](std::size_t o, std::size_t n) { parts.emplace_back(o, n); });
    const std::vector<std::pair<std::size_t, std::size_t>> split = {
        {piece - 100, 100}, {piece, piece}, {2 * piece, 200}};
    EXPECT_EQ(parts, split);
    parts.clear();
    copies.for_each_piece(10, 20, [&](std::size_t o, std::size_t n) { parts.emplace_back(o, n); });
    EXPECT_EQ(parts, (std::vector<std::pair<std::size_t, std::size_t>>{{10, 20}}));
    EXPECT_TRUE(executor.unpinned_.empty());
  }
  EXPECT_EQ(executor.unpinned_, executor.pinned_);
  EXPECT_EQ(host_copies::bytes_in_process(), before);
}

TEST(host_copies, a_pin_that_fails_leaves_only_the_pieces_before_it_to_unpin) {
  recording_executor executor;
  executor.fail_pin_ = 2;
  const std::size_t before = host_copies::bytes_in_process();
  std::size_t handed = 0;
  {
    host_copies copies(3 * piece, executor);
    EXPECT_THROW(copies.prepare([&](std::size_t, std::size_t) { ++handed; }), out_of_memory);
  }
  EXPECT_EQ(handed, 1u);
  ASSERT_EQ(executor.pinned_.size(), 1u);
  EXPECT_EQ(executor.unpinned_, executor.pinned_);
  EXPECT_EQ(host_copies::bytes_in_process(), before);
}

TEST(host_copies, a_ready_call_that_throws_stops_the_rest) {
  recording_executor executor;
  const std::size_t before = host_copies::bytes_in_process();
  {
    host_copies copies(4 * piece, executor);
    EXPECT_THROW(copies.prepare([&](std::size_t offset, std::size_t) {
      if (offset == piece) throw std::runtime_error("stop");
    }),
                 std::runtime_error);
    EXPECT_EQ(executor.pinned_.size(), 2u);
  }
  EXPECT_EQ(executor.unpinned_, executor.pinned_);
  EXPECT_EQ(host_copies::bytes_in_process(), before);
}

TEST(host_copies, refuses_what_cannot_be_had_and_keeps_nothing) {
  recording_executor executor;
  const std::size_t before = host_copies::bytes_in_process();
  EXPECT_THROW(host_copies(0, executor), invalid_argument);
  try {
    host_copies copies(std::size_t{1} << 60, executor);
    ADD_FAILURE() << "an exabyte of host copies was had";
  } catch (const out_of_memory& error) {
    EXPECT_NE(std::string(error.what()).find("sleep needs 1152921504606846976 bytes of host memory"),
              std::string::npos)
        << error.what();
  }
  detail::fault::arm(detail::fault::mmap, 1, ENOMEM);
  EXPECT_THROW(host_copies(piece, executor), out_of_memory);
  const bool fired = detail::fault::fired();
  detail::fault::disarm();
  EXPECT_TRUE(fired);
  EXPECT_EQ(host_copies::bytes_in_process(), before);
  EXPECT_TRUE(executor.pinned_.empty());
}

}  // namespace
}  // namespace vmm::testing
