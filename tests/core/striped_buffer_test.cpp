// striped_buffer and a growable_buffer that spills across GPUs, from the host.
//
// Bad arguments are refused everywhere: those that need no driver are vmm::invalid_argument
// on CI too; those that need one are invalid_argument where a GPU is and
// vmm::driver_unavailable where none is. With one GPU, a degenerate striped buffer (every
// stripe on GPU 0) runs; with two or more, the tests check that the stripes live where the
// layout says (each chunk is mapped a second time through its own device and read there),
// that one GPU reads what another wrote, that read-only access holds on a remote GPU, and
// that a growable buffer spills from one GPU onto the next and rolls back when both are full.
// Multi-GPU tests skip with the reason where there are fewer than two GPUs.
//
// vmm never enables peer access (cuCtxEnablePeerAccess is not among its driver entry
// points): every cross-GPU read and write below works through cuMemSetAccess alone.

#include "peer_access.hpp"
#include "vmm/striped_buffer.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "memory_io.hpp"
#include "vmm/address_range.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/mapping.hpp"

namespace vmm::testing {
namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

// ---- arguments ------------------------------------------------------------------------

// What the message of the exception `fn` throws says (fails the test if it throws none).
template <class Exception, class Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const Exception& error) {
    return error.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return {};
}

TEST(striped_buffer_arguments, bad_arguments_are_refused_before_any_driver_call) {
  // These hold with or without a driver: nothing here may reach it.
  EXPECT_THROW(striped_buffer({}, 8 * mib), invalid_argument);
  EXPECT_THROW(striped_buffer({0, -1}, 8 * mib), invalid_argument);
  EXPECT_THROW(striped_buffer({0, 1}, 0), invalid_argument);
  EXPECT_NE(message_of<invalid_argument>([] {
              striped_buffer({0, 1, 0}, 8 * mib);
            }).find("gpu 0 is named twice"),
            std::string::npos);
  EXPECT_THROW(striped_buffer({0, 1}, 8 * mib, {.mode = static_cast<stripe_mode>(9)}), invalid_argument);
  EXPECT_THROW(striped_buffer({0, 1}, 8 * mib,
                              {.access = {{accessor::device(0), access_mode::read_write},
                                          {accessor::device(0), access_mode::read_only}}}),
               invalid_argument);
  EXPECT_THROW(striped_buffer({0, 1}, 8 * mib, {.access = {{accessor::device(-3), access_mode::read_write}}}),
               invalid_argument);
  EXPECT_THROW(
      striped_buffer({0, 1}, 8 * mib, {.access = {{accessor::device(1), static_cast<access_mode>(17)}}}),
      invalid_argument);
  EXPECT_THROW(striped_buffer({0, 1}, 8 * mib, {.streams = {{-1, nullptr}}}), invalid_argument);
  // Pools: one per device or none, never null, each of its own device's memory. OS memory
  // makes a real pool without any driver.
  const auto os_pool = chunk_pool::create(provider_for(location::os_host()));
  EXPECT_THROW(striped_buffer({0, 1}, 8 * mib, {.pools = {os_pool}}), invalid_argument);
  EXPECT_THROW(striped_buffer({0, 1}, 8 * mib, {.pools = {nullptr, nullptr}}), invalid_argument);
  EXPECT_NE(message_of<invalid_argument>([&] {
              striped_buffer({0}, 8 * mib, {.pools = {os_pool}});
            }).find("the pool for gpu 0 holds os host memory"),
            std::string::npos);
  // Nothing was taken from the pool on the way.
  EXPECT_EQ(os_pool->statistics().reserved_current, 0u);
}

