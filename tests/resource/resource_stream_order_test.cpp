// The stream order of memory_resource, on host memory, driven by an executor whose events
// pass only when the test says so: the rules cudaFreeAsync and the reuse policies set, and
// a random run on several streams checked against them, in CI without a GPU.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "vmm/error.hpp"
#include "vmm/memory_resource.hpp"

namespace vmm::testing {
namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

// Each stream has queued work (a count) and completed work (a count the test advances).
// An event records (stream, queued count); it is done once the stream's completed count
// reaches it. enqueue_wait is logged, and queued as work of its own: a stream whose
// completed work passes a wait has passed the event it waited for, as on a GPU, so the
// stream of that event completes up to it too.
class scripted_executor final : public stream_executor {
 public:
  struct wait {
    stream_ref stream;
    stream_ref waited;
    std::uint64_t position;  // the waited stream's
    std::uint64_t at = 0;    // the waiting stream's position of the wait
  };

  void copy(void* destination, const void* source, std::size_t n, stream_ref stream) override {
    std::memmove(destination, source, n);
    enqueue(stream);
  }
  void fill(void* destination, std::uint8_t value, std::size_t n, stream_ref stream) override {
    std::memset(destination, value, n);
    enqueue(stream);
  }
  void synchronize(stream_ref stream) override { advance(stream); }
  void synchronize_device() override {
    std::lock_guard lock(mutex_);
    for (auto& [stream, state] : streams_) complete(stream, state.queued);
  }
  event_handle create_event() override {
    std::lock_guard lock(mutex_);
    events_.emplace(++next_event_, point{});
    ++events_created_;
    return next_event_;
  }
  void destroy_event(event_handle event) noexcept override {
    std::lock_guard lock(mutex_);
    events_.erase(event);
  }
  void record(event_handle event, stream_ref stream) override {
    std::lock_guard lock(mutex_);
    events_.at(event) = point{stream, streams_[stream.get()].queued};
  }
  bool done(event_handle event) override {
    std::lock_guard lock(mutex_);
    const point& p = events_.at(event);
    return streams_[p.stream.get()].completed >= p.position;
  }
  void synchronize_event(event_handle event) override {
    std::unique_lock lock(mutex_);
    const point& p = events_.at(event);
    auto& state = streams_[p.stream.get()];
    if (state.completed < p.position) {
      const std::chrono::nanoseconds cost = wait_cost_;
      lock.unlock();
      std::this_thread::sleep_for(cost);  // the work still to run
      lock.lock();
    }
    complete(p.stream.get(), p.position);
  }
  void enqueue_wait(stream_ref stream, event_handle event) override {
    std::lock_guard lock(mutex_);
    const point& p = events_.at(event);
    waits_.push_back({stream, p.stream, p.position, ++streams_[stream.get()].queued});
  }
  stream_ref create_stream() override {
    std::lock_guard lock(mutex_);
    return stream_ref(reinterpret_cast<CUstream_st*>(next_stream_ += 64));
  }
  void destroy_stream(stream_ref) noexcept override {}

  // How long a host waiting for an event not yet passed takes (0: no time).
  void set_wait_cost(std::chrono::nanoseconds cost) {
    std::lock_guard lock(mutex_);
    wait_cost_ = cost;
  }
  // Work queued on `stream` (a kernel, say): one more position.
  std::uint64_t enqueue(stream_ref stream) {
    std::lock_guard lock(mutex_);
    return ++streams_[stream.get()].queued;
  }
  // Everything queued on `stream` so far is done.
  void advance(stream_ref stream) {
    std::lock_guard lock(mutex_);
    complete(stream.get(), streams_[stream.get()].queued);
  }
  // The work queued on `stream` up to `position` (what enqueue() returned) is done.
  void advance_to(stream_ref stream, std::uint64_t position) {
    std::lock_guard lock(mutex_);
    complete(stream.get(), std::min(position, streams_[stream.get()].queued));
  }
  [[nodiscard]] std::uint64_t completed(stream_ref stream) {
    std::lock_guard lock(mutex_);
    return streams_[stream.get()].completed;
  }
  [[nodiscard]] std::size_t events_created() {
    std::lock_guard lock(mutex_);
    return events_created_;
  }
  [[nodiscard]] std::size_t events_alive() {
    std::lock_guard lock(mutex_);
    return events_.size();
  }
  [[nodiscard]] std::vector<wait> waits() {
    std::lock_guard lock(mutex_);
    return waits_;
  }

