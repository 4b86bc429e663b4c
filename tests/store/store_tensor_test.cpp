// vmm-store tensor sets (vmm/store/tensor_set.hpp, tensors.hpp): the table's codec and rules,
// and sets put and got by real processes: a vmm-store daemon (the tool, spawned per test),
// this process, and tests/helpers/store_peer.cpp. Typed over the kinds of memory that can be
// exported (the OS provider always; a GPU kind skips without a GPU).

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <future>
#include <set>
#include <string>
#include <vector>

#include "helpers/store_peer_protocol.hpp"
#include "memory_io.hpp"
#include "message_of.hpp"
#include "process_resources.hpp"
#include "provider_kinds.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/provider.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/tensor_set.hpp"
#include "vmm/store/tensors.hpp"

namespace vmm::testing {
namespace {

using store::dtype;
using store::status;
using store::tensor_info;

std::vector<tensor_info> three_tensors() {
  std::vector<tensor_info> table = {{.name = "embed.weight", .type = dtype::bf16, .shape = {4, 3}},
                                    {.name = "norm.weight", .type = dtype::f32, .shape = {5}},
                                    {.name = "step", .type = dtype::i64, .shape = {}}};
  (void)store::lay_out(table);
  return table;
}

TEST(tensor_table, lays_out_aligned_and_round_trips) {
  const std::vector<tensor_info> table = three_tensors();
  EXPECT_EQ(table[0].offset, 0u);
  EXPECT_EQ(table[0].bytes, 24u);
  EXPECT_EQ(table[1].offset, store::tensor_alignment);
  EXPECT_EQ(table[1].bytes, 20u);
  EXPECT_EQ(table[2].offset, 2 * store::tensor_alignment);
  EXPECT_EQ(table[2].bytes, 8u);
  EXPECT_EQ(store::decode_tensor_table(store::encode(table), 2 * store::tensor_alignment + 8), table);
  EXPECT_EQ(store::dtype_from_name("BF16"), dtype::bf16);
  EXPECT_EQ(store::dtype_from_name("bf16"), std::nullopt);
  EXPECT_STREQ(store::to_string(dtype::f8_e4m3), "F8_E4M3");
}

TEST(tensor_table, refuses_each_broken_rule_naming_it) {
  const std::uint64_t extent = 2 * store::tensor_alignment + 8;
  const auto refusal = [&](auto change) {
    std::vector<tensor_info> table = three_tensors();
    change(table);
    return message_of<ipc::protocol_error>(
        [&] { (void)store::decode_tensor_table(store::encode(table), extent); });
  };
  EXPECT_NE(refusal([](auto& t) { t[1].offset = 0; }).find("overlap"), std::string::npos);
  EXPECT_NE(refusal([](auto& t) { t[1].offset = 100; }).find("not a multiple of 256"), std::string::npos);
  EXPECT_NE(refusal([](auto& t) { t[2].offset = 3 * store::tensor_alignment; }).find("past the set"),
            std::string::npos);
  EXPECT_NE(refusal([](auto& t) { t[1].name = t[0].name; }).find("two tensors are named"), std::string::npos);
  EXPECT_NE(refusal([](auto& t) { t[1].name = "bad\xff"; }).find("name is invalid"), std::string::npos);
  EXPECT_NE(refusal([](auto& t) { t[0].bytes = 23; }).find("claims 23 bytes"), std::string::npos);
  EXPECT_NE(refusal([](auto& t) { t[0].shape = {UINT64_MAX, 3}; }).find("overflows"), std::string::npos);
  EXPECT_NE(refusal([](auto& t) { t.clear(); }).find("1 tensor at least"), std::string::npos);

  std::vector<std::byte> bytes = store::encode(three_tensors());
  std::vector<std::byte> unknown = bytes;
  unknown[4 + 2 + std::strlen("embed.weight")] = std::byte{0};  // the first tensor's dtype byte
  EXPECT_NE(message_of<ipc::protocol_error>([&] {
              (void)store::decode_tensor_table(unknown, extent);
            }).find("unknown dtype 0"),
            std::string::npos);
  bytes.push_back(std::byte{0});
  EXPECT_NE(message_of<ipc::protocol_error>([&] {
              (void)store::decode_tensor_table(bytes, extent);
            }).find("after the last field"),
            std::string::npos);
  bytes.resize(bytes.size() - 9);
  EXPECT_NE(message_of<ipc::protocol_error>([&] {
              (void)store::decode_tensor_table(bytes, extent);
            }).find("truncated"),
            std::string::npos);
}

TEST(tensor_table, a_per_tensor_layout_gives_large_tensors_whole_granules_and_packs_small_ones) {
  constexpr std::uint64_t g = 1024;
  std::vector<tensor_info> table;
  for (const char* name : {"a", "b", "c", "d"})
    table.push_back({.name = name, .type = dtype::u8, .shape = {300}});
  table.push_back({.name = "big", .type = dtype::u8, .shape = {2 * g + 1}});
  table.push_back({.name = "empty", .type = dtype::f32, .shape = {0}});
  table.push_back({.name = "last", .type = dtype::u8, .shape = {g}});
  const std::vector<std::uint64_t> ends = store::lay_out_per_tensor(table, g);
  // a and b share the first granule; c would cross its end, so c and d share the second;
  // big starts a granule and takes three; last is exactly one granule of its own.
  EXPECT_EQ(ends, (std::vector<std::uint64_t>{g, 2 * g, 5 * g, 6 * g}));
  EXPECT_EQ(table[0].offset, 0u);
  EXPECT_EQ(table[1].offset, 2 * store::tensor_alignment);
  EXPECT_EQ(table[2].offset, g);
  EXPECT_EQ(table[3].offset, g + 2 * store::tensor_alignment);
  EXPECT_EQ(table[4].offset, 2 * g);
  EXPECT_EQ(table[4].bytes, 2 * g + 1);
  EXPECT_EQ(table[6].offset, 5 * g);
  EXPECT_EQ(store::tensor_table_problem(table, ends.back()), std::nullopt);
  EXPECT_NE(message_of<invalid_argument>([&] {
              (void)store::lay_out_per_tensor(table, 100);
            }).find("multiple of 256"),
            std::string::npos);
}

template <class Kind>
class tensor_set_test : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->IsSkipped()) return;
    start_daemon({});
  }
  void start_daemon(const std::vector<std::string>& arguments) {
    daemon_.reset();
    daemon_ = std::make_unique<daemon_process>(directory_.path() + "/socket", arguments);
  }
  store::client connect() { return store::client({.socket_path = daemon_->socket()}); }
  child_process spawn(const std::vector<std::string>& args) const {
    std::vector<std::string> argv{VMM_STORE_PEER_PATH, daemon_->socket(), Kind::name};
    argv.insert(argv.end(), args.begin(), args.end());
    return child_process(argv);
  }
  // Three tensors of host memory, each filled with pattern(seed + i).
  std::vector<store::tensor_source> sources(std::uint32_t seed) {
    const std::vector<tensor_info> table = three_tensors();
    std::vector<store::tensor_source> made;
    for (std::size_t i = 0; i < table.size(); ++i) {
      bytes_.push_back(pattern(table[i].bytes, seed + static_cast<std::uint32_t>(i)));
      made.push_back({.name = table[i].name,
                      .type = table[i].type,
                      .shape = table[i].shape,
                      .data = bytes_.back().data()});
    }
    return made;
  }

  temporary_directory directory_;
  std::unique_ptr<daemon_process> daemon_;
  std::vector<std::vector<std::uint8_t>> bytes_;
};