TEST(striped_buffer_arguments, arguments_that_need_the_driver_are_refused_by_it) {
  std::string why;
  if (!gpu_available(&why)) {
    // No driver or no GPU: the first question to it fails, and says so.
    EXPECT_THROW(striped_buffer({0, 1000}, 8 * mib), driver_unavailable) << why;
    EXPECT_THROW(striped_buffer({0}, 8 * mib, {.stripe_size = 3 * mib}), driver_unavailable) << why;
    return;
  }
  const int count = device_count();
  const std::string unknown = message_of<invalid_argument>([&] { striped_buffer({0, count}, 8 * mib); });
  EXPECT_NE(unknown.find(std::to_string(count)), std::string::npos) << unknown;
  const std::size_t g = provider_for(location::device(0))->capabilities().granularity;
  const std::string stripe =
      message_of<invalid_argument>([&] { striped_buffer({0}, 8 * g, {.stripe_size = g + g / 2}); });
  EXPECT_NE(stripe.find("not a multiple of gpu 0's allocation granularity"), std::string::npos) << stripe;
  EXPECT_THROW(striped_buffer({0}, 8 * g, {.access = {{accessor::device(count), access_mode::read_only}}}),
               invalid_argument);
  EXPECT_THROW(striped_buffer({0}, 8 * g, {.streams = {{count, nullptr}}}), invalid_argument);
}

TEST(striped_buffer_arguments, every_accessor_and_holder_pair_is_checked_for_peer_access) {
  // A stand-in for cuDeviceCanAccessPeer: gpu 2 cannot reach gpu 1's memory.
  static std::vector<std::pair<int, int>> asked;
  asked.clear();
  const auto can_access = [](int accessor, int holder) {
    asked.emplace_back(accessor, holder);
    return !(accessor == 2 && holder == 1);
  };
  const std::vector<int> holders = {0, 1, 2};
  const std::vector<access_grant> fine = {{accessor::device(0), access_mode::read_write},
                                          {accessor::device(1), access_mode::read_only}};
  EXPECT_NO_THROW(detail::require_peer_access(holders, fine, can_access));
  for (const auto& [accessor, holder] : asked)
    EXPECT_NE(accessor, holder) << "a device was asked about itself";
  EXPECT_EQ(asked.size(), 4u);
  // gpu 2 holds stripes but gets no access: nothing to check for it.
  const std::vector<access_grant> none = {{accessor::device(0), access_mode::read_write},
                                          {accessor::device(2), access_mode::none}};
  EXPECT_NO_THROW(detail::require_peer_access(holders, none, can_access));
  const std::vector<access_grant> blocked = {{accessor::device(0), access_mode::read_write},
                                             {accessor::device(2), access_mode::read_only}};
  const std::string message =
      message_of<invalid_argument>([&] { detail::require_peer_access(holders, blocked, can_access); });
  EXPECT_NE(message.find("gpu 2 cannot access the memory of gpu 1"), std::string::npos) << message;
  // An accessor that holds no stripes is checked against every holder too.
  const std::vector<int> one_holder = {1};
  EXPECT_THROW(detail::require_peer_access(one_holder, blocked, can_access), invalid_argument);
}

TEST(striped_buffer_peer_access, a_pair_without_peer_access_is_refused_before_anything_is_mapped) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "needs 2 GPUs; no GPU here: " << why;
  const int count = device_count();
  if (count < 2) GTEST_SKIP() << "needs 2 GPUs; this machine has " << count;
  for (int a = 0; a < count; ++a)
    for (int b = 0; b < count; ++b) {
      if (can_access_peer(a, b)) continue;
      auto pool_a = chunk_pool::create(provider_for(location::device(a)));
      auto pool_b = chunk_pool::create(provider_for(location::device(b)));
      const std::string message = message_of<invalid_argument>([&] {
        striped_buffer({b, a}, 8 * pool_a->granularity(), {.pools = {pool_b, pool_a}});
      });
      // Whichever direction is checked first, both devices are named.
      EXPECT_NE(message.find("cannot access the memory of gpu"), std::string::npos) << message;
      EXPECT_NE(message.find("gpu " + std::to_string(a)), std::string::npos) << message;
      EXPECT_NE(message.find("gpu " + std::to_string(b)), std::string::npos) << message;
      EXPECT_EQ(pool_a->statistics().chunks_created + pool_b->statistics().chunks_created, 0u);
      return;
    }
  GTEST_SKIP() << "every pair of the " << count << " GPUs has peer access: nothing to refuse here";
}