 private:
  // `stream` completes up to `position`, and with it every stream it waited for up to the
  // waited event (under mutex_).
  void complete(CUstream_st* stream, std::uint64_t position) {
    auto& state = streams_[stream];
    if (position <= state.completed) return;
    const std::uint64_t before = state.completed;
    state.completed = position;
    for (std::size_t i = 0; i < waits_.size(); ++i)  // by index: complete() may add states, not waits
      if (waits_[i].stream.get() == stream && waits_[i].at > before && waits_[i].at <= position)
        complete(waits_[i].waited.get(), waits_[i].position);
  }
  struct point {
    stream_ref stream;
    std::uint64_t position = 0;
  };
  struct stream_state {
    std::uint64_t queued = 0;
    std::uint64_t completed = 0;
  };
  std::mutex mutex_;
  std::map<CUstream_st*, stream_state> streams_;
  std::map<event_handle, point> events_;
  std::vector<wait> waits_;
  event_handle next_event_ = 0;
  std::size_t events_created_ = 0;
  std::uintptr_t next_stream_ = 4096;
  std::chrono::nanoseconds wait_cost_{0};
};

class stream_order : public ::testing::Test {
 protected:
  std::unique_ptr<memory_resource> make(memory_resource_properties properties = {},
                                        reuse_policies policies = {}) {
    if (properties.max_size == 0) properties.max_size = 64 * mib;
    auto pool = chunk_pool::create(provider_);
    return std::make_unique<memory_resource>(pool, properties, policies);
  }
  static bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
    const auto x = reinterpret_cast<std::uintptr_t>(a);
    const auto y = reinterpret_cast<std::uintptr_t>(b);
    return x < y + b_bytes && y < x + a_bytes;
  }
  // One random run of 5000 steps; adds how many allocations ran out of memory.
  void random_run(std::uint64_t seed, std::size_t& out_of_memory_count) {
    auto resource = make({.max_size = 48 * mib});
    const stream_ref streams[] = {a_, b_, executor_.create_stream(), executor_.create_stream()};
    struct live {
      std::size_t bytes;
      std::size_t stream;
    };
    struct freed {
      std::uintptr_t address;
      std::size_t bytes;
      std::size_t stream;
      std::uint64_t position;  // the freeing stream's queued work at the free
    };
    std::map<std::uintptr_t, live> model;
    std::vector<freed> history;  // recent frees that may not have passed
    std::mt19937_64 random(seed);
    for (int step = 0; step < 5000; ++step) {
      const std::size_t s = random() % 4;
      const int action = static_cast<int>(random() % 100);
      if (action < 10) {
        executor_.enqueue(streams[s]);  // a kernel
      } else if (action < 18) {
        executor_.advance(streams[s]);  // it ended
      } else if (action < 55 && !model.empty()) {
        auto it = std::next(model.begin(), static_cast<std::ptrdiff_t>(random() % model.size()));
        resource->deallocate(streams[it->second.stream], reinterpret_cast<void*>(it->first),
                             it->second.bytes);
        history.push_back({it->first, it->second.bytes, it->second.stream,
                           executor_.enqueue(streams[it->second.stream]) - 1});
        model.erase(it);
      } else {
        const std::size_t bytes = 1 + random() % (std::size_t{1} << (random() % 23));
        void* p = nullptr;
        try {
          p = resource->allocate(streams[s], bytes);
        } catch (const out_of_memory&) {
          ++out_of_memory_count;
          continue;
        }
        const auto address = reinterpret_cast<std::uintptr_t>(p);
        for (const freed& f : history) {
          if (f.stream == s || !overlap(p, bytes, reinterpret_cast<void*>(f.address), f.bytes)) continue;
          if (executor_.completed(streams[f.stream]) >= f.position) continue;
          bool waited = false;
          for (const auto& w : executor_.waits())
            waited = waited ||
                     (w.stream == streams[s] && w.waited == streams[f.stream] && w.position >= f.position);
          ASSERT_TRUE(waited) << "step " << step << ": stream " << s << " got memory stream " << f.stream
                              << " freed and has not passed";
        }
        auto next = model.lower_bound(address);
        if (next != model.end()) {
          ASSERT_GE(next->first, address + bytes);
        }
        if (next != model.begin()) {
          ASSERT_LE(std::prev(next)->first + std::prev(next)->second.bytes, address);
        }
        model.emplace(address, live{bytes, s});
      }
      std::erase_if(history,
                    [&](const freed& f) { return executor_.completed(streams[f.stream]) >= f.position; });
      // What is live, and what was freed while its stream's work may still use it, stays
      // mapped: touching the first and the last byte would fault on a page taken away.
      const auto touch = [](std::uintptr_t address, std::size_t bytes) {
        for (const std::uintptr_t at : {address, address + bytes - 1}) {
          auto* byte = reinterpret_cast<volatile unsigned char*>(at);
          *byte = static_cast<unsigned char>(*byte + 1);
        }
      };
      for (const auto& [address, entry] : model) touch(address, entry.bytes);
      for (const freed& f : history) touch(f.address, f.bytes);
    }
    for (auto& [address, entry] : model)
      resource->deallocate(streams[entry.stream], reinterpret_cast<void*>(address), entry.bytes);
    const memory_resource_statistics s = resource->statistics();
    EXPECT_EQ(s.used_current, 0u);
    EXPECT_EQ(s.bad_deallocations, 0u);
  }

