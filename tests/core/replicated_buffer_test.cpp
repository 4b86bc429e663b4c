// replicated_buffer: the broadcast plan over made-up peer matrices, bad input refused before
// anything is written, updates, growth, the device view's table, the write-back owner, the
// hardware's read-only protection, and fault sweeps over growth and updates.
//
// The typed suite runs on OS host memory everywhere: three replicas, one per OS provider of
// its own location id (os_host_options::id), so every algorithm runs without a GPU. Its GPU
// instantiation puts one replica on every GPU there is and skips without one (kernels that
// read the replicas are in tests/cuda/replicated_test.cu).

#include "vmm/replicated_buffer.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "broadcast_plan.hpp"  // vmm/src: the plan over a stand-in peer matrix
#include "fault_sweep.hpp"
#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/error.hpp"

namespace vmm::testing {
namespace {

constexpr std::size_t kib = 1024;

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

std::span<const std::byte> as_bytes(const std::vector<std::uint8_t>& bytes) {
  return std::as_bytes(std::span(bytes));
}

// ---- the broadcast plan ------------------------------------------------------------------

vmm::detail::push_matrix all_connected(std::size_t n) {
  return vmm::detail::push_matrix(n, std::vector<bool>(n, true));
}

// Every replica but the root receives exactly once, from one that had the bytes by then.
void expect_a_tree(const std::vector<std::vector<replica_copy>>& rounds, std::size_t root,
                   const vmm::detail::push_matrix& can_push) {
  std::vector<bool> has(can_push.size(), false);
  has[root] = true;
  std::size_t copies = 0;
  for (const auto& round : rounds) {
    std::vector<bool> next = has;
    std::set<std::size_t> senders;
    for (const replica_copy& copy : round) {
      EXPECT_TRUE(has[copy.from]) << "replica " << copy.from << " sends before it has the bytes";
      EXPECT_FALSE(next[copy.to]) << "replica " << copy.to << " receives twice";
      EXPECT_TRUE(can_push[copy.from][copy.to]) << copy.from << " cannot push to " << copy.to;
      EXPECT_TRUE(senders.insert(copy.from).second) << "replica " << copy.from << " sends twice in a round";
      next[copy.to] = true;
      ++copies;
    }
    has = next;
  }
  EXPECT_EQ(copies, can_push.size() - 1) << "N replicas take N - 1 copies";
  EXPECT_TRUE(std::all_of(has.begin(), has.end(), [](bool b) { return b; }));
}

TEST(broadcast_plan, all_connected_replicas_take_log2_rounds_from_any_root) {
  for (const std::size_t n : {1u, 2u, 3u, 4u, 5u, 8u}) {
    const auto matrix = all_connected(n);
    for (std::size_t root = 0; root < n; ++root) {
      const auto rounds = vmm::detail::broadcast_rounds(root, matrix);
      std::size_t log2 = 0;
      while ((std::size_t{1} << log2) < n) ++log2;
      EXPECT_EQ(rounds.size(), log2) << n << " replicas from " << root;
      expect_a_tree(rounds, root, matrix);
    }
  }
}

TEST(broadcast_plan, a_chain_of_neighbours_is_followed_link_by_link) {
  // 0 - 1 - 2 - 3: each reaches only its neighbours.
  vmm::detail::push_matrix chain(4, std::vector<bool>(4, false));
  for (std::size_t i = 0; i < 4; ++i) {
    chain[i][i] = true;
    if (i > 0) chain[i][i - 1] = chain[i - 1][i] = true;
  }
  const auto rounds = vmm::detail::broadcast_rounds(0, chain);
  ASSERT_EQ(rounds.size(), 3u);
  expect_a_tree(rounds, 0, chain);
  const auto from_middle = vmm::detail::broadcast_rounds(1, chain);
  EXPECT_EQ(from_middle.size(), 2u) << "from 1: to 0 and 2, then 2 to 3";
  expect_a_tree(from_middle, 1, chain);
}

TEST(broadcast_plan, an_unreachable_replica_is_found_and_refused) {
  vmm::detail::push_matrix split = all_connected(3);
  split[0][2] = split[1][2] = false;  // nobody pushes into 2
  EXPECT_EQ(vmm::detail::unreachable_pair(split), (std::pair<std::size_t, std::size_t>{0, 2}));
  EXPECT_THROW((void)vmm::detail::broadcast_rounds(0, split), invalid_argument);
  EXPECT_EQ(vmm::detail::unreachable_pair(all_connected(3)), std::nullopt);
}

// ---- bad arguments that need no driver ------------------------------------------------------

TEST(replicated_buffer_arguments, bad_locations_are_refused_before_any_driver_call) {
  EXPECT_NE(
      message_of<invalid_argument>([] { replicated_buffer(std::vector<location>{}); }).find("no locations"),
      std::string::npos);
  EXPECT_NE(message_of<invalid_argument>([] {
              replicated_buffer({location::device(0), location::device(1), location::device(0)});
            }).find("gpu 0 is named twice"),
            std::string::npos);
  EXPECT_NE(message_of<invalid_argument>([] {
              replicated_buffer({location::os_host(), location::device(0)});
            }).find("cannot be reached from os host by peer copies"),
            std::string::npos);
  EXPECT_NE(message_of<invalid_argument>([] {
              replicated_buffer({location::pinned_host(0)});
            }).find("cannot hold a replica"),
            std::string::npos);
  EXPECT_THROW(replicated_buffer({location::device(-1)}), invalid_argument);
  EXPECT_NE(message_of<invalid_argument>([] {
              replicated_buffer({location::device(replica_table_size)});
            }).find("outside the view's table"),
            std::string::npos);
  EXPECT_NE(message_of<invalid_argument>([] {
              replicated_buffer({location::device(0)}, {.owner = location::device(1)});
            }).find("the owner gpu 1 holds no replica"),
            std::string::npos);
  EXPECT_THROW(replicated_buffer({location::device(0)}, {.policy = chunk_policy::fixed(0)}),
               invalid_argument);
}

TEST(replicated_buffer_arguments, pools_must_be_there_and_of_distinct_locations) {
  EXPECT_THROW(replicated_buffer(std::vector<std::shared_ptr<chunk_pool>>{nullptr}), invalid_argument);
  const auto provider = make_os_host_provider({.granularity = 4 * kib, .commit_budget = 16 << 20});
  // Two pools of one location: one replica per location.
  EXPECT_NE(message_of<invalid_argument>([&] {
              replicated_buffer({chunk_pool::create(provider), chunk_pool::create(provider)});
            }).find("os host is named twice"),
            std::string::npos);
  EXPECT_THROW((void)make_os_host_provider({.id = -1}), invalid_argument);
}

// ---- the typed suite ------------------------------------------------------------------------

// OS host memory: three replicas, one per provider of its own location id.
struct os_host_replicas {
  static constexpr const char* name = "os_host";
  static std::vector<std::shared_ptr<chunk_pool>> pools(std::string* /*skip_reason*/) {
    std::vector<std::shared_ptr<chunk_pool>> result;
    for (int id = 0; id < 3; ++id)
      result.push_back(chunk_pool::create(
          make_os_host_provider({.granularity = 4 * kib, .commit_budget = std::size_t{64} << 20, .id = id})));
    return result;
  }
};

// GPU memory: a replica on every GPU.
struct device_replicas {
  static constexpr const char* name = "device";
  static std::vector<std::shared_ptr<chunk_pool>> pools(std::string* skip_reason) {
    if (!gpu_available(skip_reason)) return {};
    std::vector<std::shared_ptr<chunk_pool>> result;
    for (int d = 0; d < device_count() && d < replica_table_size; ++d)
      result.push_back(default_pool(location::device(d)));
    return result;
  }
};

template <class Kind>
class replicated_buffers : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    pools_ = Kind::pools(&reason);
    if (pools_.empty()) GTEST_SKIP() << "no " << Kind::name << " memory here: " << reason;
    g_ = pools_.front()->granularity();
  }

