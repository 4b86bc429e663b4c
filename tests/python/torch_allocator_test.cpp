// The C interface of libvmm_torch_allocator.so (python/native/vmm_torch.h), on host
// memory of the OS provider (vmm_torch_testing_use_host_memory), so that it runs in CI:
// allocation and free with statistics, failures that return NULL with the message kept,
// the throwing entry point PyTorch's change_current_allocator uses, tags, sleep and wake
// (bytes and pointers kept, allocation refused and frees deferred while asleep, bad use
// refused with nothing changed), trim, and threads allocating while another sleeps and
// wakes. Each test uses devices of its own: a resource lives until the process exits.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "vmm_torch.h"

namespace {

class host_memory_environment : public ::testing::Environment {
 public:
  // Each resource may hold at most `limit` bytes: out of memory is then quick to reach, and
  // costs the machine nothing.
  static constexpr std::size_t limit = std::size_t{256} << 20;
  void SetUp() override {
    ASSERT_EQ(vmm_torch_testing_use_host_memory(), 0) << last_error();
    ASSERT_EQ(vmm_torch_configure(limit, SIZE_MAX, 0), 0) << last_error();
  }
  static std::string last_error() {
    std::string message(vmm_torch_last_error(nullptr, 0) + 1, '\0');
    message.resize(vmm_torch_last_error(message.data(), message.size()));
    return message;
  }
};

const auto* const environment = ::testing::AddGlobalTestEnvironment(new host_memory_environment);

std::string last_error() {
  return host_memory_environment::last_error();
}

vmm_torch_statistics statistics_of(int device) {
  vmm_torch_statistics s{};
  EXPECT_EQ(vmm_torch_statistics_of(device, &s), 0) << last_error();
  return s;
}

void fill(void* p, std::size_t n, std::uint8_t seed) {
  auto* bytes = static_cast<std::uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::uint8_t>(seed + i * 7);
}

bool holds(const void* p, std::size_t n, std::uint8_t seed) {
  const auto* bytes = static_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (bytes[i] != static_cast<std::uint8_t>(seed + i * 7)) return false;
  return true;
}

// A tag for the calling thread while it lives.
class scoped_tag {
 public:
  explicit scoped_tag(std::uint32_t tag) : previous_(vmm_torch_set_tag(tag)) {}
  scoped_tag(const scoped_tag&) = delete;
  scoped_tag& operator=(const scoped_tag&) = delete;
  ~scoped_tag() { vmm_torch_set_tag(previous_); }

 private:
  std::uint32_t previous_;
};

constexpr std::size_t mib = std::size_t{1} << 20;
static_assert(host_memory_environment::limit >= 128 * mib, "the tests below hold up to 108 MiB at once");

TEST(torch_allocator, allocations_are_aligned_usable_and_counted) {
  constexpr int device = 0;
  void* a = vmm_alloc(3 * mib + 5, device, nullptr);
  void* b = vmm_alloc(100, device, nullptr);
  ASSERT_NE(a, nullptr) << last_error();
  ASSERT_NE(b, nullptr) << last_error();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 256, 0U);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 256, 0U);
  fill(a, 3 * mib + 5, 1);
  fill(b, 100, 2);
  EXPECT_TRUE(holds(a, 3 * mib + 5, 1));
  vmm_torch_statistics s = statistics_of(device);
  EXPECT_EQ(s.allocations, 2U);
  EXPECT_EQ(s.used_current, (3 * mib + 256) + 256);
  EXPECT_GE(s.reserved_current, s.used_current);
  EXPECT_EQ(s.page_size, 2 * mib);
  EXPECT_EQ(s.asleep, 0U);

  vmm_free(a, 3 * mib + 5, device, nullptr);
  vmm_free(b, 100, device, nullptr);
  s = statistics_of(device);
  EXPECT_EQ(s.allocations, 0U);
  EXPECT_EQ(s.used_current, 0U);
  EXPECT_EQ(s.used_high, (3 * mib + 256) + 256);
  EXPECT_EQ(s.bad_deallocations, 0U);
}

