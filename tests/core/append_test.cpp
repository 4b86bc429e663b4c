// append_from_kernel's protocol without a GPU: vectors in OS host memory (4 KiB granules, so
// that growth shows at small sizes), with host functions as the "kernels", pushing through
// append_view from several threads. Every element must be there exactly once (order free)
// however often the capacity ran out, the rounds must relaunch only the windows that did not
// fit, and a failure must leave the vector as it was. The view's host path (std::atomic_ref)
// is the same code a kernel's push compiles to, less the warp aggregation.

#include "vmm/append.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "vmm/chunk_pool.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/error.hpp"

namespace vmm::testing {
namespace {

constexpr std::size_t granule = 4096;
constexpr int threads = 4;

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return x ^ (x >> 33);
}

// Input i produces 0 to `most` elements (i * 64 + j): some inputs none, so that windows and
// threads see uneven work. Every element is distinct.
struct workload {
  std::uint64_t inputs = 0;
  unsigned most = 3;
  std::uint64_t quiet_below = 0;  // inputs below it produce nothing (a skewed output)

  [[nodiscard]] unsigned elements_of(std::uint64_t i) const {
    return i < quiet_below ? 0 : static_cast<unsigned>(mix(i) % (most + 1));
  }
  [[nodiscard]] std::vector<std::uint64_t> expected() const {
    std::vector<std::uint64_t> all;
    for (std::uint64_t i = 0; i < inputs; ++i)
      for (unsigned j = 0; j < elements_of(i); ++j) all.push_back(i * 64 + j);
    return all;
  }
};

// How the host "kernel" pushes: one value at a time, a thread's values as one span, or the
// filter shape (candidates and a mask).
enum class push_form { value, span, selected };

// The "kernel": `threads` host threads split [first, view.limit(n)) and push every element
// of each input. Records the first input of every launch.
struct host_launch {
  const workload* work;
  push_form form = push_form::value;
  bool stop_when_overflowed = true;
  std::vector<std::size_t>* firsts = nullptr;

  void operator()(append_view<std::uint64_t> view, std::size_t first, stream_ref) const {
    if (firsts != nullptr) firsts->push_back(first);
    if (stop_when_overflowed && view.overflowed()) return;
    const std::uint64_t end = view.limit(work->inputs);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (std::uint64_t i = first + static_cast<std::uint64_t>(t); i < end; i += threads) {
          const unsigned count = work->elements_of(i);
          std::uint64_t values[8] = {};
          for (unsigned j = 0; j < count; ++j) values[j] = i * 64 + j;
          switch (form) {
            case push_form::value:
              for (unsigned j = 0; j < count; ++j) view.push(values[j]);
              break;
            case push_form::span:
              view.push(std::span<const std::uint64_t>(values, count));
              break;
            case push_form::selected:
              view.push_selected(values, (std::uint32_t{1} << count) - 1);
              break;
          }
        }
      });
    }
    for (std::thread& thread : pool) thread.join();
  }
};

std::vector<std::uint64_t> sorted(std::vector<std::uint64_t> values) {
  std::sort(values.begin(), values.end());
  return values;
}

class append_from_host : public ::testing::Test {
 protected:
  device_vector<std::uint64_t> make(std::size_t max_granules,
                                    chunk_policy policy = chunk_policy::geometric()) {
    return device_vector<std::uint64_t>(pool_, {.max_size = max_granules * granule, .policy = policy});
  }
  std::shared_ptr<chunk_pool> pool_ = chunk_pool::create(make_os_host_provider({.granularity = granule}));

  // Appends `work` into `vector` from one granule of capacity, with windows, and expects
  // every element once; returns what the call did.
  static append_statistics append_from_one_granule(device_vector<std::uint64_t>& vector, const workload& work,
                                                   push_form form = push_form::selected,
                                                   std::vector<std::size_t>* firsts = nullptr) {
    vector.reserve(1);  // one granule: 480 slots
    append_statistics statistics;
    append_from_kernel(vector, host_launch{&work, form, true, firsts}, stream_ref{},
                       {.input_count = work.inputs, .statistics = &statistics});
    EXPECT_EQ(sorted(vector.to_host()), work.expected());
    return statistics;
  }
  // Bytes of capacity the elements of `work` and the status block take.
  static std::size_t bytes_for(const workload& work) {
    return work.expected().size() * sizeof(std::uint64_t) + detail::append_status_bytes;
  }
};