  [[nodiscard]] std::vector<std::uint8_t> read(const replicated_buffer& buffer, location where,
                                               std::size_t offset, std::size_t n) const {
    memory_provider& provider = *pool_at(where)->provider();
    return read_bytes(provider, reinterpret_cast<std::uintptr_t>(buffer.data(where)) + offset, n);
  }
  [[nodiscard]] std::shared_ptr<chunk_pool> pool_at(location where) const {
    for (const auto& pool : pools_)
      if (pool->provider()->capabilities().where == where) return pool;
    ADD_FAILURE() << "no pool at " << to_string(where);
    return pools_.front();
  }
  // Every replica holds `bytes` at `offset`.
  void expect_everywhere(const replicated_buffer& buffer, std::size_t offset,
                         const std::vector<std::uint8_t>& bytes) {
    for (const location& where : buffer.locations())
      EXPECT_TRUE(read(buffer, where, offset, bytes.size()) == bytes)
          << "the replica on " << to_string(where);
  }
  // What every replica holds, and where, to compare before and after a failed call.
  struct state {
    std::size_t size = 0;
    std::vector<const void*> data;
    std::vector<std::vector<std::uint8_t>> bytes;
    friend bool operator==(const state&, const state&) = default;
  };
  state state_of(const replicated_buffer& buffer) const {
    state result{buffer.size(), {}, {}};
    for (const location& where : buffer.locations()) {
      result.data.push_back(buffer.data(where));
      result.bytes.push_back(read(buffer, where, 0, buffer.size()));
    }
    return result;
  }

