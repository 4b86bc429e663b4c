// Buffers that continue from GPU memory into pinned host memory (spill_to_host, or a pool of
// location::pinned_host() last in spill_to). Which combinations of memory a buffer accepts
// is checked on any machine (providers that only describe a kind of memory stand in for the
// GPU's); the spill itself needs a GPU and skips without one, with the reason.

#include <sys/mman.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/retirement.hpp"

namespace vmm::testing {
namespace {

constexpr std::size_t granule = std::size_t{2} << 20;

// A provider that says it holds memory of `where` in `space`: enough for a buffer to check
// its options and reserve addresses (plain PROT_NONE mmap), never to create memory.
class described_provider final : public memory_provider {
 public:
  described_provider(location where, std::shared_ptr<vmm::address_space> space)
      : memory_provider(capabilities_of(where), std::move(space), host_executor()) {}

 private:
  static provider_capabilities capabilities_of(location where) {
    provider_capabilities c;
    c.where = where;
    c.granularity = c.recommended_granularity = granule;
    c.physical_memory_size = 64 * granule;
    c.default_accessors = {where.kind == memory_kind::device ? accessor::device(where.id) : accessor::host()};
    return c;
  }
  std::uintptr_t do_allocate_range(std::size_t size, std::size_t alignment) override {
    void* base =
        ::mmap(nullptr, size + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw out_of_memory("described_provider: mmap");
    const auto start = reinterpret_cast<std::uintptr_t>(base);
    const std::uintptr_t aligned = (start + alignment - 1) / alignment * alignment;
    if (aligned > start) ::munmap(base, aligned - start);
    ::munmap(reinterpret_cast<void*>(aligned + size), start + size + alignment - (aligned + size));
    return aligned;
  }
  void do_free_range(std::uintptr_t address, std::size_t size) override {
    ::munmap(reinterpret_cast<void*>(address), size);
  }
  [[noreturn]] static void unused() { throw std::logic_error("described_provider: describes memory only"); }
  physical_handle do_create(std::size_t) override { unused(); }
  void do_destroy(physical_handle) override { unused(); }
  void do_map(std::uintptr_t, std::size_t, physical_handle) override { unused(); }
  void do_unmap(std::uintptr_t, std::size_t) override { unused(); }
  void do_set_access(std::uintptr_t, std::size_t, std::span<const access_grant>) override { unused(); }
  int do_export_fd(physical_handle) override { unused(); }
  physical_handle do_import_fd(int, std::size_t) override { unused(); }
};

std::shared_ptr<chunk_pool> described_pool(location where, const std::shared_ptr<address_space>& space) {
  return chunk_pool::create(std::make_shared<described_provider>(where, space));
}

template <class Fn>
std::string invalid_argument_of(Fn&& fn) {
  try {
    fn();
  } catch (const invalid_argument& error) {
    return error.what();
  }
  ADD_FAILURE() << "no vmm::invalid_argument";
  return {};
}

TEST(host_spill_options, gpu_memory_may_continue_in_pinned_host_memory_and_nothing_else) {
  const auto cuda_like = std::make_shared<address_space>("a CUDA-like address space");
  const auto gpu0 = described_pool(location::device(0), cuda_like);
  const auto gpu1 = described_pool(location::device(1), cuda_like);
  const auto pinned = described_pool(location::pinned_host(0), cuda_like);
  const std::size_t max = 16 * granule;

  // Accepted: GPU onto GPU, GPU onto pinned host memory, GPU onto GPU onto pinned host.
  EXPECT_FALSE(growable_buffer(gpu0, {.max_size = max, .spill_to = {gpu1}}).spills_to_host());
  EXPECT_TRUE(growable_buffer(gpu0, {.max_size = max, .spill_to = {pinned}}).spills_to_host());
  EXPECT_TRUE(growable_buffer(gpu0, {.max_size = max, .spill_to = {gpu1, pinned}}).spills_to_host());
  // An access list for the GPU part, the host's grant applying to the host part only.
  EXPECT_TRUE(growable_buffer(gpu0, {.max_size = max,
                                     .access = {{accessor::device(0)}, {accessor::host()}},
                                     .spill_to = {pinned}})
                  .spills_to_host());

  // Refused, each saying why.
  std::string message =
      invalid_argument_of([&] { growable_buffer(pinned, {.max_size = max, .spill_to = {gpu0}}); });
  EXPECT_NE(message.find("cannot spill from pinned host (numa 0) memory to gpu 0 memory"), std::string::npos)
      << message;
  message = invalid_argument_of([&] {
    growable_buffer(gpu0, {.max_size = max, .spill_to = {pinned, gpu1}});
  });
  EXPECT_NE(message.find("which then comes last"), std::string::npos) << message;
  message = invalid_argument_of([&] {
    growable_buffer(gpu0, {.max_size = max, .access = {{accessor::host()}}, .spill_to = {pinned}});
  });
  EXPECT_NE(message.find("names only the host"), std::string::npos) << message;
  const auto elsewhere = described_pool(location::pinned_host(0), std::make_shared<address_space>("another"));
  message = invalid_argument_of([&] { growable_buffer(gpu0, {.max_size = max, .spill_to = {elsewhere}}); });
  EXPECT_NE(message.find("another address space"), std::string::npos) << message;
}

TEST(host_spill_options, os_host_memory_spills_onto_nothing_but_its_own_provider) {
  const auto os = chunk_pool::create(provider_for(location::os_host()));
  const auto pinned_like =
      described_pool(location::pinned_host(0), std::make_shared<address_space>("cuda-like"));
  std::string message =
      invalid_argument_of([&] { growable_buffer(os, {.max_size = 4 * granule, .spill_to_host = true}); });
  EXPECT_NE(message.find("spill_to_host continues GPU memory"), std::string::npos) << message;
  message =
      invalid_argument_of([&] { growable_buffer(os, {.max_size = 4 * granule, .spill_to = {pinned_like}}); });
  EXPECT_NE(message.find("cannot spill from os host memory to pinned host (numa 0) memory"),
            std::string::npos)
      << message;
  // Another OS provider is another address space.
  const auto other_os = chunk_pool::create(make_os_host_provider());
  message =
      invalid_argument_of([&] { growable_buffer(os, {.max_size = 4 * granule, .spill_to = {other_os}}); });
  EXPECT_NE(message.find("another address space"), std::string::npos) << message;
  // The same provider's pools: as before.
  growable_buffer fine(os, {.max_size = 4 * granule, .spill_to = {chunk_pool::create(os->provider())}});
  EXPECT_FALSE(fine.spills_to_host());
}

// On a GPU: a device pool capped at a few granules, then pinned host memory.
class host_spill : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "no GPU here: " << why;
    try {
      const auto gpu = provider_for(location::device(0));
      g_ = gpu->capabilities().granularity;
      device_ = chunk_pool::create(gpu, {.cap = 4 * g_});
      host_ = chunk_pool::create(provider_for(location::pinned_host(0)));
    } catch (const std::exception& error) {
      GTEST_SKIP() << "no pinned host memory through the driver here: " << error.what();
    }
  }
  std::shared_ptr<chunk_pool> device_;
  std::shared_ptr<chunk_pool> host_;
  std::size_t g_ = 0;
};

TEST_F(host_spill, a_full_device_pool_continues_in_pinned_host_memory_under_one_pointer) {
  const address_space_usage before = device_->provider()->address_space().usage();
  {
    growable_buffer buffer(device_,
                           {.max_size = 16 * g_, .policy = chunk_policy::fixed(g_), .spill_to = {host_}});
    ASSERT_TRUE(buffer.spills_to_host());
    void* const address = buffer.data();
    buffer.resize(10 * g_);
    EXPECT_EQ(buffer.data(), address);
    EXPECT_EQ(device_->statistics().used_current, 4 * g_);
    EXPECT_EQ(host_->statistics().used_current, 6 * g_);
    // Bytes across the boundary, written by the GPU's executor piece by piece and read back.
    const auto bytes = pattern(4 * g_, 61);
    const auto at = reinterpret_cast<std::uintptr_t>(address) + 2 * g_;  // [2g, 6g): both parts
    auto& executor = buffer.provider()->executor();
    for (const auto& [piece, n] : buffer.provider()->address_space().mapped_pieces(at, bytes.size()))
      executor.copy(reinterpret_cast<void*>(piece), bytes.data() + (piece - at), n, buffer.stream());
    executor.synchronize(buffer.stream());
    std::vector<std::uint8_t> back(bytes.size());
    for (const auto& [piece, n] : buffer.provider()->address_space().mapped_pieces(at, back.size()))
      executor.copy(back.data() + (piece - at), reinterpret_cast<void*>(piece), n, buffer.stream());
    executor.synchronize(buffer.stream());
    EXPECT_EQ(back, bytes);
    // The host reads its part directly: it was given access to the pinned chunks.
    std::fprintf(stderr, "host_spill: the host reads the host part\n");
    const auto* host_part = static_cast<const std::uint8_t*>(address) + 4 * g_;
    EXPECT_EQ(0, std::memcmp(host_part, bytes.data() + 2 * g_, 2 * g_));
    std::fprintf(stderr, "host_spill: read\n");
    // Past both: out of memory, nothing changed.
    host_->set_cap(6 * g_);
    EXPECT_THROW(buffer.resize(12 * g_), out_of_memory);
    EXPECT_EQ(buffer.capacity(), 10 * g_);
    buffer.resize(3 * g_);
    buffer.collect_retired(true);
    EXPECT_EQ(host_->statistics().used_current, 0u);
  }
  vmm::collect_retired(true);
  EXPECT_EQ(device_->statistics().used_current, 0u);
  EXPECT_EQ(host_->statistics().used_current, 0u);
  EXPECT_EQ(device_->provider()->address_space().usage().ranges, before.ranges);
}

TEST_F(host_spill, a_device_vector_with_spill_to_host_reads_and_fills_across_the_boundary) {
  device_vector<std::uint32_t> vector(device_, {.max_size = 32 * g_, .spill_to_host = true});
  std::vector<std::uint32_t> values(8 * g_ / sizeof(std::uint32_t));
  std::iota(values.begin(), values.end(), 17u);
  vector.append(values);  // 8 granules: 4 on the GPU, the rest in the default pinned pool
  EXPECT_EQ(device_->statistics().used_current, 4 * g_);
  EXPECT_GT(default_pool(location::pinned_host(0))->statistics().used_current, 0u);
  EXPECT_EQ(vector.to_host(), values);
  vector.resize(values.size() + 3 * g_ / sizeof(std::uint32_t), element_init::zeroed);
  const std::vector<std::uint32_t> back = vector.to_host();
  EXPECT_TRUE(std::equal(values.begin(), values.end(), back.begin()));
  EXPECT_TRUE(std::all_of(back.begin() + static_cast<std::ptrdiff_t>(values.size()), back.end(),
                          [](std::uint32_t v) { return v == 0; }));
}

TEST_F(host_spill, growth_ahead_prepares_gpu_chunks_and_the_spill_still_works) {
  growable_buffer buffer(device_, {.max_size = 16 * g_,
                                   .policy = chunk_policy::fixed(g_),
                                   .spill_to = {host_},
                                   .growth_ahead = {.bytes = 2 * g_}});
  buffer.resize(g_);
  buffer.wait_for_growth_ahead();
  EXPECT_EQ(buffer.ready_ahead(), 2 * g_);
  EXPECT_EQ(device_->statistics().chunks_created, 3u);
  buffer.resize(8 * g_);           // two ready, one more on the GPU, four in host memory
  buffer.wait_for_growth_ahead();  // then chunks are asked for where the buffer maps now
  EXPECT_EQ(device_->statistics().used_current, 4 * g_);
  EXPECT_EQ(host_->statistics().used_current, 4 * g_ + buffer.ready_ahead());
  EXPECT_EQ(device_->statistics().chunks_created, 4u);
}

}  // namespace
}  // namespace vmm::testing