using store_kinds = ::testing::Types<os_host_memory, device_memory>;
TYPED_TEST_SUITE(tensor_set_test, store_kinds, memory_kind_names);

TYPED_TEST(tensor_set_test, put_then_get_in_other_processes_read_only) {
  store::client store = this->connect();
  const auto sources = this->sources(7);
  store::tensor_set put = store::tensor_set::put(store, "model", sources, TypeParam::where());
  ASSERT_EQ(put.size(), 3u);
  EXPECT_EQ(put.memory().access(), access_mode::read_only);
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const store::tensor_view view = put[i];
    EXPECT_EQ(view.info->name, sources[i].name);
    EXPECT_EQ(view.info->type, sources[i].type);
    EXPECT_EQ(view.info->shape, sources[i].shape);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(view.data) % store::tensor_alignment, 0u);
    EXPECT_EQ(
        read_bytes(*put.memory().provider(), reinterpret_cast<std::uintptr_t>(view.data), view.info->bytes),
        this->bytes_[i]);
  }
  EXPECT_EQ(put.memory().chunk_count(), 1u);  // one physical handle: a first get imports one
  const store::buffer_info info = store.stat("model");
  EXPECT_TRUE(info.sealed);
  EXPECT_EQ(info.tensors, 3u);
  EXPECT_EQ(info.named_bytes, 24u + 20u + 8u);

  // Two more processes map it; neither may write.
  child_process first = this->spawn({"tensor", "model", "embed.weight"});
  child_process second = this->spawn({"tensor", "model", "step"});
  const store_report a = receive_store_report(first.socket());
  const store_report b = receive_store_report(second.socket());
  EXPECT_EQ(a.checksum, checksum(this->bytes_[0].data(), this->bytes_[0].size()));
  EXPECT_EQ(a.size, 24u);
  EXPECT_EQ(b.checksum, checksum(this->bytes_[2].data(), this->bytes_[2].size()));
  EXPECT_EQ(a.write_faulted, 1u);
  EXPECT_EQ(b.write_faulted, 1u);
  EXPECT_EQ(store.stat("model").holders, 3u);
  EXPECT_EQ(store.list().at(0).tensors, 3u);

  // A client killed while it holds the set drops its hold; the set lives on.
  ::kill(first.pid(), SIGKILL);
  (void)first.wait();
  second.close_socket();
  (void)second.wait();
  EXPECT_EQ(store.stat("model").holders, 1u);
  store::tensor_set again = store::tensor_set::get(store, "model");
  EXPECT_EQ(again[0].data, put[0].data);  // a repeated get in this process maps nothing new
}