  std::vector<std::shared_ptr<chunk_pool>> pools_;
  std::size_t g_ = 0;
};

struct replica_kind_names {
  template <class Kind>
  static std::string GetName(int) {
    return Kind::name;
  }
};
using replica_kinds = ::testing::Types<os_host_replicas, device_replicas>;
TYPED_TEST_SUITE(replicated_buffers, replica_kinds, replica_kind_names);

TYPED_TEST(replicated_buffers, an_update_from_host_memory_reaches_every_replica) {
  replicated_buffer buffer(this->pools_, {.max_size = 64 * this->g_});
  EXPECT_EQ(buffer.size(), 0u);
  buffer.resize(3 * this->g_ + 100);
  const auto bytes = pattern(3 * this->g_ + 100, 1);
  buffer.update(0, bytes.size(), update_source::host(as_bytes(bytes)));
  this->expect_everywhere(buffer, 0, bytes);
  const auto middle = pattern(this->g_, 2);
  buffer.update(this->g_ / 2, middle.size(), update_source::host(as_bytes(middle)));
  this->expect_everywhere(buffer, this->g_ / 2, middle);
  this->expect_everywhere(buffer, 0, std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + this->g_ / 2));
  buffer.enqueue_wait({});
  buffer.enqueue_wait(buffer.locations().back(), {});
  std::set<const void*> distinct;
  for (const location& where : buffer.locations()) distinct.insert(buffer.data(where));
  EXPECT_EQ(distinct.size(), buffer.locations().size()) << "every replica is memory of its own";
}