TEST_F(append_from_host, everything_that_fits_takes_one_round_and_one_launch) {
  const workload work{.inputs = 20000};
  const auto expected = work.expected();
  auto vector = make(1024);
  vector.reserve(expected.size() + 1000);
  const std::uint64_t* const address = vector.data();
  append_statistics statistics;
  const std::size_t appended =
      append_from_kernel(vector, host_launch{&work}, stream_ref{}, {.statistics = &statistics});
  EXPECT_EQ(appended, expected.size());
  EXPECT_EQ(vector.size(), expected.size());
  EXPECT_EQ(sorted(vector.to_host()), expected);
  EXPECT_EQ(vector.data(), address);
  EXPECT_EQ(statistics.rounds, 1u);
  EXPECT_EQ(statistics.launches, 1u);
  EXPECT_EQ(statistics.growths, 0u);
}

TEST_F(append_from_host, every_push_form_appends_every_element_once) {
  const workload work{.inputs = 30000, .most = 7};
  const auto expected = work.expected();
  for (const push_form form : {push_form::value, push_form::span, push_form::selected}) {
    auto vector = make(1024);  // nothing mapped: it grows
    const std::size_t appended =
        append_from_kernel(vector, host_launch{&work, form}, stream_ref{}, {.input_count = work.inputs});
    EXPECT_EQ(appended, expected.size()) << static_cast<int>(form);
    EXPECT_EQ(sorted(vector.to_host()), expected) << static_cast<int>(form);
  }
}

TEST_F(append_from_host, the_elements_already_there_stay) {
  const workload work{.inputs = 5000};
  auto vector = make(1024);
  const std::vector<std::uint64_t> before = {~0ull, ~1ull, ~2ull};
  vector.append(std::span<const std::uint64_t>(before));
  const std::size_t appended = append_from_kernel(vector, host_launch{&work}, stream_ref{});
  const auto all = vector.to_host();
  ASSERT_EQ(all.size(), before.size() + appended);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), all.begin()));
  EXPECT_EQ(sorted({all.begin() + 3, all.end()}), work.expected());
}

// Without input_count a round is one launch: the refused launch is run again whole, and the
// vector grows to exactly what it counted, so the second round fits.
TEST_F(append_from_host, an_overflow_without_windows_relaunches_once_into_exactly_the_room_counted) {
  const workload work{.inputs = 100000};
  const auto expected = work.expected();
  auto vector = make(1024, chunk_policy::fixed(granule));
  append_statistics statistics;
  std::vector<std::size_t> firsts;
  append_from_kernel(vector, host_launch{&work, push_form::value, true, &firsts}, stream_ref{},
                     {.statistics = &statistics});
  EXPECT_EQ(sorted(vector.to_host()), expected);
  EXPECT_EQ(statistics.rounds, 2u);
  EXPECT_EQ(statistics.growths, 1u);
  EXPECT_EQ(firsts, (std::vector<std::size_t>{0, 0}));
  // Exact growth: the count plus the status block, rounded up to a granule.
  const std::size_t needed = (expected.size() * sizeof(std::uint64_t) + detail::append_status_bytes);
  EXPECT_LE(vector.capacity() * sizeof(std::uint64_t), needed + 2 * granule);
}

// With input_count, an overflow relaunches from the first window that did not fit: the
// inputs before it are not processed again, and the elements of the refused window that did
// fit are not appended twice.
TEST_F(append_from_host, an_overflow_with_windows_relaunches_only_the_unfinished_tail) {
  const workload work{.inputs = 400000};
  const auto expected = work.expected();
  for (const bool stop : {true, false}) {
    auto vector = make(4096);
    vector.reserve(expected.size() * 3 / 4);  // runs out about three quarters of the way
    std::vector<std::size_t> firsts;
    append_statistics statistics;
    append_from_kernel(vector, host_launch{&work, push_form::selected, stop, &firsts}, stream_ref{},
                       {.input_count = work.inputs, .statistics = &statistics});
    EXPECT_EQ(sorted(vector.to_host()), expected) << "stop when overflowed: " << stop;
    EXPECT_EQ(statistics.rounds, 2u);
    const auto windows = detail::append_windows(0, work.inputs);
    ASSERT_EQ(firsts.size(), statistics.launches);
    ASSERT_GT(firsts.size(), windows.size());
    const std::size_t relaunched_from = firsts[windows.size()];
    EXPECT_GT(relaunched_from, work.inputs / 2) << "the second round starts where the first ran out";
    EXPECT_NE(std::find(windows.begin(), windows.end(), relaunched_from), windows.end())
        << relaunched_from << " is not where a window begins";
    // The growth came from the refused window's rate: close to what was needed.
    EXPECT_LE(static_cast<double>(vector.capacity()), 1.2 * static_cast<double>(expected.size()));
  }
}