  scripted_executor executor_;
  std::shared_ptr<memory_provider> provider_ =
      make_os_host_provider({.granularity = 2 * mib, .commit_budget = 256 * mib, .executor = &executor_});
  stream_ref a_ = executor_.create_stream();
  stream_ref b_ = executor_.create_stream();
};

TEST_F(stream_order, memory_freed_on_a_stream_is_reused_at_once_by_that_stream) {
  auto resource = make();
  void* p = resource->allocate(a_, 3 * mib);
  executor_.enqueue(a_);  // a kernel using it, still running
  resource->deallocate(a_, p, 3 * mib);
  EXPECT_EQ(resource->allocate(a_, 3 * mib), p);
  for (std::size_t alignment : {std::size_t{512}, std::size_t{64} << 10}) {
    void* q = resource->allocate(a_, 5000, alignment);
    resource->deallocate(a_, q, 5000, alignment);
    EXPECT_EQ(resource->allocate(a_, 5000, alignment), q) << alignment;
    resource->deallocate(a_, q, 5000, alignment);
  }
}

TEST_F(stream_order, points_that_have_passed_give_their_events_to_later_points) {
  auto resource = make();
  const std::size_t before = executor_.events_created();
  // 64 points' worth of frees, the stream catching up after each: one event serves them all
  // (the first point of a stream may find none spare yet, so two at most).
  for (int i = 0; i < 64 * 32; ++i) {
    void* p = resource->allocate(a_, 4096);
    executor_.enqueue(a_);
    resource->deallocate(a_, p, 4096);
    executor_.advance(a_);
  }
  EXPECT_LE(executor_.events_created() - before, 2u);
  // A stream far behind holds its points' events; once it catches up they serve again.
  for (int i = 0; i < 16 * 32; ++i) {
    void* p = resource->allocate(a_, 4096);
    executor_.enqueue(a_);
    resource->deallocate(a_, p, 4096);
  }
  const std::size_t behind = executor_.events_created() - before;
  EXPECT_GE(behind, 16u);
  executor_.advance(a_);
  for (int i = 0; i < 16 * 32; ++i) {
    void* p = resource->allocate(a_, 4096);
    executor_.enqueue(a_);
    resource->deallocate(a_, p, 4096);
    executor_.advance(a_);
  }
  EXPECT_EQ(executor_.events_created() - before, behind);
  resource.reset();
  EXPECT_EQ(executor_.events_alive(), 0u);
}