TYPED_TEST(replicated_buffers, an_update_from_one_replica_reaches_the_others) {
  replicated_buffer buffer(this->pools_, {.max_size = 16 * this->g_,
                                          .owner = this->pools_.back()->provider()->capabilities().where});
  buffer.resize(2 * this->g_);
  const auto bytes = pattern(2 * this->g_, 3);
  buffer.update(0, bytes.size(), update_source::host(as_bytes(bytes)));
  // The owner's GPU (the host, on the OS provider) writes its replica; publish() spreads it.
  const location owner = *buffer.owner();
  const auto replaced = pattern(this->g_, 4);
  write_bytes(*this->pool_at(owner)->provider(), reinterpret_cast<std::uintptr_t>(buffer.owner_data()),
              replaced);
  buffer.publish(0, this->g_);
  this->expect_everywhere(buffer, 0, replaced);
  this->expect_everywhere(buffer, this->g_, std::vector<std::uint8_t>(bytes.begin() + this->g_, bytes.end()));
  if (owner.kind == memory_kind::device) {
    buffer.update(this->g_, this->g_, update_source::device(owner.id, buffer.data(owner), this->g_));
    this->expect_everywhere(buffer, this->g_, replaced);
  }
}

TYPED_TEST(replicated_buffers, bad_updates_are_refused_and_write_nothing) {
  replicated_buffer buffer(this->pools_, {.max_size = 16 * this->g_});
  buffer.resize(this->g_);
  const auto bytes = pattern(this->g_, 5);
  buffer.update(0, bytes.size(), update_source::host(as_bytes(bytes)));
  const auto before = this->state_of(buffer);
  const auto source = update_source::host(as_bytes(bytes));
  EXPECT_NE(message_of<invalid_argument>([&] { buffer.update(1, this->g_, source); }).find("passes the size"),
            std::string::npos);
  EXPECT_THROW(buffer.update(this->g_ + 1, 0, source), invalid_argument);
  EXPECT_THROW(buffer.update(std::size_t{0} - 1, 2, source), invalid_argument);  // no wrap-around
  EXPECT_NE(message_of<invalid_argument>([&] {
              buffer.update(0, this->g_, update_source::host(as_bytes(bytes).first(10)));
            }).find("from a source of 10 bytes"),
            std::string::npos);
  EXPECT_THROW(buffer.update(0, 1, update_source{nullptr, 1, location::os_host()}), invalid_argument);
  EXPECT_NE(message_of<invalid_argument>([&] {
              buffer.update(0, 1, update_source::device(replica_table_size + 1, bytes.data(), 1));
            }).find("source"),
            std::string::npos);
  EXPECT_THROW(buffer.publish(0, 1), invalid_argument) << "no owner";
  EXPECT_THROW(buffer.append(update_source{nullptr, 10, location::os_host()}), invalid_argument);
  EXPECT_THROW((void)buffer.data(location::device(replica_table_size + 3)), invalid_argument);
  EXPECT_THROW((void)buffer.owner_data(), invalid_argument);
  EXPECT_TRUE(this->state_of(buffer) == before);
}

TYPED_TEST(replicated_buffers, growth_reaches_every_replica_and_keeps_every_address) {
  replicated_buffer buffer(this->pools_, {.max_size = 32 * this->g_});
  std::vector<const void*> addresses;
  std::vector<std::uint8_t> all;
  for (std::uint32_t step = 0; step < 6; ++step) {
    const auto part = pattern(step * this->g_ + 77, 10 + step);
    buffer.append(update_source::host(as_bytes(part)));
    all.insert(all.end(), part.begin(), part.end());
    if (addresses.empty())
      for (const location& where : buffer.locations()) addresses.push_back(buffer.data(where));
    for (std::size_t i = 0; i < addresses.size(); ++i)
      EXPECT_EQ(buffer.data(buffer.locations()[i]), addresses[i]) << "a replica moved at step " << step;
  }
  EXPECT_EQ(buffer.size(), all.size());
  EXPECT_GE(buffer.capacity(), buffer.size());
  this->expect_everywhere(buffer, 0, all);
  buffer.reserve(20 * this->g_);
  EXPECT_GE(buffer.capacity(), 20 * this->g_);
  EXPECT_EQ(buffer.size(), all.size());
  buffer.resize(this->g_);  // smaller: keeps the memory and the bytes
  EXPECT_GE(buffer.capacity(), 20 * this->g_);
  this->expect_everywhere(buffer, 0, std::vector<std::uint8_t>(all.begin(), all.begin() + this->g_));
}

