// Stress: what holds when many things happen at once, or many times over.
//  - Four threads share one capped chunk_pool (with a release threshold) and one
//    ipc::exporter, each resizing its own buffers at random, making views of them, and
//    exporting them and importing them back through its own socket pair, while a fifth
//    thread reads the pool's statistics and checks their invariants. Bounded both in time
//    (2 s) and in operations, so that it ends quickly under ThreadSanitizer too, which this
//    test is also built for (VMM_TSAN).
//  - 10^4 export / import cycles between this process and a peer process, with a resize
//    every 1000 cycles so that chunks die and the export cache drops them: the descriptor
//    count of each process is the same at the end as at the start.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "helpers/ipc_peer_protocol.hpp"
#include "memory_io.hpp"
#include "process_resources.hpp"
#include "provider_kinds.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/chunk_view.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/ipc/exporter.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/importer.hpp"
#include "vmm/retirement.hpp"

namespace vmm::testing {
namespace {

// ---- threads over one pool and one exporter -------------------------------------------------

constexpr std::size_t stress_granularity = std::size_t{64} << 10;
constexpr int worker_count = 4;
constexpr int operations_per_worker = 3000;
constexpr auto stress_duration = std::chrono::seconds(2);

// Violations found by any thread, reported by the main thread.
class violations {
 public:
  void add(std::string what) {
    std::lock_guard lock(mutex_);
    if (list_.size() < 20) list_.push_back(std::move(what));
    ++count_;
  }
  [[nodiscard]] std::size_t count() const {
    std::lock_guard lock(mutex_);
    return count_;
  }
  [[nodiscard]] std::string summary() const {
    std::lock_guard lock(mutex_);
    std::string text;
    for (const std::string& line : list_) text += line + "\n";
    return text;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> list_;
  std::size_t count_ = 0;
};

// The invariants of pool_statistics that hold at every moment, for a pool whose chunks all
// have `g` bytes and whose requests run on at most `threads` threads (each may have counted
// one chunk that it is still creating).
void check_statistics(const pool_statistics& s, const chunk_pool_options& options, std::size_t g,
                      std::size_t threads, violations& found) {
  const auto fail = [&](const std::string& what) {
    found.add(what + ": reserved " + std::to_string(s.reserved_current) + ", used " +
              std::to_string(s.used_current) + ", created " + std::to_string(s.chunks_created) +
              ", released " + std::to_string(s.chunks_released));
  };
  if (s.used_current > s.reserved_current) fail("used_current > reserved_current");
  if (s.reserved_current > options.cap) fail("reserved_current > cap");
  if (s.reserved_high < s.reserved_current) fail("reserved_high < reserved_current");
  if (s.used_high < s.used_current) fail("used_high < used_current");
  if (s.reserved_current % g != 0 || s.used_current % g != 0) fail("a count that is not whole chunks");
  // reserved == idle + used, idle bounded by the release threshold after every give-back.
  const std::size_t idle = s.reserved_current - std::min(s.used_current, s.reserved_current);
  if (idle > options.release_threshold) fail("idle bytes above the release threshold");
  if (s.chunks_released > s.chunks_created) fail("more chunks released than created");
  const std::size_t live = (s.chunks_created - std::min(s.chunks_released, s.chunks_created)) * g;
  if (live > s.reserved_current || s.reserved_current > live + threads * g)
    fail("chunks created - released disagrees with reserved_current");
}

struct worker_counts {
  std::size_t operations = 0;
  std::size_t resizes = 0;
  std::size_t capped = 0;  // resizes refused at the pool's cap
  std::size_t views = 0;
  std::size_t imports = 0;
};

// One thread's work: two buffers of its own, views of them, exports through the shared
// exporter and imports of them back through its own socket pair.
void work(int index, const std::shared_ptr<chunk_pool>& pool, ipc::exporter& exporter, violations& found,
          worker_counts& counts, std::chrono::steady_clock::time_point deadline) {
  const std::shared_ptr<memory_provider>& provider = pool->provider();
  const std::size_t g = pool->granularity();
  std::mt19937 random(static_cast<std::uint32_t>(1000 + index));
  std::vector<growable_buffer> buffers;
  for (int i = 0; i < 2; ++i)
    buffers.emplace_back(pool, growable_buffer_options{.max_size = 12 * g, .policy = chunk_policy::fixed(g)});
  std::deque<chunk_view> views;
  const auto [sender, receiver] = ipc::make_socket_pair();
  const auto fail = [&](const std::string& what) {
    found.add("worker " + std::to_string(index) + ": " + what);
  };

  for (; counts.operations < operations_per_worker && std::chrono::steady_clock::now() < deadline;
       ++counts.operations) {
    growable_buffer& buffer = buffers[random() % buffers.size()];
    try {
      switch (random() % 4) {
        case 0:
        case 1: {  // resize, and write the new bytes
          const std::size_t old_size = buffer.size();
          const std::size_t chunks = random() % 13;
          const std::size_t target = chunks * g - (chunks > 0 && random() % 2 == 0 ? 100 : 0);
          ++counts.resizes;
          try {
            buffer.resize(target);
          } catch (const out_of_memory&) {
            ++counts.capped;
            if (buffer.size() != old_size) fail("a resize refused at the cap changed the size");
            break;
          }
          if (target > old_size)
            std::memset(static_cast<std::byte*>(buffer.data()) + old_size, static_cast<int>(random() & 0xff),
                        target - old_size);
          break;
        }
        case 2: {  // a view of the first chunk, checked against the buffer
          if (buffer.capacity() < g) break;
          views.push_back(alias(buffer, 0, g, access_mode::read_only));
          ++counts.views;
          if (std::memcmp(views.back().data(), buffer.data(), std::min(buffer.size(), g)) != 0)
            fail("a view shows other bytes than its buffer");
          if (views.size() > 2) views.pop_front();
          break;
        }
        case 3: {  // export, import back, compare
          const ipc::exported_manifest exported = exporter.export_buffer(buffer);
          ipc::send_manifest(sender.get(), exported);
          const ipc::imported_buffer imported = ipc::imported_buffer::receive(
              receiver.get(), {.access = access_mode::read_only, .provider = provider});
          ++counts.imports;
          if (imported.size() != buffer.size()) fail("an import of another size");
          if (buffer.size() > 0 && std::memcmp(imported.data(), buffer.data(), buffer.size()) != 0)
            fail("an import shows other bytes than its buffer");
          break;
        }
      }
    } catch (const out_of_memory&) {
      ++counts.capped;  // a view or an import may meet the cap too (none here: they map no new memory)
      fail("out_of_memory outside a resize");
    } catch (const std::exception& error) {
      fail(std::string("unexpected exception: ") + error.what());
    }
  }
}

TEST(stress, threads_share_one_capped_pool_and_one_exporter) {
  const std::size_t g = stress_granularity;
  const auto provider = make_os_host_provider({.granularity = g, .commit_budget = std::size_t{256} << 20});
  const chunk_pool_options options{.release_threshold = 8 * g, .cap = 40 * g};
  const auto pool = chunk_pool::create(provider, options);
  const std::size_t fds_before = open_fd_count();
  const address_space_usage usage_before = provider->address_space().usage();

  violations found;
  std::array<worker_counts, worker_count> counts{};
  std::size_t checks = 0;
  {
    ipc::exporter exporter;
    const auto deadline = std::chrono::steady_clock::now() + stress_duration;
    std::atomic<int> running{worker_count};
    std::thread checker([&] {
      // Reads until every worker is done, and once more after.
      for (bool last = false; !last; ++checks) {
        last = running.load() == 0;
        check_statistics(pool->statistics(), options, g, worker_count, found);
        std::this_thread::yield();
      }
    });
    std::vector<std::thread> workers;
    for (int i = 0; i < worker_count; ++i)
      workers.emplace_back([&, i] {
        work(i, pool, exporter, found, counts[static_cast<std::size_t>(i)], deadline);
        running.fetch_sub(1);
      });
    for (std::thread& worker : workers) worker.join();
    checker.join();
    exporter.purge();
    EXPECT_EQ(exporter.statistics().cached_chunks, 0u) << "the cache keeps fds of chunks that died";
  }

  std::size_t operations = 0;
  std::size_t resizes = 0;
  std::size_t capped = 0;
  std::size_t views = 0;
  std::size_t imports = 0;
  for (const worker_counts& c : counts) {
    operations += c.operations;
    resizes += c.resizes;
    capped += c.capped;
    views += c.views;
    imports += c.imports;
  }
  std::printf(
      "stress: %zu operations (%zu resizes, %zu refused at the cap, %zu views, %zu imports); %zu "
      "statistics checks\n",
      operations, resizes, capped, views, imports, checks);
  EXPECT_GT(checks, 1u);
  EXPECT_GT(resizes, 0u);
  EXPECT_GT(imports, 0u);

  collect_retired(true);
  pool->trim_to(0);
  const pool_statistics after = pool->statistics();
  check_statistics(after, options, g, 0, found);
  EXPECT_EQ(found.count(), 0u) << found.summary();
  EXPECT_EQ(after.reserved_current, 0u);
  EXPECT_EQ(after.used_current, 0u);
  EXPECT_EQ(after.chunks_created, after.chunks_released);
  EXPECT_LE(after.reserved_high, options.cap);
  EXPECT_EQ(retired_count(), 0u);
  EXPECT_TRUE(provider->address_space().usage() == usage_before)
      << "address space usage differs from the start";
  EXPECT_EQ(open_fd_count(), fds_before);
}

// ---- 10^4 export / import cycles across two processes --------------------------------------

constexpr unsigned long cycle_count = 10000;
constexpr unsigned long cycles_per_resize = 1000;
constexpr std::size_t cycle_chunks = 4;

template <class Kind>
class export_import_cycles : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->IsSkipped()) return;
    // OS memory in 4 KiB chunks, so that the peer reads every byte it checks quickly; the
    // GPU's in its own granularity, sampled (cycle_sample_bytes of each chunk).
    if (Kind::where().kind == memory_kind::os_host) {
      peer_granularity_ = 4096;
      this->provider_ =
          make_os_host_provider({.granularity = peer_granularity_, .commit_budget = std::size_t{64} << 20});
      this->granularity_ = peer_granularity_;
    }
  }