// Where the chunks of `held` end, in bytes from its start.
std::set<std::uint64_t> chunk_ends(const store::buffer& held) {
  std::set<std::uint64_t> ends;
  std::uint64_t at = 0;
  for (const std::size_t size : held.chunk_sizes()) ends.insert(at += size);
  return ends;
}

TYPED_TEST(tensor_set_test, a_set_laid_out_per_tensor_gives_each_large_tensor_chunks_of_its_own) {
  store::client store = this->connect();
  const std::size_t g = provider_for(TypeParam::where())->capabilities().granularity;
  // A tensor of two granules and a half, two small ones, one of exactly a granule.
  const std::vector<tensor_info> shapes = {{.name = "big", .type = dtype::u8, .shape = {2 * g + g / 2}},
                                           {.name = "norm", .type = dtype::f32, .shape = {5}},
                                           {.name = "bias", .type = dtype::bf16, .shape = {7}},
                                           {.name = "granule", .type = dtype::u8, .shape = {g}}};
  std::vector<store::tensor_source> sources;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::uint64_t bytes = *store::tensor_bytes(shapes[i].type, shapes[i].shape);
    this->bytes_.push_back(pattern(bytes, 40 + static_cast<std::uint32_t>(i)));
    sources.push_back({.name = shapes[i].name,
                       .type = shapes[i].type,
                       .shape = shapes[i].shape,
                       .data = this->bytes_[i].data()});
  }
  // A former buffer's bytes in the pool: the set's padding must not show them.
  {
    store::buffer dirty = store.create("dirty", 8 * g, TypeParam::where());
    write_bytes(*dirty.provider(), reinterpret_cast<std::uintptr_t>(dirty.data()),
                std::vector<std::uint8_t>(8 * g, 0xab));
    dirty.release();
    store.remove("dirty");
  }
  store::tensor_set put = store::tensor_set::put(store, "model", sources, TypeParam::where(),
                                                 {.layout = store::set_layout::per_tensor});
  // big (3 granules), the small ones packed in one, granule, the table.
  EXPECT_EQ(put.memory().chunk_count(), 4u);
  const std::set<std::uint64_t> ends = chunk_ends(put.memory());
  for (const char* name : {"big", "granule"}) {
    const tensor_info& t = *put.at(name).info;
    EXPECT_EQ(t.offset % g, 0u) << name;
    EXPECT_TRUE(t.offset == 0 || ends.contains(t.offset)) << name << " starts inside a chunk";
    EXPECT_TRUE(ends.contains(t.offset + round_up(t.bytes, g))) << name << " ends inside a chunk";
    if (t.bytes > g) {
      EXPECT_FALSE(ends.contains(t.offset + g)) << name;  // one chunk, not one per granule
    }
  }
  EXPECT_EQ(put.at("norm").info->offset, 3 * g);
  EXPECT_EQ(put.at("bias").info->offset, 3 * g + store::tensor_alignment);

  // The bytes round-trip, in another process too; every byte between them is zero.
  const auto whole =
      read_bytes(*put.memory().provider(), reinterpret_cast<std::uintptr_t>(put.memory().data()),
                 put.memory().capacity());
  std::vector<bool> covered(whole.size(), false);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const tensor_info& t = *put[i].info;
    EXPECT_EQ(std::vector<std::uint8_t>(whole.begin() + static_cast<std::ptrdiff_t>(t.offset),
                                        whole.begin() + static_cast<std::ptrdiff_t>(t.offset + t.bytes)),
              this->bytes_[i])
        << t.name;
    std::fill(covered.begin() + static_cast<std::ptrdiff_t>(t.offset),
              covered.begin() + static_cast<std::ptrdiff_t>(t.offset + t.bytes), true);
  }
  const std::uint64_t table_at = *ends.rbegin() - g;  // the table's chunk, the last
  std::fill(covered.begin() + static_cast<std::ptrdiff_t>(table_at),
            covered.begin() + static_cast<std::ptrdiff_t>(put.memory().size()), true);
  std::size_t dirty = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) dirty += !covered[i] && whole[i] != 0 ? 1 : 0;
  EXPECT_EQ(dirty, 0u) << "padding bytes that are not zero";
  child_process peer = this->spawn({"tensor", "model", "big"});
  const store_report got = receive_store_report(peer.socket());
  EXPECT_EQ(got.checksum, checksum(this->bytes_[0].data(), this->bytes_[0].size()));
  EXPECT_EQ(got.write_faulted, 1u);
  peer.close_socket();
  (void)peer.wait();
  const store::buffer_info info = store.stat("model");
  EXPECT_EQ(info.tensors, 4u);
  EXPECT_EQ(info.capacity, 6 * g);
}