TYPED_TEST(replicated_buffers, growth_past_max_size_is_refused_and_changes_nothing) {
  replicated_buffer buffer(this->pools_, {.max_size = 4 * this->g_});
  EXPECT_EQ(buffer.max_size(), 4 * this->g_);
  const auto bytes = pattern(3 * this->g_, 6);
  buffer.append(update_source::host(as_bytes(bytes)));
  const auto before = this->state_of(buffer);
  EXPECT_NE(message_of<out_of_memory>([&] { buffer.resize(4 * this->g_ + 1); }).find("max_size"),
            std::string::npos);
  EXPECT_THROW(buffer.reserve(5 * this->g_), out_of_memory);
  EXPECT_THROW(buffer.append(update_source::host(as_bytes(bytes))), out_of_memory);
  EXPECT_TRUE(this->state_of(buffer) == before);
}

TYPED_TEST(replicated_buffers, a_moved_from_buffer_holds_nothing_and_refuses_work) {
  replicated_buffer buffer(this->pools_, {.max_size = 4 * this->g_});
  const auto bytes = pattern(100, 8);
  buffer.append(update_source::host(as_bytes(bytes)));
  const void* first = buffer.data(buffer.locations().front());
  replicated_buffer moved(std::move(buffer));
  EXPECT_EQ(moved.data(moved.locations().front()), first);
  this->expect_everywhere(moved, 0, bytes);
  EXPECT_EQ(buffer.size(), 0u);             // NOLINT(bugprone-use-after-move): what is left
  EXPECT_TRUE(buffer.locations().empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(buffer.capacity(), 0u);         // NOLINT(bugprone-use-after-move)
  EXPECT_THROW(buffer.update(0, 0, update_source::host(as_bytes(bytes))), invalid_argument);
  EXPECT_THROW(buffer.resize(1), invalid_argument);
  buffer = std::move(moved);
  EXPECT_EQ(buffer.size(), 100u);
  this->expect_everywhere(buffer, 0, bytes);
}

TYPED_TEST(replicated_buffers, the_view_holds_every_replica_by_location_id) {
  replicated_buffer buffer(this->pools_, {.max_size = 4 * this->g_});
  buffer.resize(64);
  static_assert(std::is_trivially_copyable_v<replica_view<float>>);
  const replica_view<float> view = buffer.view<float>();
  EXPECT_EQ(view.size(), 16u);
  EXPECT_EQ(view.current(), -1);
  for (const location& where : buffer.locations()) {
    EXPECT_EQ(view.on(where.id).data(), buffer.data(where));
    EXPECT_EQ(view.data(where.id), buffer.data(where));
  }
  EXPECT_EQ(view.data(-1), nullptr);
  EXPECT_EQ(view.data(replica_table_size), nullptr);
  EXPECT_EQ(view.data(), nullptr) << "no GPU chosen";
}

TYPED_TEST(replicated_buffers, the_plan_starts_at_the_root_and_reaches_everyone) {
  replicated_buffer buffer(this->pools_, {.max_size = 4 * this->g_});
  for (const location& root : buffer.locations()) {
    const auto rounds = buffer.broadcast_plan(root);
    std::size_t copies = 0;
    for (const auto& round : rounds) copies += round.size();
    EXPECT_EQ(copies, buffer.locations().size() - 1);
  }
}

TYPED_TEST(replicated_buffers, a_replicated_vector_counts_elements) {
  replicated_vector<std::uint32_t> vector(this->pools_, {.max_size = 4 * this->g_});
  std::vector<std::uint32_t> values(1000);
  for (std::uint32_t i = 0; i < values.size(); ++i) values[i] = i * 7;
  vector.append(values);
  EXPECT_EQ(vector.size(), 1000u);
  const std::uint32_t changed[] = {1, 2, 3};
  vector.update(10, changed);
  std::copy(std::begin(changed), std::end(changed), values.begin() + 10);
  std::vector<std::uint8_t> expected(values.size() * sizeof(std::uint32_t));
  std::memcpy(expected.data(), values.data(), expected.size());
  this->expect_everywhere(vector.bytes(), 0, expected);
  EXPECT_THROW(vector.update(999, changed), invalid_argument);
  EXPECT_THROW(vector.resize(4 * this->g_), out_of_memory);
  EXPECT_EQ(vector.view().size(), 1000u);
}

// ---- growth that one replica cannot follow ---------------------------------------------------

TEST(replicated_buffer_growth, a_replica_that_cannot_grow_undoes_the_growth_of_the_replicas_before_it) {
  const std::size_t g = 4 * kib;
  std::vector<std::shared_ptr<chunk_pool>> pools;
  for (int id = 0; id < 3; ++id)
    pools.push_back(chunk_pool::create(
        make_os_host_provider({.granularity = g, .commit_budget = std::size_t{64} << 20, .id = id}),
        {.cap = id == 2 ? 4 * g : std::numeric_limits<std::size_t>::max()}));  // the last one is small
  replicated_buffer buffer(pools, {.max_size = 64 * g, .policy = chunk_policy::fixed(g)});
  const auto bytes = pattern(3 * g, 7);
  buffer.append(update_source::host(as_bytes(bytes)));
  std::vector<std::size_t> used;
  for (const auto& pool : pools) used.push_back(pool->statistics().used_current);
  const std::size_t capacity = buffer.capacity();
  EXPECT_THROW(buffer.append(update_source::host(as_bytes(bytes))), out_of_memory);
  EXPECT_THROW(buffer.reserve(8 * g), out_of_memory);
  EXPECT_EQ(buffer.size(), 3 * g);
  EXPECT_EQ(buffer.capacity(), capacity);
  for (std::size_t i = 0; i < pools.size(); ++i)
    EXPECT_EQ(pools[i]->statistics().used_current, used[i])
        << "replica " << i << " kept the memory it grew by";
  for (const location& where : buffer.locations()) {
    const auto* p = static_cast<const std::uint8_t*>(buffer.data(where));
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), p)) << to_string(where);
  }
  buffer.append(update_source::host(as_bytes(bytes).first(g)));  // what still fits, fits
  EXPECT_EQ(buffer.size(), 4 * g);
}

