// vmm-store with real processes: a vmm-store daemon (the tool, spawned per test), this
// process as a client, and tests/helpers/store_peer.cpp as further clients. Typed over the
// kinds of memory that can be exported (the OS provider always; a GPU kind skips without a
// GPU). Leak checks compare the daemon's own counters (open fds, pool usage, holds) and
// this process's descriptors before and after.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "helpers/store_peer_protocol.hpp"
#include "memory_io.hpp"
#include "process_resources.hpp"
#include "provider_kinds.hpp"
#include "sanitizers.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/retirement.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/host_mirror.hpp"
#include "vmm/store/protocol.hpp"
#include "vmm/store/server.hpp"

namespace vmm::testing {
namespace {

using store::status;

// A process stopped (SIGSTOP) for the scope: it reads and answers nothing.
class stopped {
 public:
  explicit stopped(pid_t pid) : pid_(pid) { ::kill(pid_, SIGSTOP); }
  stopped(const stopped&) = delete;
  stopped& operator=(const stopped&) = delete;
  ~stopped() { ::kill(pid_, SIGCONT); }

 private:
  pid_t pid_;
};

bool exited_cleanly(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::uint64_t checksum_of(const std::vector<std::uint8_t>& bytes) {
  return checksum(bytes.data(), bytes.size());
}

std::vector<std::uint8_t> contents(const store::buffer& held) {
  return read_bytes(*held.provider(), reinterpret_cast<std::uintptr_t>(held.data()), held.size());
}

template <class Kind>
class store_test : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->IsSkipped()) return;
    daemon_ = std::make_unique<daemon_process>(directory_.path() + "/socket", daemon_arguments());
  }
  virtual std::vector<std::string> daemon_arguments() const { return {}; }

  store::client connect() { return store::client({.socket_path = daemon_->socket()}); }

  child_process spawn(const std::vector<std::string>& args) const {
    std::vector<std::string> argv{VMM_STORE_PEER_PATH, daemon_->socket(), Kind::name};
    argv.insert(argv.end(), args.begin(), args.end());
    return child_process(argv);
  }

  store::buffer create_filled(store::client& store, const std::string& name, std::size_t bytes,
                              std::uint32_t seed) {
    store::buffer made = store.create(name, bytes, Kind::where());
    write_bytes(*made.provider(), reinterpret_cast<std::uintptr_t>(made.data()), pattern(bytes, seed));
    return made;
  }

  temporary_directory directory_;
  std::unique_ptr<daemon_process> daemon_;
};

using store_kinds = ::testing::Types<os_host_memory, device_memory>;
TYPED_TEST_SUITE(store_test, store_kinds, memory_kind_names);

TYPED_TEST(store_test, create_get_grow_remove_with_contents_across_processes) {
  const std::size_t g = this->granularity_;
  store::client store = this->connect();
  store::buffer made = this->create_filled(store, "frames", 2 * g + 100, 1);
  EXPECT_EQ(made.access(), access_mode::read_write);
  child_process reader = this->spawn({"hold", "frames", "ro"});
  store_report seen = receive_store_report(reader.socket());
  EXPECT_EQ(seen.size, 2 * g + 100);
  EXPECT_EQ(seen.checksum, checksum_of(pattern(2 * g + 100, 1)));
  EXPECT_EQ(store.stat("frames").holders, 2u);

  // Grow in place: the creator writes the new tail, the reader refreshes at the same address.
  const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(made.data());
  const store::buffer_info grown = store.grow("frames", 5 * g);
  EXPECT_EQ(grown.size, 5 * g);
  made.refresh();
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(made.data()), address);
  ASSERT_GE(made.capacity(), 5 * g);
  write_bytes(*made.provider(), address, pattern(5 * g, 2));
  send_word(reader.socket());
  store_report after = receive_store_report(reader.socket());
  EXPECT_EQ(after.address, seen.address);
  EXPECT_EQ(after.size, 5 * g);
  EXPECT_EQ(after.checksum, checksum_of(pattern(5 * g, 2)));

  // Removed: the name is free at once, the reader still reads its memory.
  store.seal("frames");
  store.remove("frames");
  EXPECT_THROW((void)store.stat("frames"), store::store_error);
  store::buffer again = this->create_filled(store, "frames", g, 3);  // a new buffer under the old name
  EXPECT_NE(again.entry(), made.entry());
  send_word(reader.socket());
  after = receive_store_report(reader.socket());
  EXPECT_EQ(after.checksum, checksum_of(pattern(5 * g, 2)));
  reader.close_socket();
  EXPECT_TRUE(exited_cleanly(reader.wait()));
  made.release();
  again.release();
  store.remove("frames");
  const store::daemon_statistics s = store.statistics();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.holds, 0u);
  EXPECT_EQ(s.pool_used, 0u);
  EXPECT_EQ(s.bytes, 0u);
}

TYPED_TEST(store_test, read_only_get_faults_on_write) {
  store::client store = this->connect();
  store::buffer made = this->create_filled(store, "ro", this->granularity_, 4);
  store.seal("ro");
  child_process writer = this->spawn({"write", "ro"});
  const store_report report = receive_store_report(writer.socket());
  EXPECT_EQ(report.write_faulted, 1u) << "a write through a read-only get went through";
  EXPECT_TRUE(exited_cleanly(writer.wait()));
  EXPECT_EQ(checksum_of(contents(made)), checksum_of(pattern(this->granularity_, 4)));
}

TYPED_TEST(store_test, writable_only_for_the_creator_or_a_grantee_while_unsealed) {
  store::client store = this->connect();
  store::buffer made = this->create_filled(store, "w", this->granularity_, 5);
  {
    child_process other = this->spawn({"get_rw", "w"});
    send_word(other.socket());
    EXPECT_EQ(receive_store_report(other.socket()).error, static_cast<int>(status::denied));
    EXPECT_TRUE(exited_cleanly(other.wait()));
  }
  {
    child_process granted = this->spawn({"get_rw", "w"});
    store.grant("w", granted.pid());
    send_word(granted.socket());
    const store_report report = receive_store_report(granted.socket());
    EXPECT_EQ(report.error, 0);
    EXPECT_EQ(report.checksum, checksum_of(pattern(this->granularity_, 5)));
    EXPECT_TRUE(exited_cleanly(granted.wait()));
  }
  store.seal("w");
  try {
    (void)store.get("w", access_mode::read_write);
    ADD_FAILURE() << "a writable get of a sealed buffer was granted";
  } catch (const store::store_error& error) {
    EXPECT_TRUE(error.is(status::sealed)) << error.what();
  }
  try {
    (void)store.grow("w", 4 * this->granularity_);
    ADD_FAILURE() << "a sealed buffer grew";
  } catch (const store::store_error& error) {
    EXPECT_TRUE(error.is(status::sealed)) << error.what();
  }
  EXPECT_EQ(store.get("w").access(), access_mode::read_only);
}