// ---- one GPU: every stripe on GPU 0 -------------------------------------------------------

class one_gpu_striped : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "no GPU here: " << why;
    provider_ = provider_for(location::device(0));
    granularity_ = provider_->capabilities().granularity;
  }
  std::shared_ptr<memory_provider> provider_;
  std::size_t granularity_ = 0;
};

TEST_F(one_gpu_striped, a_single_device_holds_every_stripe_and_the_bytes_round_trip) {
  const std::size_t g = granularity_;
  auto pool = chunk_pool::create(provider_);
  {
    striped_buffer buffer({0}, 5 * g + 1, {.stripe_size = 2 * g, .pools = {pool}});
    EXPECT_EQ(buffer.size(), 6 * g);  // rounded up to the granularity
    EXPECT_EQ(buffer.layout().stripe_count(), 3u);
    EXPECT_EQ(buffer.chunks().size(), 3u);
    EXPECT_EQ(buffer.device_of(6 * g - 1), 0);
    EXPECT_THROW((void)buffer.device_of(6 * g), invalid_argument);
    EXPECT_EQ(buffer.device_index(0), 0u);
    EXPECT_THROW((void)buffer.device_index(1), invalid_argument);
    EXPECT_EQ(pool->statistics().used_current, 6 * g);
    const auto bytes = pattern(6 * g, 3);
    write_bytes(*provider_, buffer.address(), bytes);  // one copy over three chunks of one device
    EXPECT_EQ(read_bytes(*provider_, buffer.address(), 6 * g), bytes);

    striped_buffer moved = std::move(buffer);
    EXPECT_EQ(buffer.data(), nullptr);  // NOLINT(bugprone-use-after-move): the contract under test
    EXPECT_EQ(read_bytes(*provider_, moved.address(), 6 * g), bytes);
    striped_buffer other({0}, g, {.mode = stripe_mode::contiguous, .pools = {pool}});
    EXPECT_EQ(other.chunks().size(), 1u);
    other = std::move(moved);  // the old one is unmapped and given back
    EXPECT_EQ(pool->statistics().used_current, 6 * g);
    EXPECT_EQ(read_bytes(*provider_, other.address(), 6 * g), bytes);
  }
  EXPECT_EQ(pool->statistics().used_current, 0u);
}

TEST_F(one_gpu_striped, running_out_of_memory_half_way_leaves_nothing_behind) {
  const std::size_t g = granularity_;
  auto pool = chunk_pool::create(provider_, {.cap = 3 * g});
  const std::string message =
      message_of<out_of_memory>([&] { striped_buffer({0}, 5 * g, {.pools = {pool}}); });
  EXPECT_NE(message.find("on gpu 0"), std::string::npos) << message;
  EXPECT_EQ(pool->statistics().used_current, 0u);         // the three stripes mapped were given back
  EXPECT_EQ(pool->statistics().reserved_current, 3 * g);  // idle in the pool now
  striped_buffer fits({0}, 3 * g, {.pools = {pool}});     // and they serve the next buffer
  EXPECT_EQ(pool->statistics().chunks_created, 3u);
}

// ---- two or more GPUs -------------------------------------------------------------------

class multi_gpu_striped : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "needs 2 GPUs; no GPU here: " << why;
    const int count = device_count();
    if (count < 2) GTEST_SKIP() << "needs 2 GPUs; this machine has " << count;
    for (int d = 0; d < count; ++d) {
      devices_.push_back(d);
      providers_.push_back(provider_for(location::device(d)));
      granularity_ = std::max(granularity_, providers_.back()->capabilities().granularity);
    }
    for (int a = 0; a < count; ++a)
      for (int b = 0; b < count; ++b)
        if (!can_access_peer(a, b)) GTEST_SKIP() << "gpu " << a << " cannot access gpu " << b << "'s memory";
  }
  // A pool of its own per device, so that the statistics count this test's chunks only.
  std::vector<std::shared_ptr<chunk_pool>> fresh_pools() const {
    std::vector<std::shared_ptr<chunk_pool>> pools;
    for (const auto& provider : providers_) pools.push_back(chunk_pool::create(provider));
    return pools;
  }
  // The bytes of `memory`, read through a second mapping of it that only its own device
  // may read: proof of where they physically are.
  std::vector<std::uint8_t> read_on_its_own_device(const pooled_chunk& chunk) const {
    const std::shared_ptr<memory_provider>& owner = chunk.memory().provider();
    address_range range(owner, chunk.size());
    const access_grant only_owner[] = {
        {accessor::device(owner->capabilities().where.id), access_mode::read_only}};
    mapping second(chunk.memory(), range.address(), only_owner);
    return read_bytes(*owner, second.address(), chunk.size());
  }

  std::vector<int> devices_;
  std::vector<std::shared_ptr<memory_provider>> providers_;
  std::size_t granularity_ = 0;
};