TYPED_TEST(tensor_set_test, refused_puts_leave_nothing_in_the_store) {
  store::client store = this->connect();
  auto sources = this->sources(1);
  sources[1].name = sources[0].name;
  EXPECT_NE(message_of<invalid_argument>([&] {
              (void)store::tensor_set::put(store, "model", sources, TypeParam::where());
            }).find("two tensors are named \"embed.weight\""),
            std::string::npos);
  sources = this->sources(1);
  sources[2].data = nullptr;
  EXPECT_NE(message_of<invalid_argument>([&] {
              (void)store::tensor_set::put(store, "model", sources, TypeParam::where());
            }).find("no data"),
            std::string::npos);

  // A table the daemon refuses: the creator wrote overlapping tensors by hand.
  std::vector<tensor_info> table = three_tensors();
  table[1].offset = 0;
  const std::vector<std::byte> encoded = store::encode(table);
  const std::uint64_t at = 3 * store::tensor_alignment;
  {
    store::buffer made = store.create("model", at + encoded.size(), TypeParam::where());
    write_bytes(
        *made.provider(), reinterpret_cast<std::uintptr_t>(made.data()) + at,
        std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(encoded.data()),
                                  reinterpret_cast<const std::uint8_t*>(encoded.data()) + encoded.size()));
    try {
      store.seal_set("model", at, encoded.size());
      ADD_FAILURE() << "an overlapping table was taken";
    } catch (const store::store_error& error) {
      EXPECT_TRUE(error.is(status::invalid));
      EXPECT_NE(std::string(error.what()).find("overlap"), std::string::npos) << error.what();
    }
    EXPECT_FALSE(store.stat("model").sealed);
    EXPECT_THROW(store.seal_set("model", at, encoded.size() + 1), store::store_error);  // past the buffer
    store.remove("model");
  }
  // A plain buffer has no table.
  {
    store::buffer plain = store.create("plain", 64, TypeParam::where());
    store.seal("plain");
    EXPECT_NE(message_of<store::store_error>([&] { (void)store.tensors(plain); }).find("plain buffer"),
              std::string::npos);
    plain.release();
    store.remove("plain");
  }
  EXPECT_TRUE(store.list().empty());
  const store::daemon_statistics s = store.statistics();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.bytes, 0u);
}

