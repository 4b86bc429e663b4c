// A soak of vmm-store: many client processes (tests/helpers/store_peer.cpp, mode soak) run
// create / get / grow / release / remove cycles against one daemon, each checking the bytes it
// reads, and a seeded share of them kill themselves with SIGKILL in the middle of a request
// (half a frame sent, or a request whose reply is never read) or of a cycle (an uncommitted
// creation, a buffer held across a grow). Afterwards the daemon's counters are back where they
// were, its open descriptors are the same and its resident memory within a bound, and every
// surviving client read what it expected.
//
// CI runs 10^4 cycles or more (seed 1). A longer soak, and another seed:
//     VMM_STORE_SOAK_CYCLES=1000000 VMM_STORE_SOAK_SEED=7 build/tests/vmm_store_soak_tests
// The figures (cycles, kills, fds and resident memory before and after) are printed and kept
// as test properties (--gtest_output=xml).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "helpers/store_peer_protocol.hpp"
#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "sanitizers.hpp"
#include "vmm/store/client.hpp"

namespace vmm::testing {
namespace {

constexpr std::uint64_t cycles_per_peer = 250;
constexpr std::size_t peers_at_once = 6;
// Resident memory the daemon may have gained over the soak: its heap and the allocator's
// caches settle during the warm-up; what stays above this is a leak.
constexpr std::size_t resident_bound = std::size_t{16} << 20;

std::uint64_t from_environment(const char* name, std::uint64_t otherwise) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return otherwise;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || value == 0) throw invalid_argument(std::string(name) + " is not a positive number");
  return value;
}

// VmRSS of process `pid` in bytes.
std::size_t resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  throw std::runtime_error("no VmRSS in /proc/" + std::to_string(pid) + "/status");
}

// What one peer is told: its cycles and, for a victim, the cycle and the way it dies.
struct peer_plan {
  std::uint64_t cycles = cycles_per_peer;
  std::int64_t dies_at = -1;
  int how = 0;
};

template <class Kind>
class store_soak : public provider_test<Kind> {
 protected:
  std::unique_ptr<child_process> spawn(std::size_t index, const peer_plan& plan, std::uint64_t seed) const {
    return std::make_unique<child_process>(
        std::vector<std::string>{VMM_STORE_PEER_PATH, daemon_->socket(), Kind::name, "soak",
                                 std::to_string(index), std::to_string(plan.cycles), std::to_string(seed),
                                 std::to_string(plan.dies_at), std::to_string(plan.how)});
  }

  // Runs `plans` peers, peers_at_once at a time; returns the cycles completed and counts the
  // kills. Survivors must report every cycle done with no mismatch; victims must die by SIGKILL.
  std::uint64_t run_peers(const std::vector<peer_plan>& plans, std::uint64_t seed, std::size_t* kills) {
    std::uint64_t completed = 0;
    std::deque<std::pair<std::size_t, std::unique_ptr<child_process>>> running;
    std::size_t next = 0;
    const auto finish_oldest = [&] {
      auto& [index, process] = running.front();
      child_process& child = *process;
      const peer_plan& plan = plans[index];
      if (plan.dies_at < 0) {
        // A peer's cycles take as long as the machine's load makes them: ctest's timeout
        // bounds the wait, not the report's. A peer that failed has said why on stderr.
        store_report report;
        try {
          report = receive_store_report(child.socket(), ipc::no_timeout);
        } catch (const std::exception& error) {
          ADD_FAILURE() << "peer " << index << " sent no report (" << error.what() << ")";
        }
        EXPECT_EQ(report.size, plan.cycles) << "peer " << index;
        EXPECT_EQ(report.checksum, 0u) << "peer " << index << " read bytes it did not expect";
        const int status = child.wait();
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
            << "peer " << index << " status " << status;
        completed += report.size;
      } else {
        const int status = child.wait();
        EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
            << "peer " << index << " status " << status;
        completed += static_cast<std::uint64_t>(plan.dies_at);
        ++*kills;
      }
      running.pop_front();
    };
    while (next < plans.size() || !running.empty()) {
      if (next < plans.size() && running.size() < peers_at_once) {
        running.emplace_back(next, spawn(next, plans[next], seed * 1000003 + next));
        ++next;
      } else {
        finish_oldest();
      }
    }
    return completed;
  }

  temporary_directory directory_;
  std::unique_ptr<daemon_process> daemon_;
};

using soak_kinds = ::testing::Types<os_host_memory, device_memory>;
TYPED_TEST_SUITE(store_soak, soak_kinds, memory_kind_names);