TYPED_TEST(store_test, repeated_gets_reuse_the_mapping) {
  store::client store = this->connect();
  store::buffer made = this->create_filled(store, "hot", 3 * this->granularity_, 7);
  store.seal("hot");
  std::uintptr_t address = 0;
  {
    store::buffer first = store.get("hot");
    address = reinterpret_cast<std::uintptr_t>(first.data());
  }
  const std::size_t fds = open_fd_count();
  const store::daemon_statistics before = store.statistics();
  for (int i = 0; i < 100; ++i) {
    store::buffer again = store.get("hot");
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(again.data()), address) << "get " << i << " mapped afresh";
  }
  EXPECT_EQ(open_fd_count(), fds);
  const store::daemon_statistics after = store.statistics();
  EXPECT_EQ(after.open_fds, before.open_fds);
  EXPECT_EQ(after.holds, before.holds);
  EXPECT_EQ(checksum_of(contents(store.get("hot"))), checksum_of(pattern(3 * this->granularity_, 7)));
}

// A get of a buffer this client maps already, unchanged since (the daemon's version table
// says so), takes its hold with a message that has no reply: with the daemon stopped, it
// still returns. A get that waited for a reply would time out instead.
TYPED_TEST(store_test, a_get_of_an_unchanged_buffer_it_maps_waits_for_no_reply) {
  using namespace std::chrono_literals;
  const std::size_t n = 2 * this->granularity_;
  {
    // Made by another client: a daemon's first GPU buffer also starts CUDA in it, which
    // may take longer than the short timeout below.
    store::client maker = this->connect();
    (void)this->create_filled(maker, "local", n, 12);
    maker.seal("local");
  }
  store::client store({.socket_path = this->daemon_->socket(), .timeout = 5000ms});
  ASSERT_NE(store.daemon().version_slots, 0u) << "the daemon offers no version table";
  std::uintptr_t address = 0;
  {
    const store::buffer first = store.get("local");
    address = reinterpret_cast<std::uintptr_t>(first.data());
  }
  ASSERT_EQ(store.stat("local").holders, 0u);
  std::vector<store::buffer> got;
  {
    const stopped paused(this->daemon_->process().pid());
    for (int i = 0; i < 3; ++i) ASSERT_NO_THROW(got.push_back(store.get("local"))) << "get " << i;
  }
  for (const store::buffer& held : got) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(held.data()), address);
    EXPECT_EQ(held.size(), n);
  }
  EXPECT_EQ(checksum_of(contents(got.front())), checksum_of(pattern(n, 12)));
  // The holds went first on the connection: the daemon counts them before it answers.
  EXPECT_EQ(store.stat("local").holders, 3u);
  got.clear();
  EXPECT_EQ(store.stat("local").holders, 0u);
}

// A daemon with one slot in its version table gives none to its second buffer, and one
// with no table to any: their gets ask the daemon, and so wait for it.
TYPED_TEST(store_test, a_buffer_without_a_version_slot_is_got_by_asking) {
  using namespace std::chrono_literals;
  const std::size_t g = this->granularity_;
  for (const std::uint32_t slots : {1u, 0u}) {
    SCOPED_TRACE(slots);
    daemon_process small(this->directory_.path() + "/small-" + std::to_string(slots),
                         {"--version-slots", std::to_string(slots)});
    store::client maker({.socket_path = small.socket()});  // see the test above
    store::client store({.socket_path = small.socket(), .timeout = 3000ms});
    EXPECT_EQ(store.daemon().version_slots, slots);
    for (const char* name : {"a", "b"}) {
      (void)this->create_filled(maker, name, g, 1);
      maker.seal(name);
      EXPECT_EQ(checksum_of(contents(store.get(name))), checksum_of(pattern(g, 1)));  // now cached
    }
    const stopped paused(small.process().pid());
    if (slots == 1) {
      EXPECT_NO_THROW((void)store.get("a")) << "the buffer with the slot";
    }
    try {
      (void)store.get("b");
      ADD_FAILURE() << "a get of a buffer without a slot did not ask the stopped daemon";
    } catch (const store::store_error& error) {
      EXPECT_EQ(error.code(), store::store_error::daemon_gone) << error.what();  // timed out
    }
  }
}

// What a local get must not miss: each change below comes from another client, and the
// next get of this one sees it.
TYPED_TEST(store_test, a_repeated_get_sees_removal_recreation_growth_sealing_and_a_lost_name) {
  const std::size_t g = this->granularity_;
  store::client reader = this->connect();
  store::client writer = this->connect();
  const auto refused = [&](store::client& asker, const std::string& name, access_mode access,
                           status expected) {
    try {
      (void)asker.get(name, access);
      ADD_FAILURE() << "a get of \"" << name << "\" was not refused";
    } catch (const store::store_error& error) {
      EXPECT_TRUE(error.is(expected)) << error.what();
    }
  };
  store::buffer first = this->create_filled(writer, "x", g, 1);
  writer.seal("x");
  { EXPECT_EQ(reader.get("x").entry(), first.entry()); }
  writer.remove("x");  // held by `first`: it lives on, without its name
  refused(reader, "x", access_mode::read_only, status::not_found);
  const std::uint64_t first_entry = first.entry();
  first.release();  // now it ends

  (void)this->create_filled(writer, "x", 2 * g, 2);
  writer.seal("x");
  {
    const store::buffer again = reader.get("x");
    EXPECT_NE(again.entry(), first_entry);
    EXPECT_EQ(again.size(), 2 * g);
    EXPECT_EQ(checksum_of(contents(again)), checksum_of(pattern(2 * g, 2)));
  }
  // The creator's own unsealed buffer, grown and sealed through the other client (one pid:
  // both may write).
  const store::buffer made = writer.create("g", g, TypeParam::where());
  (void)reader.grow("g", 3 * g);
  { EXPECT_EQ(writer.get("g", access_mode::read_write).size(), 3 * g); }
  reader.seal("g");
  refused(writer, "g", access_mode::read_write, status::sealed);
  { EXPECT_EQ(writer.get("g").size(), 3 * g); }

  // An uncommitted creation loses its name when its creator's connection closes.
  {
    store::client creator = this->connect();
    const store::buffer doomed = creator.create("u", g, TypeParam::where());
    { EXPECT_EQ(reader.get("u").entry(), doomed.entry()); }
  }
  refused(reader, "u", access_mode::read_only, status::not_found);
  const store::daemon_statistics now = reader.statistics();
  EXPECT_EQ(now.named_entries, 2u);  // x and g
  EXPECT_EQ(now.holds, 1u);          // `made`
}