TEST_F(multi_gpu_striped, ownership_agrees_with_where_the_bytes_live) {
  const std::size_t g = granularity_;
  const std::size_t n = devices_.size();
  for (stripe_mode mode : {stripe_mode::round_robin, stripe_mode::contiguous}) {
    SCOPED_TRACE(mode == stripe_mode::round_robin ? "round_robin" : "contiguous");
    const auto pools = fresh_pools();
    // Not a multiple of stripe x devices: the last stripe is short.
    const std::size_t size = (2 * n + 1) * 2 * g + g;
    striped_buffer buffer(devices_, size, {.stripe_size = 2 * g, .mode = mode, .pools = pools});
    ASSERT_EQ(buffer.size(), size);
    const stripe_layout& layout = buffer.layout();
    ASSERT_EQ(buffer.chunks().size(), layout.stripe_count());
    // Written through the one pointer, a stripe at a time, each by the GPU that holds it
    // (copies from another GPU are the next test's business).
    const auto bytes = pattern(size, 17);
    std::size_t offset = 0;
    for (const shared_chunk& chunk : buffer.chunks()) {
      write_bytes(*providers_[static_cast<std::size_t>(buffer.device_of(offset))], buffer.address() + offset,
                  {bytes.begin() + static_cast<std::ptrdiff_t>(offset),
                   bytes.begin() + static_cast<std::ptrdiff_t>(offset + chunk->size())});
      offset += chunk->size();
    }
    ASSERT_EQ(offset, size);
    // Each chunk: created on the device the layout names, holding that stripe's bytes.
    offset = 0;
    for (const shared_chunk& chunk : buffer.chunks()) {
      const int owner = buffer.device_of(offset);
      const stripe_position stripe = layout.locate(offset);
      EXPECT_EQ(stripe.extent.offset, offset);
      EXPECT_EQ(stripe.extent.length, chunk->size());
      EXPECT_EQ(chunk->memory().provider()->capabilities().where, location::device(owner))
          << "stripe at " << offset;
      EXPECT_EQ(buffer.device_of(offset + chunk->size() - 1), owner);
      EXPECT_EQ(
          read_on_its_own_device(*chunk),
          std::vector<std::uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(offset),
                                    bytes.begin() + static_cast<std::ptrdiff_t>(offset + chunk->size())))
          << "stripe at " << offset << " on gpu " << owner;
      offset += chunk->size();
    }
    for (std::size_t d = 0; d < n; ++d)
      EXPECT_EQ(pools[d]->statistics().used_current, layout.bytes_on(static_cast<std::uint32_t>(d)))
          << "gpu " << d;
  }
}

TEST_F(multi_gpu_striped, contents_written_from_one_gpu_are_read_from_another) {
  const std::size_t g = granularity_;
  const std::size_t n = devices_.size();
  striped_buffer buffer(devices_, 3 * n * g, {.stripe_size = g});
  // GPU 1 writes every stripe (its own and the others'), one value per stripe...
  for (std::size_t k = 0; k < 3 * n; ++k)
    providers_[1]->executor().fill(static_cast<char*>(buffer.data()) + k * g,
                                   static_cast<std::uint8_t>(k + 1), g, {});
  providers_[1]->executor().synchronize({});
  // ...and GPU 0 reads each of them back.
  for (std::size_t k = 0; k < 3 * n; ++k)
    EXPECT_EQ(read_bytes(*providers_[0], buffer.address() + k * g, g),
              std::vector<std::uint8_t>(g, static_cast<std::uint8_t>(k + 1)))
        << "stripe " << k << " on gpu " << buffer.device_of(k * g);
}