TEST(torch_allocator, zero_bytes_is_null_without_an_error) {
  vmm_torch_clear_last_error();
  EXPECT_EQ(vmm_alloc(0, 1, nullptr), nullptr);
  EXPECT_EQ(vmm_torch_last_error(nullptr, 0), 0U);
  vmm_free(nullptr, 0, 1, nullptr);  // nothing
  EXPECT_EQ(vmm_torch_last_error(nullptr, 0), 0U);
}

TEST(torch_allocator, a_bad_device_is_null_with_the_reason) {
  EXPECT_EQ(vmm_alloc(256, -1, nullptr), nullptr);
  EXPECT_NE(last_error().find("out of range"), std::string::npos) << last_error();
  EXPECT_EQ(vmm_alloc(256, 64, nullptr), nullptr);
  EXPECT_NE(last_error().find("device 64"), std::string::npos) << last_error();
  vmm_torch_statistics s{};
  EXPECT_EQ(vmm_torch_statistics_of(64, &s), -1);
  EXPECT_EQ(vmm_torch_statistics_of(0, nullptr), -1);
}

TEST(torch_allocator, out_of_memory_is_null_and_counted_and_changes_nothing) {
  constexpr int device = 2;
  constexpr std::size_t too_much = std::size_t{1} << 30;  // past the limit of every resource here
  void* kept = vmm_alloc(mib, device, nullptr);
  ASSERT_NE(kept, nullptr) << last_error();
  const vmm_torch_statistics before = statistics_of(device);

  EXPECT_EQ(vmm_alloc(too_much, device, nullptr), nullptr);
  const std::string message = last_error();
  EXPECT_NE(message.find("vmm_alloc(1073741824 bytes"), std::string::npos) << message;
  void* out = &out;
  EXPECT_EQ(vmm_torch_allocate(device, nullptr, too_much, &out), 1);
  EXPECT_EQ(out, nullptr);

  const vmm_torch_statistics after = statistics_of(device);
  EXPECT_EQ(after.out_of_memory, before.out_of_memory + 2);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.used_current, before.used_current);
  vmm_free(kept, mib, device, nullptr);
}

TEST(torch_allocator, the_throwing_entry_point_throws_what_pytorch_turns_into_an_error) {
  constexpr int device = 3;
  constexpr std::size_t too_much = std::size_t{1} << 30;
  try {
    (void)vmm_alloc_throwing(too_much, device, nullptr);
    FAIL() << "no exception";
  } catch (const std::bad_alloc& error) {
    EXPECT_EQ(std::string(error.what()).rfind("CUDA out of memory. vmm_alloc(", 0), 0U) << error.what();
  }
  try {
    (void)vmm_alloc_throwing(256, -5, nullptr);
    FAIL() << "no exception";
  } catch (const std::bad_alloc&) {
    FAIL() << "a bad device is not out of memory";
  } catch (const std::exception& error) {
    EXPECT_NE(std::string(error.what()).find("out of range"), std::string::npos) << error.what();
  }
  void* p = vmm_alloc_throwing(4096, device, nullptr);
  ASSERT_NE(p, nullptr);
  vmm_free(p, 4096, device, nullptr);
  EXPECT_EQ(statistics_of(device).allocations, 0U);
}

TEST(torch_allocator, a_pointer_that_is_not_vmms_is_refused_and_reported) {
  constexpr int device = 4;
  void* p = vmm_alloc(mib, device, nullptr);
  ASSERT_NE(p, nullptr);
  int local = 0;
  vmm_free(&local, sizeof local, device, nullptr);
  EXPECT_NE(last_error().find("refused"), std::string::npos) << last_error();
  vmm_free(p, mib, device, nullptr);
  vmm_free(p, mib, device, nullptr);  // twice
  const vmm_torch_statistics s = statistics_of(device);
  EXPECT_EQ(s.bad_deallocations, 2U);
  EXPECT_EQ(s.allocations, 0U);
  vmm_free(p, mib, 5, nullptr);  // a device with no resource
  EXPECT_NE(last_error().find("no vmm resource"), std::string::npos) << last_error();
}

TEST(torch_allocator, tags_are_per_thread) {
  const std::uint32_t before = vmm_torch_tag();
  {
    scoped_tag weights(7);
    EXPECT_EQ(vmm_torch_tag(), 7U);
    std::uint32_t seen = 99;
    std::thread([&] { seen = vmm_torch_tag(); }).join();
    EXPECT_EQ(seen, 0U);
  }
  EXPECT_EQ(vmm_torch_tag(), before);
}