// ---- the read-only replica, on the OS provider ---------------------------------------------

// In a child: writes one byte into a replica through data(). 0 when the write went through.
int write_replica_in_child(bool owner) {
  auto pools = os_host_replicas::pools(nullptr);
  replicated_buffer buffer(pools,
                           {.max_size = std::size_t{1} << 20, .owner = location{memory_kind::os_host, 1}});
  buffer.resize(100);
  const location target{memory_kind::os_host, owner ? 1 : 2};
  volatile auto* p = static_cast<volatile std::uint8_t*>(const_cast<void*>(buffer.data(target)));
  *p = 1;  // faults on a read-only replica
  return *p == 1 ? 0 : 5;
}

TEST(replicated_buffer_protection, a_write_into_a_read_only_replica_faults_and_the_owner_is_writable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The fault ends the child by SIGSEGV, or, under AddressSanitizer, which catches the signal,
  // by exit status 1: anything but a clean exit.
  const auto failed = [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); };
  EXPECT_EXIT(std::_Exit(write_replica_in_child(true)), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(std::_Exit(write_replica_in_child(false)), failed, "");
}

// ---- fault sweeps over growth and updates, on the OS provider --------------------------------

constexpr unsigned growth_errors = fails_out_of_memory | fails_os_error;

// Three replicas: the sweep's pool and two more OS providers of their own ids.
class replicated_path : public sweep_path {
 public:
  explicit replicated_path(const sweep_context& context)
      : g_(context.granularity()),
        buffer_(pools(context), {.max_size = 64 * g_, .policy = chunk_policy::geometric()}) {
    const auto first = pattern(g_ / 2, 1);
    buffer_.append(update_source::host(std::as_bytes(std::span(first))));
    expected_ = first;
  }

