// ring_buffer on every provider: the two copies alias, every window across the wrap is
// contiguous, the head/tail protocol (on the host where the memory is host-accessible),
// counters, lifetime, bad capacities.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>

#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/error.hpp"
#include "vmm/ring_buffer.hpp"

namespace vmm::testing {
namespace {

template <class Kind>
class ring_buffers : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->provider_ != nullptr) pool_ = chunk_pool::create(this->provider_);
  }
  void write(const void* base, std::size_t offset, const std::vector<std::uint8_t>& bytes) {
    write_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(base) + offset, bytes);
  }
  std::vector<std::uint8_t> read(const void* base, std::size_t offset, std::size_t n) {
    return read_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(base) + offset, n);
  }
  std::shared_ptr<chunk_pool> pool_;
};
TYPED_TEST_SUITE(ring_buffers, all_memory_kinds, memory_kind_names);

TYPED_TEST(ring_buffers, the_second_copy_aliases_the_first) {
  const std::size_t g = this->granularity_;
  const std::size_t capacity = 3 * g;  // not a power of two
  ring_buffer ring(this->pool_, capacity);
  ASSERT_NE(ring.data(), nullptr);
  EXPECT_EQ(ring.capacity(), capacity);
  EXPECT_EQ(ring.memory().size(), 2 * capacity + g);
  EXPECT_EQ(ring.memory().chunk_count(), 3u);
  const auto bytes = pattern(capacity, 1);
  this->write(ring.data(), 0, bytes);
  EXPECT_EQ(this->read(ring.data(), capacity, capacity), bytes);
  const auto again = pattern(capacity, 2);
  this->write(ring.data(), capacity, again);
  EXPECT_EQ(this->read(ring.data(), 0, capacity), again);
}

TYPED_TEST(ring_buffers, every_window_across_the_wrap_is_contiguous) {
  const std::size_t g = this->granularity_;
  const std::size_t capacity = 2 * g;
  ring_buffer ring(this->pool_, capacity);
  const auto bytes = pattern(capacity, 3);
  this->write(ring.data(), 0, bytes);
  const auto rotated = [&](std::size_t start, std::size_t length) {
    std::vector<std::uint8_t> expected(length);
    for (std::size_t i = 0; i < length; ++i) expected[i] = bytes[(start + i) % capacity];
    return expected;
  };
  // Windows starting anywhere in [0, capacity), up to the whole capacity long, read through
  // one pointer: those that reach past `capacity` cross the wrap.
  for (std::size_t start :
       {std::size_t{0}, std::size_t{1}, g / 2, g - 1, g, capacity - 4096, capacity - 7, capacity - 1}) {
    for (std::size_t length : {std::size_t{1}, std::size_t{64}, g + 3, capacity - start + 1, capacity}) {
      if (length > capacity) continue;
      ASSERT_EQ(this->read(ring.data(), start, length), rotated(start, length))
          << "window [" << start << ", +" << length << ")";
    }
  }
  // A write across the wrap through one pointer lands at the end and at the start.
  const auto record = pattern(300, 4);
  this->write(ring.data(), capacity - 100, record);
  EXPECT_EQ(this->read(ring.data(), capacity - 100, 100),
            std::vector<std::uint8_t>(record.begin(), record.begin() + 100));
  EXPECT_EQ(this->read(ring.data(), 0, 200), std::vector<std::uint8_t>(record.begin() + 100, record.end()));
}

// The protocol run by the host itself needs memory the host can dereference; on GPU memory
// the CUDA suite (tests/cuda/aliasing_test.cu) runs the same protocol in kernels.
template <class Kind>
class host_ring_buffers : public ring_buffers<Kind> {};
TYPED_TEST_SUITE(host_ring_buffers, host_readable_memory_kinds, memory_kind_names);