TEST(torch_allocator, sleep_keeps_offloaded_bytes_and_every_pointer) {
  constexpr int device = 6;
  constexpr std::size_t weight_bytes = 5 * mib + 123;
  constexpr std::size_t cache_bytes = 9 * mib;
  void* weights = nullptr;
  void* cache = nullptr;
  {
    scoped_tag tag(1);
    weights = vmm_alloc(weight_bytes, device, nullptr);
  }
  {
    scoped_tag tag(2);
    cache = vmm_alloc(cache_bytes, device, nullptr);
  }
  ASSERT_NE(weights, nullptr) << last_error();
  ASSERT_NE(cache, nullptr) << last_error();
  fill(weights, weight_bytes, 11);
  fill(cache, cache_bytes, 22);

  const std::uint32_t offload[] = {1};
  ASSERT_EQ(vmm_torch_sleep(device, offload, 1), 0) << last_error();
  EXPECT_EQ(vmm_torch_asleep(device), 1);
  vmm_torch_statistics s = statistics_of(device);
  EXPECT_EQ(s.asleep, 1U);
  EXPECT_EQ(s.reserved_current, 0U);
  EXPECT_EQ(s.allocations, 2U);

  ASSERT_EQ(vmm_torch_wake(device, nullptr, 0, 0), 0) << last_error();
  EXPECT_EQ(vmm_torch_asleep(device), 0);
  EXPECT_TRUE(holds(weights, weight_bytes, 11));  // the same pointer, the same bytes
  fill(cache, cache_bytes, 33);                   // dropped, but mapped again and usable
  EXPECT_TRUE(holds(cache, cache_bytes, 33));
  vmm_free(weights, weight_bytes, device, nullptr);
  vmm_free(cache, cache_bytes, device, nullptr);
  s = statistics_of(device);
  EXPECT_EQ(s.allocations, 0U);
  EXPECT_EQ(s.bad_deallocations, 0U);
}