TYPED_TEST(store_soak, crashing_clients_leave_the_daemon_as_it_was) {
  // Under ThreadSanitizer a tenth of the cycles (tests/sanitizers.hpp says why).
  const std::uint64_t target =
      from_environment("VMM_STORE_SOAK_CYCLES", under_thread_sanitizer ? 1'000 : 10'000);
  const std::uint64_t seed = from_environment("VMM_STORE_SOAK_SEED", 1);
  this->daemon_ = std::make_unique<daemon_process>(this->directory_.path() + "/socket");
  const pid_t daemon_pid = this->daemon_->process().pid();
  store::client store({.socket_path = this->daemon_->socket()});
  store::buffer shared = store.create("shared", soak_shared_bytes, TypeParam::where());
  write_bytes(*shared.provider(), reinterpret_cast<std::uintptr_t>(shared.data()),
              pattern(soak_shared_bytes, 0x5eed));
  store.seal("shared");

  // A warm-up wave, one peer of each death among them, then the baseline.
  std::size_t kills = 0;
  std::vector<peer_plan> warm_up(peers_at_once, peer_plan{.cycles = 20});
  for (int how = 0; how < 4; ++how) warm_up[static_cast<std::size_t>(how)] = {20, 10, how};
  (void)this->run_peers(warm_up, seed + 1, &kills);
  kills = 0;
  const store::daemon_statistics before = store.statistics();
  const std::size_t resident_before = resident_bytes(daemon_pid);

  // A quarter of the peers die, each at a seeded cycle and in a seeded way.
  std::mt19937_64 random(seed);
  std::vector<peer_plan> plans;
  std::uint64_t planned = 0;
  while (planned < target) {
    peer_plan plan;
    if (random() % 4 == 0) {
      plan.dies_at = static_cast<std::int64_t>(random() % cycles_per_peer);
      plan.how = static_cast<int>(random() % 4);
      planned += static_cast<std::uint64_t>(plan.dies_at);
    } else {
      planned += plan.cycles;
    }
    plans.push_back(plan);
  }
  const std::uint64_t completed = this->run_peers(plans, seed, &kills);
  EXPECT_EQ(completed, planned);
  EXPECT_GE(completed, target);

  const store::daemon_statistics after = store.statistics();
  // Everything but the pool's idle memory, which it keeps for the next create as any pool does
  // (chunk_pool.hpp): each chunk it holds is one memfd, so a chunk more there is a descriptor
  // more, and no other descriptor may stay.
  EXPECT_EQ(after.connections, before.connections);
  EXPECT_EQ(after.entries, before.entries);
  EXPECT_EQ(after.named_entries, before.named_entries);
  EXPECT_EQ(after.holds, before.holds);
  EXPECT_EQ(after.bytes, before.bytes);
  EXPECT_EQ(after.pool_used, before.pool_used);
  EXPECT_EQ(after.cached_exports, before.cached_exports);
  EXPECT_GE(after.pool_reserved, before.pool_reserved);
  const std::uint64_t pool_chunks_added = (after.pool_reserved - before.pool_reserved) / this->granularity_;
  EXPECT_GE(after.open_fds, before.open_fds);
  EXPECT_LE(after.open_fds, before.open_fds + pool_chunks_added)
      << "descriptors left behind beyond the " << pool_chunks_added << " chunk(s) the pool kept";
  EXPECT_EQ(after.named_entries, 1u);  // "shared"
  const std::size_t resident_after = resident_bytes(daemon_pid);
  if (!under_address_sanitizer) {  // its quarantine keeps freed memory resident (sanitizers.hpp)
    EXPECT_LE(resident_after, resident_before + resident_bound);
  }
  shared.release();
  store.remove("shared");
  const store::daemon_statistics emptied = store.statistics();
  EXPECT_EQ(emptied.entries, 0u);
  EXPECT_EQ(emptied.holds, 0u);
  EXPECT_EQ(emptied.bytes, 0u);
  EXPECT_EQ(emptied.pool_used, 0u);
  EXPECT_EQ(emptied.connections, 1u);

  std::cout << "store soak (seed " << seed << ", granularity " << this->granularity_ << "): " << completed
            << " cycles by " << plans.size() << " peers, " << kills << " killed; daemon fds "
            << before.open_fds << " -> " << after.open_fds << ", resident " << resident_before / 1024
            << " -> " << resident_after / 1024 << " KiB, pool reserved " << before.pool_reserved << " -> "
            << after.pool_reserved << " bytes\n";
  ::testing::Test::RecordProperty("cycles", std::to_string(completed));
  ::testing::Test::RecordProperty("kills", std::to_string(kills));
  ::testing::Test::RecordProperty("fds",
                                  std::to_string(before.open_fds) + " -> " + std::to_string(after.open_fds));
  ::testing::Test::RecordProperty("resident_kib", std::to_string(resident_before / 1024) + " -> " +
                                                      std::to_string(resident_after / 1024));
}

}  // namespace
}  // namespace vmm::testing