TEST_F(stream_order, an_event_recorded_again_marks_the_new_end_of_its_stream) {
  stream_event point(executor_, a_);
  EXPECT_TRUE(point.done());  // nothing was queued
  executor_.enqueue(a_);
  point.record_again(a_);
  EXPECT_FALSE(point.done());
  executor_.advance(a_);
  EXPECT_TRUE(point.done());
  stream_event empty;
  try {
    empty.record_again(a_);
    ADD_FAILURE() << "record_again of an empty event was taken";
  } catch (const invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("empty event"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(empty.done());
}

TEST_F(stream_order, another_stream_gets_it_only_once_the_free_has_passed) {
  auto resource = make(
      {},
      {.follow_event_dependencies = true, .allow_opportunistic = true, .allow_internal_dependencies = false});
  void* p = resource->allocate(a_, 4 * mib);
  executor_.enqueue(a_);  // still running
  resource->deallocate(a_, p, 4 * mib);
  void* q = resource->allocate(b_, 4 * mib);
  EXPECT_FALSE(overlap(p, 4 * mib, q, 4 * mib));
  resource->deallocate(b_, q, 4 * mib);
  executor_.advance(a_);  // the kernel ended: the free has passed
  executor_.advance(b_);
  // A request larger than either block fits only where both lie freed and merged, or in
  // fresh memory: freed memory of a passed stream is taken first (no page created).
  const std::size_t created = resource->statistics().pages_created;
  void* r = resource->allocate(b_, 4 * mib);
  EXPECT_EQ(resource->statistics().pages_created, created);
  resource->deallocate(b_, r, 4 * mib);
}

TEST_F(stream_order, a_small_block_waiting_for_its_size_goes_to_no_other_stream_before_the_free_passed) {
  auto resource = make(
      {},
      {.follow_event_dependencies = true, .allow_opportunistic = true, .allow_internal_dependencies = false});
  void* p = resource->allocate(a_, 4096);
  executor_.enqueue(a_);  // still running
  resource->deallocate(a_, p, 4096);
  void* q = resource->allocate(b_, 4096);
  EXPECT_FALSE(overlap(p, 4096, q, 4096));
  EXPECT_EQ(resource->allocate(a_, 4096), p);  // its own stream takes it back at once
  resource->deallocate(a_, p, 4096);
  // Another stream's slow path frees what waits (a request larger than anything mapped
  // free): still pending on A, so B gets other memory.
  void* large = resource->allocate(b_, 8 * mib);
  void* r = resource->allocate(b_, 4096);
  EXPECT_FALSE(overlap(p, 4096, r, 4096));
  executor_.advance(a_);  // the free has passed
  resource->deallocate(b_, r, 4096);
  resource->deallocate(b_, q, 4096);
  resource->deallocate(b_, large, 8 * mib);
  EXPECT_EQ(resource->statistics().used_current, 0u);
}

TEST_F(stream_order, a_page_lent_from_a_pending_block_is_mapped_there_again_once_the_stream_passes) {
  // At its maximum, the resource lends a page of a block its stream has freed but not
  // passed; a request that lands on that page later makes the host wait for the stream
  // (counted in host_waits) before the old mapping goes.
  const std::size_t g = 2 * mib;
  auto resource = make({.max_size = 5 * g});
  void* block = resource->allocate(a_, 4 * g);
  void* above = resource->allocate(a_, g);  // all the resource may have
  executor_.enqueue(a_);                    // a kernel using both, still running
  resource->deallocate(a_, block, 4 * g);
  void* small = resource->allocate(a_, 4096);  // another arena: the pending block's last page, lent
  memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.pages_stitched, 1u);
  EXPECT_EQ(s.pages_created, 5u);
  EXPECT_EQ(s.host_waits, 0u);
  EXPECT_EQ(executor_.completed(a_), 0u) << "nothing waited for the kernel yet";
  // The kernel still writes through the old mapping: it must be there.
  static_cast<volatile unsigned char*>(block)[4 * g - 1] = 1;
  resource->deallocate(a_, above, g);
  void* again = resource->allocate(a_, 4 * g);  // the whole block again, the lent page with it
  EXPECT_EQ(again, block);
  s = resource->statistics();
  EXPECT_EQ(s.host_waits, 1u);
  EXPECT_EQ(executor_.completed(a_), 1u) << "the host waited for the kernel before mapping the page again";
  EXPECT_EQ(s.pages_created, 5u) << "the resource stayed within its maximum";
  EXPECT_EQ(s.reserved_current, 5 * g);
  std::memset(again, 0x5a, 4 * g);  // mapped, and writable
  std::memset(small, 0x5a, 4096);
  resource->deallocate(a_, again, 4 * g);
  resource->deallocate(a_, small, 4096);
  EXPECT_EQ(resource->statistics().host_waits, 1u) << "frees never wait";
}

TEST_F(stream_order, a_page_lent_from_a_pending_block_comes_from_its_far_end) {
  // The stream's next requests land from the start of the block it has freed: a page lent
  // away from there would make them wait for the stream or move pages, one lent from the
  // far end leaves them whole (docs/design/memory_resource.md, "Lending").
  const std::size_t g = 2 * mib;
  auto resource = make({.max_size = 6 * g});
  void* block = resource->allocate(a_, 6 * g);  // all the resource may have
  executor_.enqueue(a_);                        // a kernel using it, still running
  resource->deallocate(a_, block, 6 * g);
  void* small = resource->allocate(a_, 4096);  // another arena: a page of the pending block, lent
  ASSERT_EQ(resource->statistics().pages_stitched, 1u);
  void* next = resource->allocate(a_, 5 * g);  // the stream's next request: the block's start
  EXPECT_EQ(next, block);
  const memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.pages_stitched, 1u) << "no page moved for the next request";
  EXPECT_EQ(s.host_waits, 0u);
  EXPECT_EQ(executor_.completed(a_), 0u) << "nothing waited for the kernel";
  EXPECT_EQ(s.reserved_current, 6 * g);
  std::memset(next, 0x5a, 5 * g);
  std::memset(small, 0x5a, 4096);
  resource->deallocate(a_, next, 5 * g);
  resource->deallocate(a_, small, 4096);
}