TYPED_TEST(tensor_set_test, a_put_past_the_cap_is_refused_naming_it) {
  this->start_daemon({"--cap", "1"});
  store::client store = this->connect();
  const auto sources = this->sources(3);
  try {
    (void)store::tensor_set::put(store, "model", sources, TypeParam::where());
    ADD_FAILURE() << "a put past the cap was taken";
  } catch (const store::store_error& error) {
    EXPECT_TRUE(error.is(status::cap_exceeded));
    EXPECT_NE(std::string(error.what()).find("--cap"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(store.list().empty());
  EXPECT_EQ(store.statistics().entries, 0u);
}

TYPED_TEST(tensor_set_test, a_killed_daemon_leaves_sets_mapped_and_a_restart_is_empty) {
  const auto sources = this->sources(11);
  store::tensor_set held;
  {
    store::client store = this->connect();
    held = store::tensor_set::put(store, "model", sources, TypeParam::where());
  }
  const void* address = held.at("norm.weight").data;
  ::kill(this->daemon_->process().pid(), SIGKILL);
  (void)this->daemon_->process().wait();
  // The mapping and the table live in this process: both stay, at the same address.
  EXPECT_EQ(held.at("norm.weight").data, address);
  EXPECT_EQ(read_bytes(*held.memory().provider(), reinterpret_cast<std::uintptr_t>(address), 20),
            this->bytes_[1]);
  this->start_daemon({});
  store::client store = this->connect();
  EXPECT_TRUE(store.list().empty());
  EXPECT_THROW((void)store::tensor_set::get(store, "model"), store::store_error);
  held = store::tensor_set();  // its release goes to the dead daemon's connection: nothing to do
}

// The restart tests run on every kind: a GPU's driver refuses to export a handle the process
// imported, so what a client offers (and what the new daemon serves of it) is exported from
// the descriptors the imports kept (docs/store.md, "Lifetimes").

TYPED_TEST(tensor_set_test, a_private_overlay_is_not_offered_after_a_restart_and_its_release_stays_quiet) {
  store::client store = this->connect();
  const std::size_t g = provider_for(TypeParam::where())->capabilities().granularity;
  this->bytes_.reserve(2);
  this->bytes_.push_back(pattern(g, 91));
  this->bytes_.push_back(pattern(g, 92));
  const std::vector<store::tensor_source> one = {
      {.name = "w", .type = dtype::u8, .shape = {g}, .data = this->bytes_[0].data()}};
  const std::vector<store::tensor_source> two = {
      {.name = "w", .type = dtype::u8, .shape = {g}, .data = this->bytes_[1].data()}};
  // "mine" first: its entry id in the old daemon is the one "shared" gets in the new.
  store::tensor_set mine = store::tensor_set::put(store, "mine", two, TypeParam::where());
  store::tensor_set shared = store::tensor_set::put(store, "shared", one, TypeParam::where());
  const std::vector<std::string> names = {"w"};
  (void)mine.make_private(names);
  auto* written = static_cast<std::uint8_t*>(mine.data_writable("w"));
  const std::vector<std::uint8_t> ours(g, 0x5a);
  write_bytes(*mine.memory().provider(), reinterpret_cast<std::uintptr_t>(written), ours);

  ::kill(this->daemon_->process().pid(), SIGKILL);
  (void)this->daemon_->process().wait();
  this->start_daemon({});
  EXPECT_EQ(store.reconnect(), std::vector<std::string>{});
  // The private copy holds this process's bytes: only the shared set comes back.
  const std::vector<store::buffer_info> listed = store.list();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].name, "shared");
  EXPECT_EQ(read_bytes(*mine.memory().provider(), reinterpret_cast<std::uintptr_t>(written), g), ours);
  // Its handle names no entry of the new daemon: letting go of it sends nothing, and the
  // connection serves on (an entry id of the old daemon could name another buffer here).
  mine = store::tensor_set();
  EXPECT_EQ(store.stat("shared").holders, 1u);
  EXPECT_EQ(store.statistics().holds, 1u);
  shared = store::tensor_set();
  store.drop_cache();
  EXPECT_EQ(store.statistics().holds, 0u);
}

// The daemon SIGKILLed while two processes hold a set laid out per tensor (more chunks than
// one offer frame carries); a new daemon gets it back from both, and a third process gets it.
TYPED_TEST(tensor_set_test, a_restarted_daemon_gets_a_set_back_from_the_clients_that_map_it) {
  store::client store = this->connect();
  const std::size_t g = provider_for(TypeParam::where())->capabilities().granularity;
  std::vector<store::tensor_source> sources;
  const std::size_t count = store::max_offer_chunks + 2;
  this->bytes_.reserve(count + 1);
  for (std::size_t i = 0; i <= count; ++i) {
    const std::uint64_t bytes = i == count ? 20 : g;  // the last is small
    this->bytes_.push_back(pattern(bytes, 70 + static_cast<std::uint32_t>(i)));
    sources.push_back({.name = fmt::format("t{}", i),
                       .type = dtype::u8,
                       .shape = {bytes},
                       .data = this->bytes_.back().data()});
  }
  store::tensor_set put = store::tensor_set::put(store, "model", sources, TypeParam::where(),
                                                 {.layout = store::set_layout::per_tensor});
  ASSERT_GT(put.memory().chunk_count(), store::max_offer_chunks);
  const std::uint64_t old_entry = put.memory().entry();
  child_process holder = this->spawn({"tensor_reconnect", "model", "t3"});
  const store_report before = receive_store_report(holder.socket());
  EXPECT_EQ(before.checksum, checksum(this->bytes_[3].data(), this->bytes_[3].size()));

  ::kill(this->daemon_->process().pid(), SIGKILL);
  (void)this->daemon_->process().wait();
  this->start_daemon({});
  EXPECT_THROW((void)store.list(), store::store_error);  // the old connection is gone
  const std::uint64_t old_instance = store.daemon().instance;
  const std::uint64_t empty_fds = [&] {
    store::client other = this->connect();
    // The new daemon's first memory at this location opens the driver's own descriptors (on a
    // GPU: /dev/nvidia*, its eventfds and pipes), which stay: made and removed first, they are
    // in the baseline.
    { const store::buffer warm_up = other.create("warm-up", g, TypeParam::where()); }
    other.remove("warm-up");
    return other.statistics().open_fds;
  }();
  EXPECT_EQ(store.reconnect(), std::vector<std::string>{});
  EXPECT_NE(store.daemon().instance, old_instance);
  send_word(holder.socket());
  const store_report after = receive_store_report(holder.socket());
  EXPECT_EQ(after.size, 0u) << "offers refused";
  EXPECT_EQ(after.checksum, before.checksum);
  EXPECT_EQ(after.address, before.address);
  EXPECT_EQ(after.capacity, put.memory().entry()) << "both clients offered the same entry";
  EXPECT_NE(put.memory().entry(), 0u);
  (void)old_entry;

  // stat and ls show it, held by both.
  const store::buffer_info info = store.stat("model");
  EXPECT_TRUE(info.sealed);
  EXPECT_EQ(info.tensors, count + 1);
  EXPECT_EQ(info.holders, 2u);
  EXPECT_EQ(info.capacity, put.memory().capacity());
  ASSERT_EQ(store.list().size(), 1u);
  EXPECT_EQ(store.statistics().bytes, put.memory().capacity());

  // A third process gets the same bytes and table; this one's get maps nothing new.
  child_process third = this->spawn({"tensor", "model", "t65"});
  const store_report got = receive_store_report(third.socket());
  EXPECT_EQ(got.checksum, checksum(this->bytes_[65].data(), this->bytes_[65].size()));
  EXPECT_EQ(got.write_faulted, 1u);
  store::tensor_set again = store::tensor_set::get(store, "model");
  EXPECT_EQ(std::vector<tensor_info>(again.tensors().begin(), again.tensors().end()),
            std::vector<tensor_info>(put.tensors().begin(), put.tensors().end()));
  EXPECT_EQ(again[0].data, put[0].data);
  EXPECT_EQ(read_bytes(*again.memory().provider(), reinterpret_cast<std::uintptr_t>(again.at("t64").data), g),
            this->bytes_[64]);

  // Everybody lets go and the name goes: nothing stays in the daemon.
  third.close_socket();
  (void)third.wait();
  holder.close_socket();
  (void)holder.wait();
  again = store::tensor_set();
  put = store::tensor_set();
  store.remove("model");
  store.drop_cache();
  const store::daemon_statistics s = store.statistics();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.bytes, 0u);
  EXPECT_EQ(s.open_fds, empty_fds)  // `other`'s socket then, this client's now
      << "the daemon's descriptors now:\n"
      << open_fd_targets(this->daemon_->process().pid());
}