  std::size_t peer_granularity_ = 0;  // 0: the peer's default provider for the kind
};
using cycle_kinds = ::testing::Types<os_host_memory, device_memory>;
TYPED_TEST_SUITE(export_import_cycles, cycle_kinds, memory_kind_names);

TYPED_TEST(export_import_cycles, ten_thousand_cycles_keep_the_fd_count_of_both_processes) {
  if (this->provider_->capabilities().export_kind != handle_kind::posix_fd)
    GTEST_SKIP() << "this memory is not exported as a POSIX fd here";
  const std::size_t g = this->granularity_;
  memory_provider& provider = *this->provider_;
  const auto pool = chunk_pool::create(this->provider_);
  growable_buffer buffer(pool, {.max_size = 2 * cycle_chunks * g, .policy = chunk_policy::fixed(g)});
  std::uint32_t seed = 1;
  const auto fill = [&] {
    buffer.resize(cycle_chunks * g - 100);
    write_bytes(provider, reinterpret_cast<std::uintptr_t>(buffer.data()), pattern(cycle_chunks * g, seed));
    return sampled_checksum(provider, reinterpret_cast<std::uintptr_t>(buffer.data()), buffer.size(), g,
                            cycle_sample_bytes);
  };
  std::uint64_t expected = fill();

  ipc::exporter exporter;
  peer_process peer({VMM_IPC_PEER_PATH, TypeParam::name, std::to_string(this->peer_granularity_), "cycles",
                     std::to_string(cycle_count)});
  const auto started = std::chrono::steady_clock::now();
  std::size_t fds_at_start = 0;
  for (unsigned long cycle = 1; cycle <= cycle_count; ++cycle) {
    {
      const ipc::exported_manifest exported = exporter.export_buffer(buffer);
      ipc::send_manifest(peer.socket(), exported);
    }
    const peer_report report = receive_report(peer.socket());
    ASSERT_EQ(report.checksum, expected) << "cycle " << cycle << ": the peer sees other bytes";
    ASSERT_EQ(report.size, buffer.size()) << "cycle " << cycle;
    // The start: the exporter's cache holds one fd per chunk from the first cycle on.
    if (cycle == 1) fds_at_start = open_fd_count();
    if (cycle % cycles_per_resize == 0 && cycle != cycle_count) {
      // The chunks die (back to the pool, lent again as new chunks): the cache drops them at
      // the next export and exports their successors afresh.
      buffer.resize(0);
      buffer.collect_retired(true);  // on the GPU, once the stream has passed the shrink
      ++seed;
      expected = fill();
    }
  }
  const peer_fd_report peer_fds = receive_fd_report(peer.socket());
  EXPECT_TRUE(exited_cleanly(peer.wait()));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("%lu export/import cycles with a peer process in %.2f s (%.0f us each)\n", cycle_count, seconds,
              1e6 * seconds / static_cast<double>(cycle_count));
  ::testing::Test::RecordProperty("cycles_seconds", std::to_string(seconds));

  EXPECT_EQ(open_fd_count(), fds_at_start) << "this process's descriptors after " << cycle_count << " cycles";
  EXPECT_EQ(peer_fds.after_last, peer_fds.after_first)
      << "the peer's descriptors after " << cycle_count << " cycles";
  if (TypeParam::where().kind == memory_kind::os_host) {
    EXPECT_EQ(peer_fds.after_last, peer_fds.before_first)
        << "the peer's descriptors: an import left one open";
  }
  const ipc::export_statistics statistics = exporter.statistics();
  const std::size_t generations = (cycle_count - 1) / cycles_per_resize + 1;
  EXPECT_EQ(statistics.handles_exported, generations * cycle_chunks) << "each chunk exported once";
  EXPECT_EQ(statistics.cache_hits, (cycle_count - generations) * cycle_chunks);
  EXPECT_EQ(statistics.entries_dropped, (generations - 1) * cycle_chunks)
      << "dead chunks dropped from the cache";
  EXPECT_EQ(statistics.cached_chunks, cycle_chunks);
}

}  // namespace
}  // namespace vmm::testing