TEST(torch_allocator, while_asleep_allocation_fails_and_frees_wait_for_the_wake) {
  constexpr int device = 7;
  void* a = vmm_alloc(mib, device, nullptr);
  void* b = vmm_alloc(mib, device, nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(vmm_torch_sleep(device, nullptr, 0), 0) << last_error();

  EXPECT_EQ(vmm_alloc(mib, device, nullptr), nullptr);
  EXPECT_NE(last_error().find("asleep"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("nothing was allocated"), std::string::npos) << last_error();
  vmm_free(a, mib, device, nullptr);
  vmm_torch_statistics s = statistics_of(device);
  EXPECT_EQ(s.frees_deferred, 1U);
  EXPECT_EQ(s.failed, 1U);
  EXPECT_EQ(s.allocations, 2U);  // the free waits for the wake
  EXPECT_EQ(s.bad_deallocations, 0U);

  ASSERT_EQ(vmm_torch_wake(device, nullptr, 0, 0), 0) << last_error();
  s = statistics_of(device);
  EXPECT_EQ(s.allocations, 1U);
  EXPECT_EQ(s.bad_deallocations, 0U);
  void* c = vmm_alloc(mib, device, nullptr);
  EXPECT_NE(c, nullptr) << last_error();
  vmm_free(b, mib, device, nullptr);
  vmm_free(c, mib, device, nullptr);
  EXPECT_EQ(statistics_of(device).allocations, 0U);
}

TEST(torch_allocator, waking_some_tags_keeps_the_rest_asleep) {
  constexpr int device = 8;
  void* a = nullptr;
  void* b = nullptr;
  {
    scoped_tag tag(1);
    a = vmm_alloc(2 * mib, device, nullptr);
  }
  {
    scoped_tag tag(2);
    b = vmm_alloc(2 * mib, device, nullptr);
  }
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  fill(a, 2 * mib, 1);
  fill(b, 2 * mib, 2);
  const std::uint32_t both[] = {1, 2};
  ASSERT_EQ(vmm_torch_sleep(device, both, 2), 0) << last_error();
  const std::uint32_t first[] = {1};
  ASSERT_EQ(vmm_torch_wake(device, first, 1, 0), 0) << last_error();
  EXPECT_EQ(vmm_torch_asleep(device), 1);
  EXPECT_TRUE(holds(a, 2 * mib, 1));
  EXPECT_EQ(vmm_alloc(256, device, nullptr), nullptr);  // still asleep
  const std::uint32_t second[] = {2};
  ASSERT_EQ(vmm_torch_wake(device, second, 1, 0), 0) << last_error();
  EXPECT_EQ(vmm_torch_asleep(device), 0);
  EXPECT_TRUE(holds(b, 2 * mib, 2));
  vmm_free(a, 2 * mib, device, nullptr);
  vmm_free(b, 2 * mib, device, nullptr);
}

TEST(torch_allocator, bad_sleep_and_wake_are_refused_and_change_nothing) {
  constexpr int device = 9;
  EXPECT_EQ(vmm_torch_wake(device, nullptr, 0, 0), -1);  // no resource yet
  EXPECT_NE(last_error().find("not asleep"), std::string::npos) << last_error();
  void* p = vmm_alloc(mib, device, nullptr);
  ASSERT_NE(p, nullptr);
  fill(p, mib, 5);
  EXPECT_EQ(vmm_torch_wake(device, nullptr, 0, 0), -1);
  EXPECT_NE(last_error().find("not asleep"), std::string::npos) << last_error();
  EXPECT_EQ(vmm_torch_sleep(device, nullptr, 1), -1);  // a count with no tags
  EXPECT_EQ(vmm_torch_asleep(device), 0);

  const std::uint32_t all[] = {0};
  ASSERT_EQ(vmm_torch_sleep(device, all, 1), 0) << last_error();
  EXPECT_EQ(vmm_torch_sleep(device, all, 1), -1);
  EXPECT_NE(last_error().find("asleep already"), std::string::npos) << last_error();
  ASSERT_EQ(vmm_torch_wake(device, nullptr, 0, 0), 0) << last_error();
  EXPECT_TRUE(holds(p, mib, 5));
  vmm_free(p, mib, device, nullptr);
}

TEST(torch_allocator, trim_gives_idle_pages_back_and_peaks_reset) {
  constexpr int device = 10;
  void* p = vmm_alloc(8 * mib, device, nullptr);
  ASSERT_NE(p, nullptr);
  vmm_free(p, 8 * mib, device, nullptr);
  vmm_torch_statistics s = statistics_of(device);
  EXPECT_GE(s.reserved_current, 8 * mib);  // idle pages stay mapped for reuse
  ASSERT_EQ(vmm_torch_trim(device, 0), 0) << last_error();
  s = statistics_of(device);
  EXPECT_EQ(s.reserved_current, 0U);
  EXPECT_GE(s.used_high, 8 * mib);
  ASSERT_EQ(vmm_torch_reset_peak(device), 0) << last_error();
  s = statistics_of(device);
  EXPECT_EQ(s.used_high, 0U);
  EXPECT_EQ(s.reserved_high, 0U);
}

TEST(torch_allocator, devices_lists_the_resources_made_and_settings_come_first) {
  ASSERT_NE(vmm_alloc(256, 11, nullptr), nullptr);
  std::vector<int> devices(vmm_torch_devices(nullptr, 0));
  ASSERT_EQ(vmm_torch_devices(devices.data(), devices.size()), devices.size());
  EXPECT_NE(std::find(devices.begin(), devices.end(), 11), devices.end());
  EXPECT_TRUE(std::is_sorted(devices.begin(), devices.end()));
  EXPECT_EQ(vmm_torch_configure(0, SIZE_MAX, 0), -1);
  EXPECT_NE(last_error().find("configure before"), std::string::npos) << last_error();
  for (const double bad : {-0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_EQ(vmm_torch_configure(0, SIZE_MAX, bad), -1) << bad;
    EXPECT_NE(last_error().find("headroom"), std::string::npos) << last_error();
  }
  EXPECT_EQ(vmm_torch_configure_large_pages(0, SIZE_MAX, 0, 0), -1);
  EXPECT_NE(last_error().find("configure before"), std::string::npos) << last_error();
  // A bad page size is refused naming it, before the check that a resource exists.
  for (const std::size_t bad : {std::size_t{3} << 20, std::size_t{2} << 30, std::size_t{3}}) {
    EXPECT_EQ(vmm_torch_configure_large_pages(0, SIZE_MAX, 0, bad), -1) << bad;
    EXPECT_NE(last_error().find("large_page_size " + std::to_string(bad) + " is not a power of two"),
              std::string::npos)
        << last_error();
  }
  EXPECT_EQ(vmm_torch_testing_use_host_memory(), -1);
}

// vmm_torch_configure_large_pages before a process's first allocation: a 64 MiB request
// takes pages of the size given (8 pages of 8 MiB, where vmm's default of 16 granules takes
// 2 of the OS provider's), and a size below the granularity is refused by the resource
// when it is made, naming it. Each case in a process of its own (a death test of the
// threadsafe style runs the program again), where only the environment has configured.
int large_pages_in_a_fresh_process(std::size_t large_page_size) {
  constexpr int device = 30;
  constexpr std::size_t bytes = std::size_t{64} << 20;
  if (vmm_torch_configure_large_pages(host_memory_environment::limit, SIZE_MAX, 0, large_page_size) != 0) {
    std::fprintf(stderr, "configure: %s\n", last_error().c_str());
    return 1;
  }
  void* const p = vmm_alloc(bytes, device, nullptr);
  if (p == nullptr) {
    std::fprintf(stderr, "refused: %s\n", last_error().c_str());
    return 2;
  }
  vmm_torch_statistics s{};
  if (vmm_torch_statistics_of(device, &s) != 0) return 1;
  const std::uint64_t pages = bytes / large_page_size;
  if (s.handles != pages || large_page_size == 16 * s.page_size) {
    std::fprintf(stderr, "%llu pages of granularity %llu, not %llu\n",
                 static_cast<unsigned long long>(s.handles), static_cast<unsigned long long>(s.page_size),
                 static_cast<unsigned long long>(pages));
    return 1;
  }
  vmm_free(p, bytes, device, nullptr);
  return 0;
}

TEST(torch_allocator, configure_large_pages_sets_the_pages_of_large_requests) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(large_pages_in_a_fresh_process(std::size_t{8} << 20)), ::testing::ExitedWithCode(0),
              "");
  EXPECT_EXIT(std::_Exit(large_pages_in_a_fresh_process(std::size_t{1} << 20)), ::testing::ExitedWithCode(2),
              "refused: .*large_page_size 1048576 is not the granularity");
}

// Threads allocate and free while the main thread puts the device to sleep and wakes it,
// round after round until they are done: an allocation fails while asleep, no free is ever
// refused, and at the end every allocation has been freed.
TEST(torch_allocator, sleep_and_wake_while_other_threads_allocate_and_free) {
  constexpr int device = 12;
  constexpr int threads = 4;
  constexpr int iterations = 3000;
  ASSERT_NE(vmm_alloc(256, device, nullptr), nullptr);  // the resource exists
  std::atomic<int> finished{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      std::vector<std::pair<void*, std::size_t>> live;
      for (std::size_t i = 0; i < iterations; ++i) {
        const std::size_t bytes = 256 + ((i * 7919 + static_cast<std::size_t>(t) * 104729) % (3 * mib));
        if (void* p = vmm_alloc(bytes, device, nullptr)) live.emplace_back(p, bytes);
        if (live.size() > 8) {
          vmm_free(live.front().first, live.front().second, device, nullptr);
          live.erase(live.begin());
        }
      }
      for (const auto& [p, bytes] : live) vmm_free(p, bytes, device, nullptr);
      finished.fetch_add(1);
    });
  // A bounded number of rounds: back to back, sleep and wake could starve the workers
  // (the device's mutex is not fair), and the test would never end on a machine of many
  // cores.
  int rounds = 0;
  for (; rounds < 50 && finished.load() < threads; ++rounds) {
    ASSERT_EQ(vmm_torch_sleep(device, nullptr, 0), 0) << last_error();
    ASSERT_EQ(vmm_torch_wake(device, nullptr, 0, 0), 0) << last_error();
  }
  for (std::thread& worker : workers) worker.join();
  EXPECT_GT(rounds, 0);
  const vmm_torch_statistics s = statistics_of(device);
  EXPECT_EQ(s.allocations, 1U);  // the one above
  EXPECT_EQ(s.bad_deallocations, 0U);
}

}  // namespace