TEST_F(multi_gpu_striped, a_gpu_holding_no_stripes_can_be_given_access) {
  // Stripes on GPU 0 only; GPU 1 may read them.
  const std::size_t g = granularity_;
  striped_buffer buffer({0}, 4 * g,
                        {.access = {{accessor::device(0), access_mode::read_write},
                                    {accessor::device(1), access_mode::read_only}}});
  const auto bytes = pattern(g, 23);
  write_bytes(*providers_[0], buffer.address() + g, bytes);
  EXPECT_EQ(read_bytes(*providers_[1], buffer.address() + g, g), bytes);
  EXPECT_EQ(buffer.access().size(), 2u);
  EXPECT_THROW((void)buffer.device_index(1), invalid_argument);
}

// In a child: GPU 1, given `mode`, writes into a stripe held by GPU 0. 0 when the write
// went through; nonzero when it failed (a GPU fault leaves the context unusable, hence the
// child). Reads by GPU 1 must work in both modes.
int remote_write_in_child(access_mode mode) {
  try {
    const std::size_t g = provider_for(location::device(0))->capabilities().granularity;
    const auto gpu0_provider = provider_for(location::device(0));
    const auto gpu1_provider = provider_for(location::device(1));
    memory_provider& gpu0 = *gpu0_provider;
    memory_provider& gpu1 = *gpu1_provider;
    striped_buffer buffer(
        {0, 1}, 4 * g,
        {.stripe_size = g,
         .access = {{accessor::device(0), access_mode::read_write}, {accessor::device(1), mode}}});
    if (buffer.device_of(2 * g) != 0) return 7;
    const auto bytes = pattern(g, 29);
    write_bytes(gpu0, buffer.address() + 2 * g, bytes);
    if (read_bytes(gpu1, buffer.address() + 2 * g, g) != bytes) return 5;  // GPU 1 reads
    try {
      gpu1.executor().fill(static_cast<char*>(buffer.data()) + 2 * g, 0xab, g, {});
      gpu1.executor().synchronize({});
    } catch (const std::exception&) {
      return 3;  // the write faulted
    }
    return read_bytes(gpu0, buffer.address() + 2 * g, g) == std::vector<std::uint8_t>(g, 0xab) ? 0 : 6;
  } catch (const std::exception&) {
    return 8;
  }
}

TEST_F(multi_gpu_striped, read_only_access_is_enforced_on_a_remote_gpu) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto failed = [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); };
  // The control: with read-write access the same write goes through.
  EXPECT_EXIT(std::_Exit(remote_write_in_child(access_mode::read_write)), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(std::_Exit(remote_write_in_child(access_mode::read_only)), failed, "");
}

// ---- growable_buffer spilling across GPUs -------------------------------------------------