  void operator()() {
    for (std::uint32_t step = 0; step < 4; ++step) {
      const auto part = pattern((step + 1) * g_ + 3, 20 + step);
      before_ = state_of();
      during("replicated_buffer::append", growth_errors);
      buffer_.append(update_source::host(std::as_bytes(std::span(part))));
      expected_.insert(expected_.end(), part.begin(), part.end());
    }
    before_ = state_of();
    during("replicated_buffer::reserve", growth_errors);
    buffer_.reserve(40 * g_);
    before_ = state_of();
    during("replicated_buffer::resize", growth_errors);
    buffer_.resize(45 * g_);
    expected_.resize(45 * g_);
    const auto patch = pattern(3 * g_, 40);
    before_ = state_of();
    during("replicated_buffer::update", growth_errors);
    buffer_.update(40 * g_, patch.size(), update_source::host(std::as_bytes(std::span(patch))));
    std::copy(patch.begin(), patch.end(), expected_.begin() + static_cast<std::ptrdiff_t>(40 * g_));
  }

  void check(const outcome& result) {
    if (!result.succeeded()) {
      const state now = state_of();
      EXPECT_EQ(now.size, before_.size) << call() << " failed and changed size()";
      EXPECT_EQ(now.capacity, before_.capacity) << call() << " failed and changed capacity()";
      EXPECT_TRUE(now.data == before_.data) << call() << " failed and moved a replica";
      EXPECT_TRUE(now.bytes == before_.bytes) << call() << " failed and changed a replica's bytes";
      return;
    }
    EXPECT_EQ(buffer_.size(), 45 * g_);
    // The bytes appended and updated are everywhere (those resize added are not written).
    for (const location& where : buffer_.locations()) {
      const auto* p = static_cast<const std::uint8_t*>(buffer_.data(where));
      EXPECT_TRUE(std::equal(p, p + 15 * g_ / 2, expected_.begin())) << to_string(where);
      EXPECT_TRUE(
          std::equal(p + 40 * g_, p + 43 * g_, expected_.begin() + static_cast<std::ptrdiff_t>(40 * g_)))
          << to_string(where);
    }
  }

 private:
  struct state {
    std::size_t size = 0;
    std::size_t capacity = 0;
    std::vector<const void*> data;
    std::vector<std::vector<std::uint8_t>> bytes;
  };
  static std::vector<std::shared_ptr<chunk_pool>> pools(const sweep_context& context) {
    std::vector<std::shared_ptr<chunk_pool>> result{context.pool};
    for (int id = 1; id <= 2; ++id)
      result.push_back(chunk_pool::create(make_os_host_provider(
          {.granularity = context.granularity(), .commit_budget = std::size_t{64} << 20, .id = id})));
    return result;
  }
  [[nodiscard]] state state_of() const {
    state result{buffer_.size(), buffer_.capacity(), {}, {}};
    for (const location& where : buffer_.locations()) {
      const auto* p = static_cast<const std::uint8_t*>(buffer_.data(where));
      result.data.push_back(p);
      result.bytes.emplace_back(p, p + buffer_.size());  // host memory: read directly
    }
    return result;
  }

  std::size_t g_;
  replicated_buffer buffer_;
  std::vector<std::uint8_t> expected_;
  state before_;
};

TEST(replicated_buffer_fault_sweep, growth_and_updates_leave_every_replica_as_it_was) {
  const auto provider =
      make_os_host_provider({.granularity = 4 * kib, .commit_budget = std::size_t{256} << 20});
  const sweep_report report =
      sweep<replicated_path>("replicated", provider, fault::all_os, {ENOMEM, EINVAL, EINTR});
  EXPECT_GT(report.total_points(), 0u);
  EXPECT_GT(report.injected, 0u);
}

}  // namespace
}  // namespace vmm::testing
