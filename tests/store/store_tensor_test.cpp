// vmm-store tensor sets (vmm/store/tensor_set.hpp, tensors.hpp): the table's codec and rules,
// and sets put and got by real processes: a vmm-store daemon (the tool, spawned per test),
// this process, and tests/helpers/store_peer.cpp. Typed over the kinds of memory that can be
// exported (the OS provider always; a GPU kind skips without a GPU).

#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <string>
#include <vector>

#include "helpers/store_peer_protocol.hpp"
#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/tensor_set.hpp"
#include "vmm/store/tensors.hpp"

namespace vmm::testing {
namespace {

using store::dtype;
using store::status;
using store::tensor_info;

// What `run` throws, as a string; empty when it throws nothing of type E.
template <class E, class F>
std::string message_of(F&& run) {
  try {
    run();
  } catch (const E& error) {
    return error.what();
  }
  return {};
}

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

}  // namespace
}  // namespace vmm::testing