// From a small start the first window is refused and measures the rate. The next round then
// maps its capacity window by window as it runs (on a GPU, while the windows queued before
// run), each time moving the counter and the notes to the status block's new place.
TEST_F(append_from_host,
       after_a_refusal_the_next_round_grows_window_by_window_and_appends_every_element_once) {
  const workload work{.inputs = 400000};
  const auto expected = work.expected();
  for (const push_form form : {push_form::value, push_form::selected}) {
    auto vector = make(4096);
    const std::uint64_t* const address = vector.data();
    std::vector<std::size_t> firsts;
    const append_statistics statistics = append_from_one_granule(vector, work, form, &firsts);
    EXPECT_EQ(vector.data(), address);
    EXPECT_EQ(statistics.rounds, 2u);
    EXPECT_GE(statistics.growths, 4u) << "one growth before the round, and more while it ran";
    const auto windows = detail::append_windows(0, work.inputs);
    ASSERT_EQ(firsts.size(), statistics.launches);
    EXPECT_EQ(firsts[windows.size()], 0u) << "the first window was refused: the second round starts at 0";
    // Grown from the rate with 1/16 headroom, in whole granules: no policy slack.
    EXPECT_LE(static_cast<double>(vector.capacity() * sizeof(std::uint64_t)),
              1.13 * static_cast<double>(expected.size() * sizeof(std::uint64_t)) + 2 * granule);
  }
}

// The headroom stops at max_size: with room for exactly what the elements need, the round
// after the refusal grows to max_size and everything fits in it.
TEST_F(append_from_host, the_growth_estimate_stops_at_max_size) {
  const workload work{.inputs = 400000};
  auto vector =
      make(bytes_for(work) / granule + 1);  // the need rounded up to a granule: no room for headroom
  EXPECT_EQ(append_from_one_granule(vector, work).rounds, 2u);
}

// When the pool's cap stops the growth while a round runs, the window that then does not fit
// is refused, and the rounds after it grow by what they need (no more plans): everything is
// appended all the same, within the cap.
TEST_F(append_from_host, growth_that_runs_out_of_memory_while_a_round_runs_still_appends_everything) {
  const workload work{.inputs = 400000};
  const std::size_t cap = (bytes_for(work) / granule + 1) * granule;
  auto pool = chunk_pool::create(make_os_host_provider({.granularity = granule}), {.cap = cap});
  device_vector<std::uint64_t> vector(pool, {.max_size = 4 * cap});
  EXPECT_GE(append_from_one_granule(vector, work).rounds, 3u) << "a window refused after the plan ran out";
  EXPECT_LE(pool->statistics().reserved_current, cap);
}

// A rate measured where the inputs produce nothing predicts nothing: the windows where the
// output begins are refused, and each refusal measures a better rate. Exact all the same,
// in a few rounds.
TEST_F(append_from_host, a_skewed_output_is_appended_whole_when_the_first_rate_predicts_nothing) {
  const workload work{.inputs = 400000, .quiet_below = 300000};
  const auto expected = work.expected();
  auto vector = make(4096);
  EXPECT_LE(append_from_one_granule(vector, work).rounds, 4u);
  EXPECT_LE(static_cast<double>(vector.capacity() * sizeof(std::uint64_t)),
            1.25 * static_cast<double>(expected.size() * sizeof(std::uint64_t)) + 2 * granule);
}

TEST_F(append_from_host, geometric_growth_relaunches_across_ten_growth_steps) {
  const workload work{.inputs = 300000};
  const auto expected = work.expected();  // about 450000 elements
  // One granule holds 480 slots besides the status block; nine doublings, each rounded up to
  // whole granules, hold 262112: ten growth steps are needed.
  ASSERT_GT(expected.size(), 262112u);
  auto vector = make(2048, chunk_policy::fixed(granule));
  const std::uint64_t* const address = vector.data();
  append_statistics statistics;
  append_from_kernel(vector, host_launch{&work, push_form::span}, stream_ref{},
                     {.input_count = work.inputs, .growth_factor = 2, .statistics = &statistics});
  EXPECT_EQ(sorted(vector.to_host()), expected);
  EXPECT_EQ(vector.data(), address);
  EXPECT_GE(statistics.growths, 10u);
  EXPECT_EQ(statistics.rounds, statistics.growths + 1);
}

TEST_F(append_from_host, an_empty_result_appends_nothing) {
  const workload work{.inputs = 10000, .most = 0};
  auto vector = make(16);
  vector.push_back(42);
  append_statistics statistics;
  EXPECT_EQ(append_from_kernel(vector, host_launch{&work}, stream_ref{},
                               {.input_count = work.inputs, .statistics = &statistics}),
            0u);
  EXPECT_EQ(vector.to_host(), (std::vector<std::uint64_t>{42}));
  EXPECT_EQ(statistics.rounds, 1u);
  EXPECT_EQ(statistics.growths, 0u);
}