TEST_F(stream_order, a_lent_page_waits_only_for_the_frees_over_it) {
  // A block freed long ago merges with one freed just now: a page lent from the old one
  // keeps its old mapping until the stream passes the old free, not the whole block's.
  const std::size_t g = 2 * mib;
  auto resource = make({.max_size = 5 * g});
  void* older = resource->allocate(a_, 2 * g);
  void* newer = resource->allocate(a_, 2 * g);
  void* above = resource->allocate(a_, g);            // all the resource may have
  const std::uint64_t first = executor_.enqueue(a_);  // a kernel using `newer`
  resource->deallocate(a_, newer, 2 * g);
  executor_.enqueue(a_);  // one using `older`, queued after the first free
  resource->deallocate(a_, older, 2 * g);
  void* small = resource->allocate(a_, 4096);  // another arena: the last page of `newer`, lent
  ASSERT_EQ(resource->statistics().pages_stitched, 1u);
  executor_.advance_to(a_, first);  // the first kernel ends: the stream passed the first free only
  resource->deallocate(a_, above, g);
  void* again = resource->allocate(a_, 4 * g);  // over the lent page's address
  EXPECT_EQ(again, older);
  const memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.host_waits, 0u) << "the frees over the lent page have passed";
  EXPECT_EQ(executor_.completed(a_), 1u) << "nothing waited for the second kernel";
  EXPECT_EQ(s.reserved_current, 5 * g);
  std::memset(again, 0x5a, 4 * g);
  std::memset(small, 0x5a, 4096);
  resource->deallocate(a_, again, 4 * g);
  resource->deallocate(a_, small, 4096);
}

TEST_F(stream_order, the_host_time_of_the_slow_path_and_of_its_waits_is_counted) {
  // A wait for a kernel that takes 20 ms is 20 ms of host_wait_time and of slow_path_time;
  // a request that a mapped free block serves adds to neither.
  using namespace std::chrono_literals;
  const std::size_t g = 2 * mib;
  auto resource = make({.max_size = 5 * g});
  executor_.set_wait_cost(20ms);
  void* block = resource->allocate(a_, 4 * g);  // pages created: the slow path
  void* above = resource->allocate(a_, g);
  memory_resource_statistics s = resource->statistics();
  EXPECT_GT(s.slow_path_time, 0ns);
  EXPECT_EQ(s.host_wait_time, 0ns);
  executor_.enqueue(a_);  // a kernel using the blocks, still running
  resource->deallocate(a_, block, 4 * g);
  void* small = resource->allocate(a_, 4096);  // the pending block's last page, lent
  resource->deallocate(a_, above, g);
  const memory_resource_statistics before = resource->statistics();
  EXPECT_EQ(before.host_wait_time, 0ns);
  void* again = resource->allocate(a_, 4 * g);  // over the lent page's address: the host waits
  s = resource->statistics();
  ASSERT_EQ(s.host_waits, 1u);
  EXPECT_GE(s.host_wait_time, 20ms);
  EXPECT_GE(s.slow_path_time - before.slow_path_time, s.host_wait_time)
      << "the wait is part of the slow path";
  resource->deallocate(a_, again, 4 * g);
  EXPECT_EQ(resource->allocate(a_, 4 * g), again);  // the stream's own free block, mapped
  EXPECT_EQ(resource->statistics().slow_path_time, s.slow_path_time) << "the fast path is not timed";
  EXPECT_EQ(resource->statistics().host_wait_time, s.host_wait_time);
  resource->deallocate(a_, again, 4 * g);
  resource->deallocate(a_, small, 4096);
}