TYPED_TEST(store_test, client_killed_while_holding_leaves_no_leak) {
  store::client store = this->connect();
  (void)this->create_filled(store, "held", 2 * this->granularity_, 8);
  store.seal("held");
  const store::daemon_statistics before = store.statistics();
  {
    child_process holder = this->spawn({"hold", "held", "ro"});
    (void)receive_store_report(holder.socket());
    EXPECT_EQ(store.stat("held").holders, 1u);
    holder.kill_and_wait(SIGKILL);
  }
  EXPECT_EQ(store.stat("held").holders, 0u);
  store.remove("held");
  const store::daemon_statistics after = store.statistics();
  EXPECT_EQ(after.holds, 0u);
  EXPECT_EQ(after.entries, 0u);
  EXPECT_EQ(after.pool_used, 0u);
  EXPECT_EQ(after.cached_exports, 0u);
  EXPECT_EQ(after.connections, before.connections);
  EXPECT_LE(after.open_fds, before.open_fds);
}

TYPED_TEST(store_test, client_killed_while_creating_leaves_no_leak) {
  store::client store = this->connect();
  // The pool keeps what buffers give back: warm it with a buffer of the same size first.
  (void)store.create("warm", 3 * this->granularity_, TypeParam::where());
  store.remove("warm");
  const store::daemon_statistics before = store.statistics();
  {
    child_process creator = this->spawn({"create", "doomed", std::to_string(3 * this->granularity_), "9"});
    const store_report made = receive_store_report(creator.socket());
    EXPECT_EQ(made.checksum, checksum_of(pattern(3 * this->granularity_, 9)));
    EXPECT_EQ(store.stat("doomed").size, 3 * this->granularity_);
    creator.kill_and_wait(SIGKILL);
  }
  try {
    (void)store.stat("doomed");
    ADD_FAILURE() << "an uncommitted creation outlived its creator";
  } catch (const store::store_error& error) {
    EXPECT_TRUE(error.is(status::not_found)) << error.what();
  }
  const store::daemon_statistics after = store.statistics();
  EXPECT_EQ(after.entries, before.entries);
  EXPECT_EQ(after.pool_used, before.pool_used);
  EXPECT_EQ(after.bytes, before.bytes);
  EXPECT_EQ(after.open_fds, before.open_fds);
  EXPECT_EQ(after.cached_exports, before.cached_exports);
}

TYPED_TEST(store_test, daemon_killed_leaves_mappings_readable_and_a_restart_is_empty) {
  const std::size_t g = this->granularity_;
  store::client store = this->connect();
  const std::uint64_t instance = store.daemon().instance;
  store::buffer made = this->create_filled(store, "survivor", 2 * g, 10);
  store.seal("survivor");
  store::buffer held = store.get("survivor");
  made.release();
  this->daemon_->process().kill_and_wait(SIGKILL);
  EXPECT_EQ(checksum_of(contents(held)), checksum_of(pattern(2 * g, 10)));
  try {
    (void)store.get("survivor");  // cached and unchanged: a local get, whose hold cannot be sent
    ADD_FAILURE() << "a get from a dead daemon succeeded";
  } catch (const store::store_error& error) {
    EXPECT_EQ(error.code(), store::store_error::daemon_gone) << error.what();
  }
  try {
    (void)store.list();
    ADD_FAILURE() << "a request to a dead daemon succeeded";
  } catch (const store::store_error& error) {
    EXPECT_EQ(error.code(), store::store_error::daemon_gone) << error.what();
  }
  held.release();                                     // nothing to release to: must not throw or hang
  daemon_process restarted(this->daemon_->socket());  // over the stale socket file
  store::client fresh = this->connect();
  EXPECT_NE(fresh.daemon().instance, instance);
  EXPECT_TRUE(fresh.list().empty());
}

TYPED_TEST(store_test, cycles_leak_no_descriptor_on_either_side) {
  const int full = TypeParam::where().kind == memory_kind::os_host ? 10'000 : 1'000;
  const int cycles = under_thread_sanitizer ? full / 10 : full;  // see sanitizers.hpp
  store::client store = this->connect();
  const auto cycle = [&](int i) {
    const std::string name = "cycle-" + std::to_string(i % 7);
    store::buffer made = store.create(name, this->granularity_, TypeParam::where());
    store::buffer got = store.get(name);
    store.remove(name);
  };
  cycle(0);
  collect_retired(true);
  const std::size_t fds = open_fd_count();
  const store::daemon_statistics before = store.statistics();
  for (int i = 1; i < cycles; ++i) cycle(i);
  store.drop_cache();
  collect_retired(true);
  EXPECT_EQ(open_fd_count(), fds);
  const store::daemon_statistics after = store.statistics();
  EXPECT_EQ(after.open_fds, before.open_fds);
  EXPECT_EQ(after.entries, 0u);
  EXPECT_EQ(after.pool_used, 0u);
  EXPECT_EQ(after.cached_exports, 0u);
}

TYPED_TEST(store_test, host_mirror_copies_in_and_back) {
  const std::size_t n = this->granularity_ + 4096;
  store::client store = this->connect();
  store::buffer made = this->create_filled(store, "mirrored", n, 11);
  {
    store::host_mirror host(made);
    host.synchronize();
    ASSERT_EQ(host.size(), n);
    auto* bytes = static_cast<std::uint8_t*>(host.data());
    EXPECT_EQ(checksum(bytes, n), checksum_of(pattern(n, 11)));
    const std::vector<std::uint8_t> other = pattern(n, 12);
    std::copy(other.begin(), other.end(), bytes);
  }  // copied back: the buffer is writable here
  collect_retired(true);
  made.provider()->executor().synchronize({});
  EXPECT_EQ(checksum_of(contents(made)), checksum_of(pattern(n, 12)));
  store.seal("mirrored");
  store::buffer read_only = store.get("mirrored");
  {
    store::host_mirror host(read_only);
    host.synchronize();
    static_cast<std::uint8_t*>(host.data())[0] ^= 0xff;
    EXPECT_THROW(host.copy_back(), invalid_argument);
  }  // read-only: nothing copied back
  EXPECT_EQ(checksum_of(contents(read_only)), checksum_of(pattern(n, 12)));
}