TYPED_TEST(host_ring_buffers, records_cross_the_wrap_under_the_head_tail_protocol_on_the_host) {
  const std::size_t g = this->granularity_;
  ring_buffer ring(this->pool_, g);
  const ring_buffer_view view = ring.view();
  ASSERT_EQ(view.capacity, g);
  // Empty: nothing to read, everything free.
  EXPECT_EQ(view.readable(), 0u);
  EXPECT_EQ(view.free_space(), g);
  EXPECT_EQ(view.peek(1), nullptr);
  EXPECT_EQ(view.reserve(0), nullptr);
  EXPECT_EQ(view.reserve(g + 1), nullptr);

  // Records of uneven lengths: a header with the length and the number, then the number's
  // pattern. The producer runs ahead by up to the capacity; the consumer checks every one.
  std::uint32_t state = 12345;
  const auto next_length = [&] {
    state = state * 1664525u + 1013904223u;
    return 8 + (state >> 8) % (g / 5);
  };
  std::deque<std::size_t> in_flight;  // lengths produced, not yet consumed
  std::uint32_t produced = 0;
  std::uint32_t consumed = 0;
  std::size_t straddled = 0;
  const std::uint32_t records = 400;
  while (consumed < records) {
    // Produce until the ring is full.
    while (produced < records) {
      const std::size_t length = next_length();
      std::byte* place = view.reserve(length);
      if (place == nullptr) {
        ASSERT_LT(view.free_space(), length);
        break;
      }
      if (*view.head % g + length > g) ++straddled;
      const std::uint32_t header[2] = {static_cast<std::uint32_t>(length), produced};
      std::memcpy(place, header, sizeof header);
      const auto payload = pattern(length - sizeof header, produced);
      std::memcpy(place + sizeof header, payload.data(), payload.size());
      view.publish(length);
      in_flight.push_back(length);
      ++produced;
    }
    // Consume about half of what is there, then produce again.
    const std::size_t batch = std::max<std::size_t>(1, in_flight.size() / 2);
    for (std::size_t i = 0; i < batch; ++i) {
      const std::size_t length = in_flight.front();
      const std::byte* place = view.peek(length);
      ASSERT_NE(place, nullptr) << "record " << consumed;
      std::uint32_t header[2] = {};
      std::memcpy(header, place, sizeof header);
      ASSERT_EQ(header[0], length);
      ASSERT_EQ(header[1], consumed);
      ASSERT_EQ(std::memcmp(place + sizeof header, pattern(length - sizeof header, consumed).data(),
                            length - sizeof header),
                0)
          << "record " << consumed;
      view.consume(length);
      in_flight.pop_front();
      ++consumed;
    }
  }
  EXPECT_GT(straddled, 10u);  // records did cross the wrap
  EXPECT_EQ(view.readable(), 0u);
  EXPECT_EQ(ring.head(), ring.tail());
  EXPECT_GT(ring.head(), 20 * g);  // many laps

  // Full: no byte more fits until one is consumed.
  std::byte* all = view.reserve(g);
  ASSERT_NE(all, nullptr);
  view.publish(g);
  EXPECT_EQ(view.free_space(), 0u);
  EXPECT_EQ(view.reserve(1), nullptr);
  ASSERT_NE(view.peek(g), nullptr);
  view.consume(1);
  EXPECT_NE(view.reserve(1), nullptr);
}

TYPED_TEST(ring_buffers, counters_start_at_zero_even_in_reused_memory_and_reset) {
  const std::size_t g = this->granularity_;
  const std::uint64_t dirty = 0x0123456789abcdefull;
  {
    ring_buffer ring(this->pool_, g);
    EXPECT_EQ(ring.head(), 0u);
    EXPECT_EQ(ring.tail(), 0u);
    const auto view = ring.view();
    this->provider_->executor().copy(view.head, &dirty, sizeof dirty, {});
    this->provider_->executor().copy(view.tail, &dirty, sizeof dirty, {});
    this->provider_->executor().synchronize({});
    EXPECT_EQ(ring.head(), dirty);
    EXPECT_EQ(ring.tail(), dirty);
    ring.reset();
    EXPECT_EQ(ring.head(), 0u);
    this->provider_->executor().copy(view.head, &dirty, sizeof dirty, {});
    this->provider_->executor().synchronize({});
  }
  const std::size_t created = this->pool_->statistics().chunks_created;
  ring_buffer again(this->pool_, g);  // the same chunks, back from the pool
  EXPECT_EQ(this->pool_->statistics().chunks_created, created);
  EXPECT_EQ(again.head(), 0u);
  EXPECT_EQ(again.tail(), 0u);
}

TYPED_TEST(ring_buffers, the_ring_holds_its_chunks_until_it_goes) {
  const std::size_t g = this->granularity_;
  {
    ring_buffer ring(this->pool_, 4 * g);
    EXPECT_EQ(this->pool_->statistics().used_current, 5 * g);  // the memory once, plus the control block
    ring_buffer moved = std::move(ring);
    EXPECT_EQ(ring.data(), nullptr);       // NOLINT(bugprone-use-after-move): the contract under test
    EXPECT_EQ(ring.capacity(), 0u);        // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(ring.view().data, nullptr);  // NOLINT(bugprone-use-after-move)
    EXPECT_THROW((void)ring.head(), invalid_argument);  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(moved.capacity(), 4 * g);
    ring_buffer other(this->pool_, g);
    other = std::move(moved);  // other's own chunks go back
    EXPECT_EQ(this->pool_->statistics().used_current, 5 * g);
  }
  EXPECT_EQ(this->pool_->statistics().used_current, 0u);
}

TYPED_TEST(ring_buffers, a_capacity_off_the_granularity_is_refused_with_the_reason) {
  const std::size_t g = this->granularity_;
  for (std::size_t capacity : {g + 1, g / 2, 3 * g - 4096}) {
    try {
      ring_buffer ring(this->pool_, capacity);
      ADD_FAILURE() << "capacity " << capacity << " was accepted";
    } catch (const invalid_argument& error) {
      EXPECT_NE(std::string(error.what())
                    .find(fmt::format("capacity {} is not a multiple of the granularity {}", capacity, g)),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_THROW(ring_buffer(this->pool_, 0), invalid_argument);
  EXPECT_THROW(ring_buffer(std::shared_ptr<chunk_pool>{}, g), invalid_argument);
  const access_grant foreign[] = {{accessor::device(1 << 20), access_mode::read_write}};
  EXPECT_ANY_THROW(ring_buffer(this->pool_, g, {.access = {foreign[0]}}));
  EXPECT_EQ(this->pool_->statistics().used_current, 0u);
}

}  // namespace
}  // namespace vmm::testing