TEST_F(stream_order, a_block_grown_by_copies_on_a_stream_far_behind_keeps_its_pages_in_place) {
  // x = cat(x, y) while the GPU runs behind: every freed x is still pending on its stream,
  // which may take it back at once. Below the freed x lie only unmapped addresses, so the
  // next request goes to its far end, over its pages, as for a block whose free has passed.
  const std::size_t g = 2 * mib;
  auto resource = make({.max_size = 64 * g});
  auto* x = static_cast<unsigned char*>(resource->allocate(a_, g));
  std::memset(x, 1, g);
  constexpr std::size_t steps = 16;
  for (std::size_t k = 2; k <= steps; ++k) {
    auto* y = static_cast<unsigned char*>(resource->allocate(a_, k * g));
    std::memcpy(y, x, (k - 1) * g);
    std::memset(y + (k - 1) * g, static_cast<int>(k), g);
    executor_.enqueue(a_);  // the copy, still running
    resource->deallocate(a_, x, (k - 1) * g);
    x = y;
  }
  const memory_resource_statistics s = resource->statistics();
  // Every third step the request outgrows the free run below and goes above, moving pages
  // of the pending blocks there: 31 pages stitched in all. Moving each freed block's pages
  // instead (the far end for released blocks only) stitched 94 and made the host wait.
  EXPECT_LE(s.pages_stitched, 3 * steps);
  EXPECT_LE(s.reserved_high, (2 * steps + 1) * g);
  EXPECT_EQ(s.host_waits, 0u) << "the stream's own frees never make the host wait";
  EXPECT_EQ(executor_.completed(a_), 0u);
  for (std::size_t k = 1; k <= steps; ++k) EXPECT_EQ(x[(k - 1) * g], k) << "page " << k - 1;
  resource->deallocate(a_, x, steps * g);
}

TEST_F(stream_order, large_pages_freed_ahead_of_the_stream_are_made_again_in_small_ones_once_it_passes) {
  // A program running ahead of its GPU frees large blocks and asks for smaller ones. The
  // freed large pages cannot be lent to them (another page size), nor go back to the
  // device before the stream passes the free. Within the room the stitch limit leaves the
  // resource creates small pages; past it the host waits for the stream instead, and the
  // large pages are made again as small ones, so that the memory is not reserved twice.
  auto resource = make({.max_size = 512 * mib});
  void* large = resource->allocate(a_, 128 * mib);  // four large pages
  std::memset(large, 1, 128 * mib);
  executor_.enqueue(a_);  // a kernel using it, still running
  resource->deallocate(a_, large, 128 * mib);
  memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.reserved_current, 128 * mib);

  void* first = resource->allocate(a_, 4 * mib);  // two small pages: within the limit
  s = resource->statistics();
  EXPECT_EQ(s.host_waits, 0u);
  EXPECT_EQ(executor_.completed(a_), 0u);
  EXPECT_EQ(s.reserved_current, 132 * mib);

  std::vector<void*> small;  // each below a large page: small pages
  for (int i = 0; i < 4; ++i) {
    small.push_back(resource->allocate(a_, 30 * mib));
    std::memset(small.back(), 2, 30 * mib);
  }
  s = resource->statistics();
  EXPECT_EQ(s.host_waits, 1u) << "one wait gives back every large page whose free has passed";
  EXPECT_EQ(executor_.completed(a_), 1u) << "the host waited for the kernel before the large pages went";
  EXPECT_EQ(s.pages_released, 4u);
  EXPECT_LE(s.reserved_high, 128 * mib + 128 * mib / 64 + 4 * mib) << "created all again: 252 MiB";
  std::memset(first, 3, 4 * mib);
  resource->deallocate(a_, first, 4 * mib);
  for (void* p : small) resource->deallocate(a_, p, 30 * mib);
  EXPECT_EQ(resource->statistics().used_current, 0u);
}

TEST_F(stream_order,
       a_stream_with_all_the_points_it_may_have_still_gives_its_freed_pages_of_the_other_size_back) {
  // A host far ahead of its stream has recorded all the points a stream may have; the
  // block it frees then is behind none. A request of the other page size past the wait
  // limit makes room for a point by waiting for the oldest, then waits for the free and
  // makes the pages again in its size, rather than reserving the memory twice.
  auto resource = make({.max_size = 512 * mib});
  executor_.enqueue(a_);                         // a kernel, still running
  void* mid = resource->allocate(a_, 32 * mib);  // sixteen small pages
  for (int i = 0; i < 64 * 40; ++i) {            // frees enough for every point there may be
    void* p = resource->allocate(a_, 4096);
    resource->deallocate(a_, p, 4096);
  }
  resource->deallocate(a_, mid, 32 * mib);
  ASSERT_EQ(resource->statistics().reserved_current, 34 * mib);  // and the page of the 4 KiB blocks
  void* large = resource->allocate(a_, 64 * mib);                // two large pages
  const memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.host_waits, 1u);
  EXPECT_EQ(executor_.completed(a_), 1u) << "the host waited for the kernel";
  EXPECT_EQ(s.pages_released, 16u);
  EXPECT_EQ(s.reserved_current, 66 * mib) << "98 MiB: the freed pages kept beside the new ones";
  std::memset(large, 7, 64 * mib);
  resource->deallocate(a_, large, 64 * mib);
}