// Caps: a daemon capped at 8 granules, 4 per client.
template <class Kind>
class store_cap_test : public store_test<Kind> {
 protected:
  std::vector<std::string> daemon_arguments() const override {
    return {"--cap", std::to_string(8 * this->granularity_), "--client-cap",
            std::to_string(4 * this->granularity_)};
  }
};
TYPED_TEST_SUITE(store_cap_test, store_kinds, memory_kind_names);

TYPED_TEST(store_cap_test, caps_are_enforced_and_named) {
  const std::size_t g = this->granularity_;
  store::client first = this->connect();
  try {
    (void)first.create("big", 5 * g, TypeParam::where(), {.max_size = 8 * g});
    ADD_FAILURE() << "the per-client cap let 5 granules through";
  } catch (const store::store_error& error) {
    EXPECT_TRUE(error.is(status::cap_exceeded));
    EXPECT_NE(std::string(error.what()).find("--client-cap"), std::string::npos) << error.what();
  }
  store::buffer a = first.create("a", 4 * g, TypeParam::where(), {.max_size = 8 * g});
  try {
    (void)first.grow("a", 5 * g);
    ADD_FAILURE() << "growth past the per-client cap";
  } catch (const store::store_error& error) {
    EXPECT_TRUE(error.is(status::cap_exceeded)) << error.what();
  }
  store::client second = this->connect();
  store::buffer b = second.create("b", 4 * g, TypeParam::where(), {.max_size = 4 * g});
  store::client third = this->connect();
  try {
    (void)third.create("c", g, TypeParam::where(), {.max_size = g});
    ADD_FAILURE() << "the daemon's cap let a ninth granule through";
  } catch (const store::store_error& error) {
    EXPECT_TRUE(error.is(status::cap_exceeded));
    EXPECT_NE(std::string(error.what()).find("--cap"), std::string::npos) << error.what();
  }
  EXPECT_EQ(first.statistics().bytes, 8 * g);
}

// ---- the protocol, without memory of a GPU -------------------------------------------------