// reoffer_after_restart: the client's own thread sees the daemon die, waits for the new
// socket and offers the set back, without being asked.
TYPED_TEST(tensor_set_test, a_client_that_reoffers_after_a_restart_brings_its_set_back_unasked) {
  std::promise<std::vector<std::string>> reconnected;
  std::atomic<bool> told{false};
  store::client store({.socket_path = this->daemon_->socket(),
                       .reoffer_after_restart = true,
                       .on_reconnect = [&](const std::vector<std::string>& refused) {
                         if (!told.exchange(true)) reconnected.set_value(refused);
                       }});
  const auto sources = this->sources(5);
  store::tensor_set held = store::tensor_set::put(store, "model", sources, TypeParam::where());
  ::kill(this->daemon_->process().pid(), SIGKILL);
  (void)this->daemon_->process().wait();
  this->start_daemon({});
  EXPECT_EQ(reconnected.get_future().get(), std::vector<std::string>{});
  store::client other = this->connect();
  const store::buffer_info info = other.stat("model");
  EXPECT_TRUE(info.sealed);
  EXPECT_EQ(info.tensors, 3u);
  EXPECT_EQ(info.holders, 1u);
  const store::tensor_set got = store::tensor_set::get(other, "model");
  EXPECT_EQ(
      read_bytes(*got.memory().provider(), reinterpret_cast<std::uintptr_t>(got.at("norm.weight").data), 20),
      this->bytes_[1]);
}