TEST_F(append_from_host, no_inputs_launch_nothing) {
  auto vector = make(16);
  std::size_t launches = 0;
  const auto launch = [&](append_view<std::uint64_t>, std::size_t, stream_ref) { ++launches; };
  // input_count 0 means "unknown": one launch; there is no way to say "none" but not to call.
  EXPECT_EQ(append_from_kernel(vector, launch, stream_ref{}), 0u);
  EXPECT_EQ(launches, 1u);
}

TEST_F(append_from_host, a_launch_that_throws_leaves_the_vector_as_it_was) {
  const workload work{.inputs = 50000};
  auto vector = make(1024);
  vector.push_back(7);
  int calls = 0;
  const auto launch = [&](append_view<std::uint64_t> view, std::size_t first, stream_ref stream) {
    host_launch{&work}(view, first, stream);
    if (++calls == 2) throw std::runtime_error("the second launch failed");
  };
  EXPECT_THROW(append_from_kernel(vector, launch, stream_ref{}, {.input_count = work.inputs}),
               std::runtime_error);
  EXPECT_EQ(vector.to_host(), (std::vector<std::uint64_t>{7}));
}

TEST_F(append_from_host, growth_past_max_size_is_out_of_memory_and_changes_nothing) {
  const workload work{.inputs = 100000};  // about 1.2 MB of elements
  auto vector = make(64);                 // 256 KiB at most
  vector.push_back(7);
  EXPECT_THROW(append_from_kernel(vector, host_launch{&work}, stream_ref{}, {.input_count = work.inputs}),
               out_of_memory);
  EXPECT_EQ(vector.to_host(), (std::vector<std::uint64_t>{7}));
}

// The view itself, at the edge of its capacity: refused values are counted, never stored.
TEST(append_view_on_the_host, refuses_what_passes_the_capacity_and_counts_it) {
  std::vector<std::uint64_t> memory(16, 0xdead);
  std::uint64_t count = 0;
  const append_view<std::uint64_t> view{memory.data(), 10, &count};
  EXPECT_FALSE(view.overflowed());
  const std::uint64_t values[5] = {1, 2, 3, 4, 5};
  EXPECT_TRUE(view.push(std::span<const std::uint64_t>(values, 4)));   // slots 0-3
  EXPECT_TRUE(view.push_selected(values, 0b10101));                    // 1, 3, 5 in slots 4-6
  EXPECT_TRUE(view.push(std::uint64_t{9}));                            // slot 7
  EXPECT_FALSE(view.push(std::span<const std::uint64_t>(values, 3)));  // slots 8, 9 stored; 10 refused
  EXPECT_TRUE(view.overflowed());
  EXPECT_FALSE(view.push(std::uint64_t{9}));
  EXPECT_FALSE(view.push_selected(values, 0b11));
  EXPECT_TRUE(view.push_selected(values, 0));
  EXPECT_EQ(count, 14u);
  EXPECT_EQ(memory, (std::vector<std::uint64_t>{1, 2, 3, 4, 1, 3, 5, 9, 1, 2, 0xdead, 0xdead, 0xdead, 0xdead,
                                                0xdead, 0xdead}));
  EXPECT_EQ(view.limit(100), 100u);
  EXPECT_EQ((append_view<std::uint64_t>{memory.data(), 10, &count, 50}.limit(100)), 50u);
}

// The windows a round is cut into: contiguous, covering [first, n), aligned, ramping from a
// 64th of the inputs left to an eighth, and few enough for the status block.
TEST(append_windows, ramp_from_a_sixty_fourth_to_an_eighth_of_what_is_left) {
  for (const std::uint64_t first : {std::uint64_t{0}, std::uint64_t{4096}, std::uint64_t{1} << 20}) {
    for (const std::uint64_t n : {first + 1, first + 5000, first + (std::uint64_t{1} << 30) + 3}) {
      const auto ends = detail::append_windows(first, n);
      ASSERT_FALSE(ends.empty());
      ASSERT_LE(ends.size(), detail::append_max_windows);
      EXPECT_EQ(ends.back(), n);
      std::uint64_t begin = first;
      const std::uint64_t left = n - first;
      for (std::size_t k = 0; k < ends.size(); ++k) {
        ASSERT_GT(ends[k], begin);
        if (k + 1 < ends.size()) {
          EXPECT_EQ((ends[k] - first) % detail::append_window_alignment, 0u);
          EXPECT_LE(ends[k] - begin, std::max<std::uint64_t>(4096, left / 8 + 4096));
        }
        begin = ends[k];
      }
      if (left >= (std::uint64_t{1} << 20)) {
        EXPECT_LE(ends.front() - first, left / 64 + 4096);
      }
    }
  }
  EXPECT_TRUE(detail::append_windows(10, 10).empty());
  EXPECT_EQ(detail::append_windows(0, 0), std::vector<std::uint64_t>{no_input_end});
}

}  // namespace
}  // namespace vmm::testing