TEST(store_protocol, names_are_validated) {
  EXPECT_TRUE(store::valid_name("weights/layer.0"));
  EXPECT_TRUE(store::valid_name("Gewichte-\xc3\xa4\xe2\x82\xac\xf0\x9f\x98\x80"));
  EXPECT_TRUE(store::valid_name(std::string(store::max_name_bytes, 'x')));
  EXPECT_FALSE(store::valid_name(""));
  EXPECT_FALSE(store::valid_name(std::string(store::max_name_bytes + 1, 'x')));
  EXPECT_FALSE(store::valid_name("tab\there"));
  EXPECT_FALSE(store::valid_name(std::string("nul\0x", 5)));
  EXPECT_FALSE(store::valid_name("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(store::valid_name("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(store::valid_name("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(store::valid_name("cut\xe2\x82"));
  EXPECT_FALSE(store::valid_name("\x80"));
  EXPECT_THROW((void)store::encode(store::request{.op = store::operation::stat, .name = ""}),
               invalid_argument);
}

TEST(store_protocol, requests_round_trip_and_forgeries_are_refused) {
  const store::request asked{.op = store::operation::get,
                             .name = "x",
                             .access = access_mode::read_write,
                             .entry = 7,
                             .generation = 9,
                             .end = 11};
  std::vector<std::byte> bytes = store::encode(asked);
  EXPECT_EQ(store::decode_request(bytes), asked);
  auto patched = [&](std::size_t at, std::uint8_t value) {
    std::vector<std::byte> copy = bytes;
    copy.at(at) = static_cast<std::byte>(value);
    return copy;
  };
  EXPECT_THROW((void)store::decode_request(patched(0, 0)), ipc::protocol_error);  // magic
  EXPECT_THROW((void)store::decode_request(patched(4, 1)), store::unsupported_version_error);
  EXPECT_THROW((void)store::decode_request(patched(6, 99)), ipc::protocol_error);  // op
  EXPECT_THROW((void)store::decode_request(patched(8, 3)), ipc::protocol_error);   // access
  EXPECT_THROW((void)store::decode_request(patched(9, 1)), ipc::protocol_error);   // reserved
  EXPECT_THROW((void)store::decode_request(std::span(bytes).first(bytes.size() - 1)), ipc::protocol_error);
  bytes.push_back(std::byte{0});
  EXPECT_THROW((void)store::decode_request(bytes), ipc::protocol_error);  // trailing byte
}

TEST(store_protocol, hold_and_its_versions_round_trip) {
  const store::request hold{.op = store::operation::hold, .entry = 42};
  const std::vector<std::byte> bytes = store::encode(hold);
  EXPECT_EQ(bytes.size(), 16u);
  EXPECT_EQ(store::decode_request(bytes), hold);
  EXPECT_THROW((void)store::decode_request(std::span(bytes).first(15)), ipc::protocol_error);
  const store::hold_reply reply{.entry = 3,
                                .size = 4096,
                                .sent = store::delivery::growth,
                                .sealed = true,
                                .slot = 17,
                                .version = 0x1122334455667788};
  EXPECT_EQ(store::decode_hold_reply(store::encode(reply)), reply);
  EXPECT_EQ(store::hold_reply{}.slot, store::no_version_slot);
  const store::daemon_info info{.instance = 1, .started_ns = 2, .pid = 3, .version_slots = 65536};
  EXPECT_EQ(store::decode_daemon_info(store::encode(info)), info);
  std::vector<std::byte> short_reply = store::encode(reply);
  short_reply.pop_back();
  EXPECT_THROW((void)store::decode_hold_reply(short_reply), ipc::protocol_error);
}

TEST(store_protocol, seal_flags_and_the_stored_bytes_round_trip) {
  for (const store::operation op : {store::operation::seal, store::operation::seal_set}) {
    SCOPED_TRACE(static_cast<int>(op));
    const store::request asked{
        .op = op, .name = "set", .table_offset = 4096, .table_bytes = 64, .deduplicate = true};
    store::request expected = asked;
    if (op == store::operation::seal) expected.table_offset = expected.table_bytes = 0;  // seal has no table
    std::vector<std::byte> bytes = store::encode(asked);
    EXPECT_EQ(bytes[8], std::byte{1});  // the flags byte, right after the header
    EXPECT_EQ(store::decode_request(bytes), expected);
    bytes[8] = std::byte{0};
    EXPECT_FALSE(store::decode_request(bytes).deduplicate);
    bytes[8] = std::byte{2};
    EXPECT_THROW((void)store::decode_request(bytes), ipc::protocol_error);  // not 0 or 1
    bytes[8] = std::byte{1};
    bytes[15] = std::byte{1};
    EXPECT_THROW((void)store::decode_request(bytes), ipc::protocol_error);  // a reserved byte
  }
  const store::buffer_info info{.name = "ft",
                                .entry = 2,
                                .size = 100,
                                .capacity = 8192,
                                .max_size = 8192,
                                .holders = 1,
                                .sealed = true,
                                .tensors = 3,
                                .named_bytes = 90,
                                .stored_bytes = 4096,
                                .shared_bytes = 4096};
  EXPECT_EQ(store::decode_buffer_info(store::encode(info)), info);
  const std::vector<store::buffer_info> two = {info, info};
  EXPECT_EQ(store::decode_buffer_infos(store::encode(two)), two);
  std::vector<std::byte> short_info = store::encode(info);
  short_info.pop_back();
  EXPECT_THROW((void)store::decode_buffer_info(short_info), ipc::protocol_error);
  const store::daemon_statistics counters{.entries = 2, .bytes = 12288, .capacity = 16384, .open_fds = 9};
  EXPECT_EQ(store::decode_daemon_statistics(store::encode(counters)), counters);
}

class store_daemon : public ::testing::Test {
 protected:
  temporary_directory directory_;
};

// The bytes of one frame as a client writes them: a frame header, then `payload`.
std::vector<std::byte> frame_bytes(std::uint32_t magic, std::uint32_t fds, std::uint64_t size,
                                   std::span<const std::byte> payload = {}) {
  const ipc::frame_header header{magic, fds, size};
  std::vector<std::byte> bytes(sizeof header + payload.size());
  std::memcpy(bytes.data(), &header, sizeof header);
  if (!payload.empty()) std::memcpy(bytes.data() + sizeof header, payload.data(), payload.size());
  return bytes;
}

std::vector<std::byte> request_frame(const store::request& asked) {
  const std::vector<std::byte> payload = store::encode(asked);
  return frame_bytes(ipc::frame_magic, 0, payload.size(), payload);
}

// Writes `bytes` at once, never waiting: each test writes less than a socket buffers.
void send_now(int socket, std::span<const std::byte> bytes) {
  ASSERT_EQ(::send(socket, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT),
            static_cast<ssize_t>(bytes.size()));
}

// A reply, with whatever descriptors it carries (hello's: the version table) closed.
store::reply receive_reply(int socket) {
  return store::decode_reply(ipc::receive_message(socket, std::nullopt).payload);
}

TEST_F(store_daemon, malformed_messages_close_one_connection_and_change_nothing_else) {
  daemon_process daemon(directory_.path() + "/socket");
  store::client store({.socket_path = daemon.socket()});
  const std::size_t g = provider_for(location::os_host())->capabilities().granularity;
  store::buffer kept = store.create("kept", g, location::os_host());
  write_bytes(*kept.provider(), reinterpret_cast<std::uintptr_t>(kept.data()), pattern(g, 13));
  store.seal("kept");
  const store::daemon_statistics before = store.statistics();

  std::vector<std::byte> valid_get =
      store::encode(store::request{.op = store::operation::get, .name = "kept"});
  std::vector<std::pair<std::string, std::vector<std::byte>>> raw = {
      {"bad frame magic", frame_bytes(0x12345678, 0, 8)},
      {"oversized frame", frame_bytes(ipc::frame_magic, 0, std::uint64_t{1} << 40)},
      {"frame over the request limit", frame_bytes(ipc::frame_magic, 0, store::max_request_bytes + 1)},
      {"truncated header", std::vector<std::byte>(7, std::byte{0x56})},
  };
  std::vector<std::pair<std::string, std::vector<std::byte>>> payloads = {
      {"garbage", std::vector<std::byte>(40, std::byte{0xab})},
      {"empty", {}},
      {"truncated get", std::vector<std::byte>(valid_get.begin(), valid_get.end() - 2)},
      {"other version",
       [&] {
         auto b = valid_get;
         b[4] = std::byte{9};
         return b;
       }()},
      {"unknown op",
       [&] {
         auto b = valid_get;
         b[6] = std::byte{77};
         return b;
       }()},
      {"release of nothing held", store::encode(store::request{.op = store::operation::release, .entry = 1})},
      {"name of bad UTF-8",
       [&] {
         auto b = valid_get;
         b.back() = std::byte{0xff};
         return b;
       }()},
  };
  for (const auto& [what, bytes] : raw) {
    SCOPED_TRACE(what);
    const unique_fd socket = ipc::connect_unix(daemon.socket());
    ASSERT_EQ(::send(socket.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    ::shutdown(socket.get(), SHUT_WR);
    // An error reply or the end of the stream, never a hang: the daemon closes.
    try {
      const ipc::message got = ipc::receive_message(socket.get(), 0);
      EXPECT_NE(store::decode_reply(got.payload).code, status::ok);
    } catch (const ipc::peer_closed&) {}
  }
  for (const auto& [what, bytes] : payloads) {
    SCOPED_TRACE(what);
    const unique_fd socket = ipc::connect_unix(daemon.socket());
    ipc::send_message(socket.get(), bytes);
    const ipc::message got = ipc::receive_message(socket.get(), 0);
    EXPECT_NE(store::decode_reply(got.payload).code, status::ok);
    EXPECT_THROW((void)ipc::receive_message(socket.get(), 0), ipc::peer_closed)
        << "the connection stayed open";
  }
  {
    SCOPED_TRACE("descriptors attached");
    const unique_fd socket = ipc::connect_unix(daemon.socket());
    const int fds[] = {socket.get()};
    ipc::send_message(socket.get(), store::encode(store::request{.op = store::operation::list}), fds);
    const ipc::message got = ipc::receive_message(socket.get(), 0);
    EXPECT_EQ(store::decode_reply(got.payload).code, status::bad_request);
  }
  // The well-behaved client saw nothing of it.
  const store::daemon_statistics after = store.statistics();
  EXPECT_EQ(after.entries, before.entries);
  EXPECT_EQ(after.holds, before.holds);
  EXPECT_EQ(after.connections, before.connections);
  EXPECT_EQ(after.open_fds, before.open_fds);
  EXPECT_EQ(checksum_of(contents(store.get("kept"))), checksum_of(pattern(g, 13)));
}

// A local get's hold can arrive after its entry ended (the get came first): that hold, and
// the release after it, are no error and hold nothing. A hold of an entry that never
// existed breaks the protocol.
TEST_F(store_daemon, a_hold_after_its_entry_ended_is_no_error_and_one_of_no_entry_is) {
  daemon_process daemon(directory_.path() + "/socket");
  store::client store({.socket_path = daemon.socket()});
  std::uint64_t ended = 0;
  {
    const store::buffer made = store.create("ended", 4096, location::os_host());
    ended = made.entry();
  }
  store.remove("ended");  // unheld and unnamed: it ends
  const store::buffer kept = store.create("live", 4096, location::os_host());
  const unique_fd raw = ipc::connect_unix(daemon.socket());
  const auto tell = [&](store::operation op, std::uint64_t entry) {
    ipc::send_message(raw.get(), store::encode(store::request{.op = op, .entry = entry}));
  };
  // A round trip on the raw connection: the daemon served what it sent before.
  const auto holds = [&] {
    ipc::send_message(raw.get(), store::encode(store::request{.op = store::operation::statistics}));
    const store::reply answer = receive_reply(raw.get());
    EXPECT_EQ(answer.code, status::ok) << answer.message;
    return store::decode_daemon_statistics(answer.body).holds;
  };
  tell(store::operation::hold, ended);
  tell(store::operation::release, ended);
  tell(store::operation::hold, kept.entry());
  EXPECT_EQ(holds(), 2u);  // `kept`, and the raw connection's hold on it
  EXPECT_EQ(store.stat("live").holders, 2u);
  tell(store::operation::release, kept.entry());
  EXPECT_EQ(holds(), 1u);
  tell(store::operation::hold, kept.entry() + 1000);
  const store::reply refused = receive_reply(raw.get());
  EXPECT_EQ(refused.code, status::bad_request);
  EXPECT_NE(refused.message.find("never existed"), std::string::npos) << refused.message;
  EXPECT_THROW((void)ipc::receive_message(raw.get(), 0), ipc::peer_closed) << "the connection stayed open";
  EXPECT_EQ(store.statistics().holds, 1u);
}

// The version table a client maps: the daemon's words, which no client can change.
// A "daemon" whose hello offers a table that is not one (unsealed, or of another size, or
// no descriptor at all): the client refuses it with a protocol error and keeps nothing.
TEST_F(store_daemon, a_client_refuses_a_version_table_that_is_not_sealed_or_not_its_size) {
  const std::string path = directory_.path() + "/fake";
  const unique_fd listener = ipc::listen_unix(path);
  const std::size_t fds_before = open_fd_count();
  struct offer {
    const char* what;
    std::uint32_t slots;
    std::size_t bytes;
    bool sealed;
    bool with_fd;
  };
  for (const offer& o : {offer{"unsealed", 4, 32, false, true}, offer{"of another size", 4, 64, true, true},
                         offer{"no descriptor", 4, 32, true, false}}) {
    SCOPED_TRACE(o.what);
    std::thread fake([&] {
      const unique_fd peer = ipc::accept_unix(listener.get());
      (void)ipc::receive_message(peer.get(), 0);  // hello
      const unique_fd table(::memfd_create("fake-table", MFD_CLOEXEC | MFD_ALLOW_SEALING));
      EXPECT_EQ(::ftruncate(table.get(), static_cast<off_t>(o.bytes)), 0);
      constexpr int future_write = 0x0010;  // F_SEAL_FUTURE_WRITE (Linux 5.1)
      if (o.sealed) {
        EXPECT_EQ(::fcntl(table.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | future_write | F_SEAL_SEAL),
                  0);
      }
      const int fds[] = {table.get()};
      ipc::send_message(peer.get(),
                        store::encode_ok(store::encode(store::daemon_info{.version_slots = o.slots})),
                        o.with_fd ? std::span<const int>(fds) : std::span<const int>());
      char byte = 0;
      (void)::recv(peer.get(), &byte, 1, 0);  // until the client closes
    });
    EXPECT_THROW(store::client({.socket_path = path}), ipc::protocol_error);
    fake.join();
  }
  EXPECT_EQ(open_fd_count(), fds_before);
}

TEST_F(store_daemon, the_version_table_is_read_only_for_clients_and_follows_changes) {
  daemon_process daemon(directory_.path() + "/socket");
  const unique_fd raw = ipc::connect_unix(daemon.socket());
  ipc::send_message(raw.get(), store::encode(store::request{.op = store::operation::hello}));
  ipc::message got = ipc::receive_message(raw.get(), 1);
  const store::reply answer = store::decode_reply(got.payload);
  ASSERT_EQ(answer.code, status::ok) << answer.message;
  const store::daemon_info info = store::decode_daemon_info(answer.body);
  ASSERT_GT(info.version_slots, 0u);
  const int fd = got.fds.at(0).get();
  const std::size_t bytes = std::size_t{info.version_slots} * sizeof(std::uint64_t);
  struct stat status {};
  ASSERT_EQ(::fstat(fd, &status), 0);
  EXPECT_EQ(static_cast<std::size_t>(status.st_size), bytes);
  EXPECT_EQ(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  EXPECT_EQ(::write(fd, "x", 1), -1);
  EXPECT_NE(::ftruncate(fd, 0), 0);
  EXPECT_NE(::fcntl(fd, F_ADD_SEALS, 0), 0) << "the seals can still change";
  void* mapped = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  const auto sum = [&] {
    const auto* words = static_cast<const std::uint64_t*>(mapped);
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < info.version_slots; ++i) total += words[i];
    return total;
  };
  const std::uint64_t before = sum();
  store::client store({.socket_path = daemon.socket()});
  (void)store.create("changing", 4096, location::os_host());
  store.seal("changing");    // one bump
  store.remove("changing");  // two: it loses its name, and ends
  EXPECT_EQ(sum(), before + 3);
  ::munmap(mapped, bytes);
}

// ---- the daemon serves everyone while one client is slow, silent or deaf ----------------------
// Each test fails against a daemon that waits for one client: its other client's requests
// would time out (30 s), as the daemon's own timeouts are set far longer.

TEST_F(store_daemon, a_client_silent_mid_frame_holds_nobody_up) {
  daemon_process daemon(directory_.path() + "/socket", {"--request-timeout", "600000"});
  const std::vector<std::byte> hello = request_frame({.op = store::operation::hello});
  const unique_fd silent = ipc::connect_unix(daemon.socket());
  const std::size_t half = hello.size() / 2;
  send_now(silent.get(), std::span(hello).first(half));

  store::client other({.socket_path = daemon.socket()});
  {
    store::buffer made = other.create("busy", 4096, location::os_host());
    const store::buffer got = other.get("busy");
    EXPECT_EQ(got.entry(), made.entry());
    other.remove("busy");
  }
  EXPECT_EQ(other.statistics().connections, 2u) << "the silent client's connection was closed";
  // Its request was waited for: the rest of it is answered.
  send_now(silent.get(), std::span(hello).subspan(half));
  const store::reply answer = receive_reply(silent.get());
  ASSERT_EQ(answer.code, status::ok) << answer.message;
  EXPECT_EQ(store::decode_daemon_info(answer.body), other.daemon());
}

TEST_F(store_daemon, a_request_trickled_byte_by_byte_is_answered) {
  daemon_process daemon(directory_.path() + "/socket", {"--request-timeout", "600000"});
  store::client other({.socket_path = daemon.socket()});
  (void)other.create("trickled", 4096, location::os_host());
  const std::vector<std::byte> frame = request_frame({.op = store::operation::stat, .name = "trickled"});
  const unique_fd slow = ipc::connect_unix(daemon.socket());
  (void)other.list();  // the daemon accepts `slow` in the turn that serves this, at the latest
  for (std::size_t i = 0; i < frame.size(); ++i) {
    send_now(slow.get(), std::span(frame).subspan(i, 1));
    // Another client's round trip: the daemon reads this byte no later than it serves that
    // request (the byte came first), so the frame arrives a byte at a time, and meanwhile
    // the other client is served and `slow` stays connected.
    EXPECT_EQ(other.statistics().connections, 2u) << "after byte " << i;
  }
  const store::reply answer = receive_reply(slow.get());
  ASSERT_EQ(answer.code, status::ok) << answer.message;
  EXPECT_EQ(store::decode_buffer_info(answer.body), other.stat("trickled"));
}

TEST_F(store_daemon, a_client_that_never_reads_its_replies_holds_nobody_up) {
  daemon_process daemon(directory_.path() + "/socket", {"--reply-timeout", "600000"});
  store::client other({.socket_path = daemon.socket()});
  // Replies of some 19 KB each: a list of 64 buffers with names of 255 bytes.
  constexpr std::size_t listed = 64;
  for (std::size_t i = 0; i < listed; ++i)
    (void)other.create(std::string(251, 'n') + std::to_string(1000 + i), 4096, location::os_host());
  // 400 list requests written at once (10 KB), and no reply read: far more replies (7 MB)
  // than the sockets between it and the daemon hold.
  constexpr int asked = 400;
  const std::vector<std::byte> list = request_frame({.op = store::operation::list});
  std::vector<std::byte> requests;
  for (int i = 0; i < asked; ++i) requests.insert(requests.end(), list.begin(), list.end());
  const unique_fd deaf = ipc::connect_unix(daemon.socket());
  send_now(deaf.get(), requests);

  // The daemon serves one request of each client a turn: within a few of these round trips
  // the replies to the deaf client no longer fit, and the other is still served.
  for (int i = 0; i < 64; ++i) {
    store::buffer made = other.create("busy", 4096, location::os_host());
    const store::buffer got = other.get("busy");
    EXPECT_EQ(got.entry(), made.entry());
    other.remove("busy");
  }
  EXPECT_EQ(other.statistics().connections, 2u) << "the client that does not read was closed";
  // Its replies were kept for it, in order: it gets every one once it reads.
  for (int i = 0; i < asked; ++i) {
    const store::reply answer = receive_reply(deaf.get());
    ASSERT_EQ(answer.code, status::ok) << "reply " << i << ": " << answer.message;
    ASSERT_GE(store::decode_buffer_infos(answer.body).size(), listed) << "reply " << i;
  }
}

TEST_F(store_daemon, another_uid_is_refused) {
  // Tests cannot change uid: the daemon allows only a uid that is not ours.
  daemon_process daemon(directory_.path() + "/socket", {"--allow-uid", std::to_string(::getuid() + 1)});
  try {
    store::client refused({.socket_path = daemon.socket()});
    ADD_FAILURE() << "the daemon let a uid it does not allow connect";
  } catch (const store::store_error& error) {
    EXPECT_TRUE(error.is(status::denied)) << error.what();
    EXPECT_NE(std::string(error.what()).find(std::to_string(::getuid())), std::string::npos) << error.what();
  }
}

TEST_F(store_daemon, the_command_line_client_lists_stats_and_removes) {
  daemon_process daemon(directory_.path() + "/socket");
  store::client store({.socket_path = daemon.socket()});
  (void)store.create("cli", 4096, location::os_host());
  store.seal("cli");
  const auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), VMM_STORE_PATH);
    args.insert(args.end(), {"--socket", daemon.socket()});
    child_process tool(args);
    return tool.wait();
  };
  EXPECT_TRUE(exited_cleanly(run({"ls"})));
  EXPECT_TRUE(exited_cleanly(run({"stat", "cli"})));
  // The JSON of ls, stat and stats (docs/tools.md names the fields): what the client sees.
  const auto json_of = [&](const std::string& command) {
    const std::string line =
        fmt::format("'{}' {} --socket '{}' --json", VMM_STORE_PATH, command, daemon.socket());
    std::FILE* out = ::popen(line.c_str(), "r");
    std::string text;
    char buffer[4096];
    for (std::size_t n = 0; out != nullptr && (n = std::fread(buffer, 1, sizeof buffer, out)) > 0;)
      text.append(buffer, n);
    const int status = out != nullptr ? ::pclose(out) : -1;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << line;
    return nlohmann::json::parse(text, nullptr, false);
  };
  const store::buffer_info expected = store.stat("cli");
  const nlohmann::json stat = json_of("stat cli");
  EXPECT_EQ(stat, json_of("ls")["buffers"][0]);
  EXPECT_EQ(stat["name"], "cli");
  EXPECT_EQ(stat["entry"], expected.entry);
  EXPECT_EQ(stat["location"], to_string(expected.where));
  EXPECT_EQ(stat["size"], expected.size);
  EXPECT_EQ(stat["capacity"], expected.capacity);
  EXPECT_EQ(stat["max_size"], expected.max_size);
  EXPECT_EQ(stat["holders"], expected.holders);
  EXPECT_EQ(stat["sealed"], true);
  EXPECT_EQ(stat["stored_bytes"], expected.capacity);  // nothing shared
  EXPECT_EQ(stat["shared_bytes"], 0u);
  const nlohmann::json counters = json_of("stats");
  EXPECT_EQ(counters["named_entries"], 1u) << counters.dump();
  EXPECT_EQ(counters["bytes"], expected.capacity) << counters.dump();
  EXPECT_EQ(counters["capacity"], expected.capacity) << counters.dump();
  EXPECT_EQ(counters["entries"], store.statistics().entries) << counters.dump();
  EXPECT_TRUE(exited_cleanly(run({"rm", "cli"})));
  const int missing = run({"stat", "cli"});
  EXPECT_TRUE(WIFEXITED(missing) && WEXITSTATUS(missing) == 1);
  EXPECT_TRUE(store.list().empty());
}

// A daemon with no descriptor left for a new connection: the client was left in the backlog,
// waiting for an answer that never came (and the listener, always ready, made every turn of
// the daemon return at once). Now it is accepted on the daemon's spare descriptor and refused,
// naming the limit; the next client, once descriptors are free again, is served.
TEST(store_server, a_client_the_daemon_has_no_descriptor_for_is_refused_naming_the_limit) {
  using namespace std::chrono_literals;
  temporary_directory directory;
  store::server daemon({.socket_path = directory.path() + "/socket"});
  const std::size_t fds_before = open_fd_count();
  {
    // A limit that lets exactly one more descriptor be opened: the client's socket, and not
    // the daemon's end of it.
    const int lowest = lowest_free_descriptor();
    std::optional<unique_fd> client;
    std::string failure;
    {
      const descriptor_limit limit{static_cast<rlim_t>(lowest) + 1};
      try {
        client.emplace(ipc::connect_unix(directory.path() + "/socket"));
        const unique_fd another(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        EXPECT_FALSE(another) << "the limit left room for another descriptor";
        EXPECT_EQ(errno, EMFILE);
        ASSERT_TRUE(daemon.serve_once(0ms));
      } catch (const std::exception& error) {
        failure = error.what();
      }
    }
    ASSERT_EQ(failure, "");
    ASSERT_TRUE(client);
    const store::reply got = store::decode_reply(ipc::receive_message(client->get(), {}, 1000ms).payload);
    EXPECT_EQ(got.code, store::status::unavailable) << got.message;
    EXPECT_NE(got.message.find("no file descriptor left"), std::string::npos) << got.message;
    EXPECT_NE(got.message.find(fmt::format("RLIMIT_NOFILE {}", lowest + 1)), std::string::npos)
        << got.message;
    EXPECT_EQ(daemon.statistics().connections, 0u);
  }
  // With descriptors free again, the next client is served.
  const unique_fd next = ipc::connect_unix(directory.path() + "/socket");
  ipc::send_message(next.get(), store::encode(store::request{.op = store::operation::list}));
  for (int turn = 0; turn < 4; ++turn) ASSERT_TRUE(daemon.serve_once(0ms));
  EXPECT_EQ(store::decode_reply(ipc::receive_message(next.get(), {}, 1000ms).payload).code,
            store::status::ok);
  EXPECT_EQ(daemon.statistics().connections, 1u);
  EXPECT_EQ(open_fd_count(), fds_before + 2);  // the client's socket and the daemon's end of it
}

// The offers under way hold at most max_offer_descriptors descriptors, every connection's
// together: a frame that would pass the bound is refused, naming it, and its offer ends; an
// offer that completes, is refused or is abandoned with its connection counts no more.
TEST(store_server, offers_under_way_hold_no_more_descriptors_than_the_bound) {
  using namespace std::chrono_literals;
  store::server daemon({.max_offer_descriptors = 3});
  const std::size_t g = provider_for(location::os_host())->capabilities().granularity;
  const auto connect = [&] {
    auto [client, served] = ipc::make_socket_pair();
    daemon.add_connection(std::move(served), ::getpid(), ::getuid());
    return std::move(client);
  };
  const auto serve = [&] {
    for (int turn = 0; turn < 4; ++turn) ASSERT_TRUE(daemon.serve_once(0ms));
  };
  // `r` sent with a sealed memfd of one granule for each of its chunks, and served.
  const auto send = [&](int socket, const store::request& r) {
    std::vector<unique_fd> owned;
    std::vector<int> fds;
    for (std::size_t i = 0; i < r.chunk_sizes.size(); ++i) {
      owned.emplace_back(::memfd_create("offered", MFD_CLOEXEC | MFD_ALLOW_SEALING));
      ASSERT_TRUE(owned.back());
      ASSERT_EQ(::ftruncate(owned.back().get(), static_cast<off_t>(g)), 0);
      ASSERT_EQ(::fcntl(owned.back().get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
      fds.push_back(owned.back().get());
    }
    ipc::send_message(socket, store::encode(r), fds);
    serve();
  };
  std::uint64_t entry = 0;
  // The first frame of an offer of `total` chunks that sends `first` of them.
  const auto offer = [&](const std::string& name, std::uint32_t total, std::size_t first) {
    return store::request{.op = store::operation::offer,
                          .name = name,
                          .where = location::os_host(),
                          .size = total * g,
                          .entry = ++entry,
                          .origin = 0x1234,
                          .chunk_total = total,
                          .chunk_sizes = std::vector<std::uint64_t>(first, g)};
  };
  const store::request one_more{.op = store::operation::offer_more, .chunk_sizes = {g}};
  const auto answer = [](int socket) {
    return store::decode_reply(ipc::receive_message(socket, {}, 1000ms).payload);
  };

  const unique_fd a = connect();
  send(a.get(), offer("a", 2, 1));  // one descriptor held
  const unique_fd b = connect();
  const std::size_t fds_before_refusal = open_fd_count();
  send(b.get(), offer("b", 3, 3));  // one and three: past the bound
  const store::reply refused = answer(b.get());
  EXPECT_EQ(open_fd_count(), fds_before_refusal) << "the refused offer's descriptors stayed open";
  EXPECT_EQ(refused.code, store::status::unavailable) << refused.message;
  EXPECT_NE(refused.message.find("the offers under way would hold 4, past the daemon's bound of 3"),
            std::string::npos)
      << refused.message;
  send(a.get(), one_more);  // two held, and the offer is whole: adopted
  EXPECT_EQ(answer(a.get()).code, store::status::ok);
  send(b.get(), offer("b", 3, 3));  // nothing else under way
  EXPECT_EQ(answer(b.get()).code, store::status::ok);
  const std::size_t fds_before_abandoning = open_fd_count();
  {
    const unique_fd c = connect();
    send(c.get(), offer("c", 2, 1));  // one held, then its connection closes
  }
  serve();
  EXPECT_EQ(open_fd_count(), fds_before_abandoning) << "the abandoned offer's descriptor stayed open";
  const unique_fd d = connect();
  send(d.get(), offer("d", 3, 3));  // refused if c's descriptor still counted
  EXPECT_EQ(answer(d.get()).code, store::status::ok);
  ipc::send_message(d.get(), store::encode(store::request{.op = store::operation::list}));
  serve();
  EXPECT_EQ(store::decode_buffer_infos(answer(d.get()).body).size(), 3u);  // a, b and d
}

}  // namespace
}  // namespace vmm::testing