TEST_F(multi_gpu_striped, a_growable_buffer_spills_from_a_full_gpu_onto_the_next) {
  // GPU 0's pool capped at 4 chunks, as if the GPU held no more; then GPU 1's default pool.
  const std::size_t g = granularity_;
  auto first = chunk_pool::create(providers_[0], {.cap = 4 * g});
  auto second = default_pool(location::device(1));
  const std::size_t second_used = second->statistics().used_current;
  growable_buffer buffer(first, {.max_size = 32 * g, .policy = chunk_policy::fixed(g), .spill_to = {second}});
  buffer.resize(3 * g);
  void* const address = buffer.data();
  buffer.resize(10 * g);
  EXPECT_EQ(buffer.data(), address);
  EXPECT_EQ(first->statistics().used_current, 4 * g);
  EXPECT_EQ(second->statistics().used_current - second_used, 6 * g);
  // Chunk by chunk: the first four on GPU 0, the rest on GPU 1, each holding what was
  // written through the one pointer.
  const auto bytes = pattern(10 * g, 31);
  write_bytes(*providers_[0], reinterpret_cast<std::uintptr_t>(buffer.data()),
              {bytes.begin(), bytes.begin() + 4 * g});
  write_bytes(*providers_[1], reinterpret_cast<std::uintptr_t>(buffer.data()) + 4 * g,
              {bytes.begin() + 4 * g, bytes.end()});
  const std::vector<shared_chunk> chunks = buffer.chunks(0, 10 * g);
  ASSERT_EQ(chunks.size(), 10u);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i]->memory().provider()->capabilities().where, location::device(i < 4 ? 0 : 1))
        << "chunk " << i;
    EXPECT_EQ(read_on_its_own_device(*chunks[i]),
              std::vector<std::uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(i * g),
                                        bytes.begin() + static_cast<std::ptrdiff_t>((i + 1) * g)))
        << "chunk " << i;
  }
  // Both GPUs may read all of it (the default grants cover every pool's device).
  EXPECT_EQ(read_bytes(*providers_[1], reinterpret_cast<std::uintptr_t>(buffer.data()), 4 * g),
            std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + 4 * g));
  EXPECT_EQ(read_bytes(*providers_[0], reinterpret_cast<std::uintptr_t>(buffer.data()) + 4 * g, 6 * g),
            std::vector<std::uint8_t>(bytes.begin() + 4 * g, bytes.end()));
}

TEST_F(multi_gpu_striped, a_spilling_buffer_rolls_back_when_every_gpu_is_full) {
  // Geometric chunks (the default policy): the grow halves its chunk size as GPU 0 runs
  // out, spills onto GPU 1, and fails cleanly once GPU 1 is out too.
  const std::size_t g = granularity_;
  auto first = chunk_pool::create(providers_[0], {.cap = 3 * g});
  auto second = chunk_pool::create(providers_[1], {.cap = 5 * g});
  growable_buffer buffer(first, {.max_size = 64 * g, .spill_to = {second}});
  buffer.resize(2 * g);
  buffer.resize(7 * g);
  EXPECT_EQ(first->statistics().used_current, 3 * g);
  EXPECT_EQ(second->statistics().used_current, buffer.capacity() - 3 * g);
  const auto bytes = pattern(buffer.capacity(), 37);
  std::size_t offset = 0;
  for (const shared_chunk& chunk : buffer.chunks(0, buffer.capacity())) {  // a chunk at a time, by its GPU
    write_bytes(*chunk->memory().provider(), reinterpret_cast<std::uintptr_t>(buffer.data()) + offset,
                {bytes.begin() + static_cast<std::ptrdiff_t>(offset),
                 bytes.begin() + static_cast<std::ptrdiff_t>(offset + chunk->size())});
    offset += chunk->size();
  }
  const std::size_t size = buffer.size();
  const std::size_t capacity = buffer.capacity();
  const std::size_t chunk_count = buffer.chunk_count();
  void* const address = buffer.data();
  const pool_statistics first_before = first->statistics();
  const pool_statistics second_before = second->statistics();

  EXPECT_THROW(buffer.resize(9 * g), out_of_memory);  // 8 chunks is all there is
  EXPECT_EQ(buffer.data(), address);
  EXPECT_EQ(buffer.size(), size);
  EXPECT_EQ(buffer.capacity(), capacity);
  EXPECT_EQ(buffer.chunk_count(), chunk_count);
  EXPECT_EQ(first->statistics().used_current, first_before.used_current);
  EXPECT_EQ(second->statistics().used_current, second_before.used_current);
  offset = 0;
  for (const shared_chunk& chunk : buffer.chunks(0, buffer.capacity())) {
    EXPECT_EQ(read_on_its_own_device(*chunk),
              std::vector<std::uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(offset),
                                        bytes.begin() + static_cast<std::ptrdiff_t>(offset + chunk->size())))
        << "chunk at " << offset;
    offset += chunk->size();
  }
  buffer.resize(8 * g);  // exactly both caps: works
  EXPECT_EQ(first->statistics().used_current + second->statistics().used_current, 8 * g);
}

}  // namespace
}  // namespace vmm::testing