TEST_F(stream_order, a_request_of_a_large_page_or_more_takes_the_mapped_memory_a_large_block_freed) {
  // Blocks of small pages (under two large pages) of at least a large page take mapped runs
  // of large pages that a large block freed, here on their own stream before it passes the
  // free: no page is made, given back or moved, and the host does not wait.
  auto resource = make({.max_size = 512 * mib});
  void* large = resource->allocate(a_, 160 * mib);  // five large pages
  executor_.enqueue(a_);                            // a kernel using it, still running
  resource->deallocate(a_, large, 160 * mib);
  const memory_resource_statistics before = resource->statistics();
  const auto start = reinterpret_cast<std::uintptr_t>(large);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(resource->allocate(a_, 40 * mib));
    const auto at = reinterpret_cast<std::uintptr_t>(blocks.back());
    EXPECT_TRUE(at >= start && at + 40 * mib <= start + 160 * mib) << i << ": in the freed large pages";
    EXPECT_EQ(resource->pages_of(blocks.back(), 40 * mib).page_size, 32 * mib);
    std::memset(blocks.back(), i, 40 * mib);
  }
  const memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.pages_created, before.pages_created);
  EXPECT_EQ(s.pages_released, before.pages_released);
  EXPECT_EQ(s.pages_stitched, before.pages_stitched);
  EXPECT_EQ(s.host_waits, 0u);
  EXPECT_EQ(executor_.completed(a_), 0u);
  EXPECT_EQ(s.reserved_high, 160 * mib);
  resource->deallocate(a_, blocks.back(), 40 * mib);
  blocks.pop_back();
  // Below a large page: small pages of its own, the large ones left alone.
  void* small = resource->allocate(a_, 30 * mib);
  EXPECT_EQ(resource->pages_of(small, 30 * mib).page_size, 2 * mib);
  EXPECT_EQ(resource->statistics().pages_created, before.pages_created + 15);
  resource->deallocate(a_, small, 30 * mib);
  for (void* p : blocks) resource->deallocate(a_, p, 40 * mib);
  EXPECT_EQ(resource->statistics().used_current, 0u);
}

TEST_F(stream_order, the_wait_for_pages_of_the_other_size_weighs_every_page_the_request_makes) {
  // What decides whether the host waits is the reserved memory once every missing page of
  // the request is made, not only the pages past the stitch limit's room: with room for
  // some, the rest would otherwise be made on top of memory the stream is about to free.
  auto resource = make({.max_size = 512 * mib});
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(resource->allocate(a_, 16 * mib));  // small pages
  for (void* p : blocks) resource->deallocate(a_, p, 16 * mib);
  blocks.clear();
  resource->synchronize();
  resource->trim_to(0);
  ASSERT_EQ(resource->statistics().reserved_current, 0u);
  ASSERT_EQ(resource->statistics().used_high, 160 * mib) << "the most ever in use";
  for (int i = 0; i < 6; ++i) blocks.push_back(resource->allocate(a_, 16 * mib));  // 96 MiB
  executor_.enqueue(a_);  // a kernel using them, still running
  for (void* p : blocks) resource->deallocate(a_, p, 16 * mib);
  ASSERT_EQ(resource->statistics().host_waits, 0u);

  void* large = resource->allocate(a_, 128 * mib);  // four large pages; room for two of them
  std::memset(large, 1, 128 * mib);
  const memory_resource_statistics s = resource->statistics();
  EXPECT_EQ(s.host_waits, 1u);
  EXPECT_EQ(executor_.completed(a_), 1u) << "the host waited for the kernel before the small pages went";
  EXPECT_LE(s.reserved_high, 160 * mib + 160 * mib / 64) << "made all four on top: 224 MiB";
  resource->deallocate(a_, large, 128 * mib);
}