// Hostile offers: each refused naming its problem; the daemon keeps no descriptor of them.
TYPED_TEST(tensor_set_test, hostile_offers_are_refused_naming_the_problem_and_leak_nothing) {
  if (TypeParam::where().kind != memory_kind::os_host)
    GTEST_SKIP() << "offers memfds: the OS provider's memory";
  store::client store = this->connect();
  const std::size_t g = provider_for(TypeParam::where())->capabilities().granularity;
  {
    store::buffer taken = store.create("taken", g, TypeParam::where());
    store.seal("taken");
  }
  const store::daemon_statistics baseline = store.statistics();
  const std::size_t own_fds = open_fd_count();
  const auto memfd = [](std::size_t bytes) {
    unique_fd fd(::memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
        ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
      throw std::runtime_error("memfd");
    return fd;
  };
  const store::request plain{.op = store::operation::offer,
                             .name = "offered",
                             .where = TypeParam::where(),
                             .size = g,
                             .entry = 5,
                             .origin = 0x1234,
                             .chunk_total = 1,
                             .chunk_sizes = {g}};
  // The reply to `asked` sent with memfds of `sizes`, on a connection of its own; whether
  // the daemon closed the connection after it.
  const auto offer = [&](const store::request& asked, const std::vector<std::size_t>& sizes) {
    const unique_fd socket = ipc::connect_unix(this->daemon_->socket());
    ipc::send_message(socket.get(), store::encode(store::request{.op = store::operation::hello}));
    (void)ipc::receive_message(socket.get(), std::nullopt);  // closes the version table's fd
    std::vector<unique_fd> owned;
    std::vector<int> fds;
    for (const std::size_t bytes : sizes) {
      owned.push_back(memfd(bytes));
      fds.push_back(owned.back().get());
    }
    ipc::send_message(socket.get(), store::encode(asked), fds);
    owned.clear();
    const store::reply got = store::decode_reply(ipc::receive_message(socket.get(), 0).payload);
    bool closed = false;
    try {
      ipc::send_message(socket.get(), store::encode(store::request{.op = store::operation::list}));
      (void)ipc::receive_message(socket.get(), std::nullopt);
    } catch (const std::exception&) {
      closed = true;
    }
    return std::pair{got, closed};
  };
  const auto refused = [&](const store::request& asked, const std::vector<std::size_t>& sizes, status code,
                           const std::string& words, bool closes) {
    SCOPED_TRACE(words);
    const auto [got, closed] = offer(asked, sizes);
    EXPECT_EQ(got.code, code) << got.message;
    EXPECT_NE(got.message.find(words), std::string::npos) << got.message;
    EXPECT_EQ(closed, closes);
  };
  refused(plain, {4096}, status::invalid, "holds 4096 bytes, not",
          false);  // a descriptor of other bytes than its chunk's
  {
    store::request small = plain;
    small.chunk_sizes = {4096};
    small.size = 4096;
    refused(small, {4096}, status::invalid, "granularity", false);
  }
  {
    store::request past = plain;
    past.tensor_set = true;
    past.table_offset = g - 8;
    past.table_bytes = 64;
    refused(past, {g}, status::invalid, "past its", false);
    past.table_offset = 0;
    refused(past, {g}, status::invalid, "no valid tensor set", false);  // zeros are no table
  }
  {
    store::request name = plain;
    name.name = "taken";
    refused(name, {g}, status::exists, "\"taken\" is taken", false);
  }
  {
    store::request more = plain;
    more.chunk_total = 2;
    refused(more, {g, g}, status::bad_request, "2 descriptors", true);  // one chunk, two descriptors
  }
  refused(store::request{.op = store::operation::stat, .name = "taken"}, {g}, status::bad_request,
          "only offer and offer_more carry any", true);
  {
    store::request many = plain;
    many.chunk_total = store::max_offer_chunks + 1;
    refused(many, std::vector<std::size_t>(store::max_offer_chunks + 1, 4096), status::bad_request,
            fmt::format("more than {} descriptors", store::max_offer_chunks), true);
  }
  refused(store::request{.op = store::operation::offer_more, .chunk_sizes = {g}}, {g}, status::invalid,
          "without an offer under way", false);

  // Nothing was taken, nothing is left open on either side.
  EXPECT_EQ(store.list().size(), 1u);
  const store::daemon_statistics after = store.statistics();
  EXPECT_EQ(after.entries, baseline.entries);
  EXPECT_EQ(after.bytes, baseline.bytes);
  EXPECT_EQ(after.open_fds, baseline.open_fds);
  EXPECT_EQ(open_fd_count(), own_fds);
}

}  // namespace
}  // namespace vmm::testing