TEST_F(stream_order, without_opportunistic_reuse_the_host_does_not_wait_to_free_pages_of_the_other_size) {
  // Waiting for a stream to pass its frees of large pages frees them only by making the
  // blocks free for every stream, which this policy forbids: another stream would get the
  // address of a block freed on `a_` with no dependency on it. So no wait, nothing handed over.
  auto resource =
      make({.max_size = 512 * mib}, {.allow_opportunistic = false, .allow_internal_dependencies = false});
  void* large = resource->allocate(b_, 64 * mib);  // in b_'s arena
  executor_.enqueue(a_);                           // a kernel on a_ using it, still running
  resource->deallocate(a_, large, 64 * mib);       // freed on a_: pending there
  std::vector<void*> small;
  for (int i = 0; i < 2; ++i) small.push_back(resource->allocate(a_, 30 * mib));
  EXPECT_EQ(resource->statistics().host_waits, 0u);
  EXPECT_EQ(executor_.completed(a_), 0u);
  void* again = resource->allocate(b_, 64 * mib);
  EXPECT_FALSE(overlap(again, 64 * mib, large, 64 * mib)) << "b_ got memory a_ freed, with no dependency";
  resource->deallocate(b_, again, 64 * mib);
  for (void* p : small) resource->deallocate(a_, p, 30 * mib);
  executor_.advance(a_);
}

TEST_F(stream_order, an_internal_dependency_makes_the_allocating_stream_wait_for_the_free) {
  const std::size_t g = 2 * mib;
  auto resource = make({.max_size = 4 * g});
  void* p = resource->allocate(a_, 4 * g);  // all the resource may have
  const std::uint64_t kernel = executor_.enqueue(a_);
  resource->deallocate(a_, p, 4 * g);
  void* q = resource->allocate(b_, 4 * g);  // only A's block fits: B waits for A's free
  EXPECT_EQ(q, p);
  bool waited = false;
  for (const auto& w : executor_.waits())
    waited = waited || (w.stream == b_ && w.waited == a_ && w.position >= kernel);
  EXPECT_TRUE(waited) << "B reuses A's block without waiting for A's kernel";
  resource->deallocate(b_, q, 4 * g);
}

TEST_F(stream_order, without_internal_dependencies_the_busy_block_is_not_taken) {
  const std::size_t g = 2 * mib;
  auto resource = make({.max_size = 4 * g}, {.follow_event_dependencies = false,
                                             .allow_opportunistic = true,
                                             .allow_internal_dependencies = false});
  void* p = resource->allocate(a_, 4 * g);
  executor_.enqueue(a_);
  resource->deallocate(a_, p, 4 * g);
  EXPECT_EQ(resource->statistics().host_waits, 0u);
  // The last resort waits for A's points on the host (advancing A here), then reuses.
  void* q = resource->allocate(b_, 4 * g);
  EXPECT_GE(executor_.completed(a_), 1u);
  EXPECT_TRUE(executor_.waits().empty());
  EXPECT_EQ(resource->statistics().host_waits, 1u);
  resource->deallocate(b_, q, 4 * g);
}

TEST_F(stream_order, wait_for_lets_the_waiting_stream_reuse_what_the_other_freed) {
  const std::size_t g = 2 * mib;
  auto resource = make({.max_size = 4 * g}, {.follow_event_dependencies = true,
                                             .allow_opportunistic = false,
                                             .allow_internal_dependencies = false});
  void* p = resource->allocate(a_, 4 * g);
  executor_.enqueue(a_);
  resource->deallocate(a_, p, 4 * g);
  resource->wait_for(b_, a_);  // B's later work waits for A's work so far
  const std::size_t waits = executor_.waits().size();
  void* q = resource->allocate(b_, 4 * g);
  EXPECT_EQ(q, p);
  EXPECT_EQ(executor_.waits().size(), waits);  // no further wait needed
  resource->deallocate(b_, q, 4 * g);
}

// Thousands of operations on four streams with work queued and completed at random: a
// block freed on one stream is never handed to another before the free has passed there,
// unless the other stream was made to wait for it.
TEST_F(stream_order, a_random_run_never_hands_a_busy_block_to_another_stream) {
  // Several seeds: one run passed while a block's leftover, released early, reached a
  // stream that had not waited for its free (found with seeds 1, 4 and 10). Before the
  // executor completed the streams a wait waited for, seeds 62 and 98 of 200 failed on
  // frees that a waiting stream had passed on the GPU; with it, 1,000 seeds pass.
  std::size_t out_of_memory_count = 0;
  for (std::uint64_t seed = 1; seed <= 32; ++seed) {
    SCOPED_TRACE(seed);
    random_run(seed, out_of_memory_count);
    if (HasFatalFailure()) return;
  }
  RecordProperty("out_of_memory", static_cast<int>(out_of_memory_count));
}

}  // namespace
}  // namespace vmm::testing
