// Private overlays of vmm-store tensor sets (tensor_set::make_private, buffer::make_private,
// imported_buffer::make_private): the chunks under chosen tensors replaced, in this process
// only, by writable copies at the same addresses. A vmm-store daemon (the tool, spawned per
// test), this process and tests/helpers/store_peer.cpp. Typed over the kinds of memory that
// can be exported (the OS provider always; a GPU kind skips without a GPU). On OS host
// memory, /proc/self/maps tells which memory a tensor's address maps: each chunk is a memfd
// of its own, shared with the daemon (and every other holder) by its inode.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "fault_injection.hpp"  // vmm/src: test-only fault injection
#include "helpers/store_peer_protocol.hpp"
#include "memory_io.hpp"
#include "message_of.hpp"
#include "process_resources.hpp"
#include "provider_kinds.hpp"
#include "vmm/retirement.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/tensor_set.hpp"
#include "vmm/store/tensors.hpp"

namespace vmm::testing {
namespace {

namespace fault = vmm::detail::fault;
using store::dtype;
using store::tensor_info;

template <class Kind>
class overlay_test : public provider_test<Kind> {
 protected:
  static constexpr bool os_host = std::is_same_v<Kind, os_host_memory>;

  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->IsSkipped()) return;
    daemon_ = std::make_unique<daemon_process>(directory_.path() + "/socket");
  }
  store::client connect() { return store::client({.socket_path = daemon_->socket()}); }
  child_process spawn(const std::vector<std::string>& args) const {
    std::vector<std::string> argv{VMM_STORE_PEER_PATH, daemon_->socket(), Kind::name};
    argv.insert(argv.end(), args.begin(), args.end());
    return child_process(argv);
  }

  // Puts "model", a set of three chunks written by hand: "a" fills chunk 0, "b" and "c"
  // share chunk 1, "d" and the table lie in chunk 2. Each tensor holds pattern(seed + i).
  void put_three_chunks(store::client& store) {
    store::buffer made = store.create("model", 1, Kind::where());
    const std::size_t g = made.provider()->capabilities().granularity;
    std::vector<std::size_t> ends{made.capacity()};
    for (int i = 0; i < 2; ++i) {
      (void)store.grow("model", ends.back() + g);
      made.refresh();
      ends.push_back(made.capacity());
    }
    ASSERT_EQ(made.chunk_count(), 3u);
    table_ = {{.name = "a", .type = dtype::u8, .shape = {ends[0]}, .offset = 0},
              {.name = "b", .type = dtype::f32, .shape = {64}, .offset = ends[0]},
              {.name = "c", .type = dtype::i16, .shape = {256}, .offset = ends[0] + 256},
              {.name = "d", .type = dtype::u8, .shape = {1024}, .offset = ends[1]}};
    for (std::size_t i = 0; i < table_.size(); ++i) {
      table_[i].bytes = store::element_bytes(table_[i].type) * table_[i].shape[0];
      bytes_.push_back(pattern(table_[i].bytes, 40 + static_cast<std::uint32_t>(i)));
      write_bytes(*made.provider(), reinterpret_cast<std::uintptr_t>(made.data()) + table_[i].offset,
                  bytes_[i]);
    }
    const std::vector<std::byte> encoded = store::encode(table_);
    const std::uint64_t at = ends[1] + 1024;
    write_bytes(
        *made.provider(), reinterpret_cast<std::uintptr_t>(made.data()) + at,
        std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(encoded.data()),
                                  reinterpret_cast<const std::uint8_t*>(encoded.data()) + encoded.size()));
    store.seal_set("model", at, encoded.size());
    chunk_bytes_ = {ends[0], ends[1] - ends[0], ends[2] - ends[1]};
  }

  std::vector<std::uint8_t> read(const store::tensor_set& set, std::size_t i) const {
    return read_bytes(*set.memory().provider(), reinterpret_cast<std::uintptr_t>(set[i].data),
                      set[i].info->bytes);
  }
  // Whether a write to tensor i faults (it is read-only here).
  bool write_faults_on(const store::tensor_set& set, std::size_t i) const {
    return write_faults(*set.memory().provider(), const_cast<void*>(set[i].data), set[i].info->bytes,
                        "overlay_test");
  }
  // Each tensor's bytes are the ones put, and each maps what `shared` says it mapped.
  void expect_shared_as_put(const store::tensor_set& set, const std::vector<mapped_at>& shared) {
    for (std::size_t i = 0; i < table_.size(); ++i) {
      EXPECT_FALSE(set.is_private(table_[i].name)) << table_[i].name;
      EXPECT_EQ(read(set, i), bytes_[i]) << table_[i].name;
      if constexpr (os_host) {
        EXPECT_EQ(mapping_of(set[i].data), shared[i]) << table_[i].name;
      }
    }
  }
  std::vector<mapped_at> mappings(const store::tensor_set& set) const {
    std::vector<mapped_at> result;
    for (std::size_t i = 0; i < set.size(); ++i) result.push_back(mapping_of(set[i].data));
    return result;
  }

  temporary_directory directory_;
  std::unique_ptr<daemon_process> daemon_;
  std::vector<tensor_info> table_;
  std::vector<std::vector<std::uint8_t>> bytes_;
  std::vector<std::size_t> chunk_bytes_;
};

using store_kinds = ::testing::Types<os_host_memory, device_memory>;
TYPED_TEST_SUITE(overlay_test, store_kinds, memory_kind_names);

TYPED_TEST(overlay_test, private_tensors_are_writable_copies_here_and_the_rest_stays_shared) {
  store::client store = this->connect();
  this->put_three_chunks(store);
  collect_retired(true);
  const address_space_usage baseline = this->provider_->address_space().usage();
  const std::uint64_t stored = store.statistics().bytes;

  store::tensor_set set = store::tensor_set::get(store, "model");
  ASSERT_EQ(set.memory().chunk_count(), 3u);
  std::vector<const void*> addresses;
  for (std::size_t i = 0; i < set.size(); ++i) addresses.push_back(set[i].data);
  const std::vector<mapped_at> shared = this->mappings(set);
  const address_space_usage held = this->provider_->address_space().usage();

  const std::vector<std::string> names{"b"};
  const store::private_tensors made = set.make_private(names);
  EXPECT_EQ(made.names, (std::vector<std::string>{"b", "c"}));  // "c" shares b's chunk
  EXPECT_EQ(made.bytes, this->chunk_bytes_[1]);
  EXPECT_EQ(set.memory().private_bytes(), this->chunk_bytes_[1]);
  for (std::size_t i = 0; i < set.size(); ++i) EXPECT_EQ(set[i].data, addresses[i]);  // no address moved

  // The private tensors hold the shared bytes first, then what this process writes.
  EXPECT_EQ(this->read(set, 1), this->bytes_[1]);
  EXPECT_EQ(this->read(set, 2), this->bytes_[2]);
  EXPECT_EQ(set.data_writable("b"), set.at("b").data);
  const std::vector<std::uint8_t> written = pattern(this->table_[1].bytes, 99);
  write_bytes(*set.memory().provider(), reinterpret_cast<std::uintptr_t>(set.data_writable("b")), written);
  EXPECT_EQ(this->read(set, 1), written);
  EXPECT_EQ(this->read(set, 2), this->bytes_[2]);

  // The others stay shared and read-only: the same memory (the daemon's memfds), faulting on a write.
  EXPECT_FALSE(set.is_private("a"));
  EXPECT_TRUE(set.is_private("c"));
  EXPECT_NE(message_of<invalid_argument>([&] { (void)set.data_writable("d"); }).find("make_private first"),
            std::string::npos);
  EXPECT_TRUE(this->write_faults_on(set, 0));
  EXPECT_TRUE(this->write_faults_on(set, 3));
  EXPECT_EQ(this->read(set, 0), this->bytes_[0]);
  EXPECT_EQ(this->read(set, 3), this->bytes_[3]);
  if constexpr (TestFixture::os_host) {
    const std::vector<mapped_at> now = this->mappings(set);
    EXPECT_EQ(now[0], shared[0]);
    EXPECT_EQ(now[3], shared[3]);
    EXPECT_EQ(now[1].perms, "rw");
    EXPECT_NE(now[1].inode, shared[1].inode);  // fresh memory, not the daemon's
    EXPECT_EQ(now[2], now[1]);
    EXPECT_EQ(shared[0].perms, "r-");
  }
  // One chunk swapped for another here; the daemon stores nothing more.
  const address_space_usage overlaid = this->provider_->address_space().usage();
  EXPECT_EQ(overlaid.handle_bytes, held.handle_bytes);
  EXPECT_EQ(overlaid.mapped_bytes, held.mapped_bytes);
  EXPECT_EQ(store.statistics().bytes, stored);

  // Writes stay in this process: another reads the bytes put.
  {
    child_process peer = this->spawn({"tensor", "model", "b"});
    const store_report report = receive_store_report(peer.socket());
    EXPECT_EQ(report.checksum, checksum(this->bytes_[1].data(), this->bytes_[1].size()));
    EXPECT_EQ(report.write_faulted, 1u);
    peer.close_socket();
    (void)peer.wait();
  }

  // The overlay left the cache: a later get maps the shared memory again, read-only.
  {
    store::tensor_set again = store::tensor_set::get(store, "model");
    EXPECT_NE(again[1].data, set[1].data);
    EXPECT_EQ(this->read(again, 1), this->bytes_[1]);
    EXPECT_FALSE(again.is_private("b"));
    EXPECT_TRUE(this->write_faults_on(again, 1));
    if constexpr (TestFixture::os_host) {
      EXPECT_EQ(mapping_of(again[1].data), shared[1]);
    }
    // A second private set of this process: its own addresses, its own copy.
    const std::vector<std::string> d{"d"};
    store::tensor_set own = store::tensor_set::get(store, "model", d);
    EXPECT_NE(own[3].data, again[3].data);
    EXPECT_TRUE(own.is_private("d"));
    EXPECT_FALSE(again.is_private("d"));
    EXPECT_EQ(this->read(own, 3), this->bytes_[3]);
  }

  // Releasing the set frees its private memory with the rest.
  set = store::tensor_set();
  store.drop_cache();
  collect_retired(true);
  EXPECT_EQ(store.tensors(store.get("model")).size(), 4u);  // the set lives on in the daemon
  store.drop_cache();
  collect_retired(true);
  EXPECT_EQ(this->provider_->address_space().usage(), baseline);
}

TYPED_TEST(overlay_test, bad_input_changes_nothing) {
  store::client store = this->connect();
  this->put_three_chunks(store);
  store::tensor_set set = store::tensor_set::get(store, "model");
  const std::vector<mapped_at> shared = this->mappings(set);
  const auto refusal = [&](std::vector<std::string> names) {
    return message_of<invalid_argument>([&] { (void)set.make_private(names); });
  };
  EXPECT_NE(refusal({"b", "absent"}).find("holds no tensor \"absent\""), std::string::npos);
  EXPECT_NE(refusal({"b", "d", "b"}).find("\"b\" of \"model\" is named twice"), std::string::npos);
  EXPECT_NE(message_of<invalid_argument>([&] {
              (void)const_cast<store::buffer&>(set.memory()).make_private(0, set.memory().capacity() + 1);
            }).find("passes the"),
            std::string::npos);
  this->expect_shared_as_put(set, shared);

  // A second handle of this process maps the same addresses: it would change under it.
  {
    store::tensor_set same = store::tensor_set::get(store, "model");
    ASSERT_EQ(same[1].data, set[1].data);
    EXPECT_NE(refusal({"b"}).find("1 other handle(s) of this process map \"model\""), std::string::npos);
    this->expect_shared_as_put(same, shared);
  }
  // Nothing asked, nothing changed: the import is still the cached one.
  EXPECT_EQ(set.make_private({}).bytes, 0u);
  EXPECT_EQ(store::tensor_set::get(store, "model")[1].data, set[1].data);

  // A writable hold (a creator's) is no place for an overlay.
  store::buffer writable = store.create("plain", 64, TypeParam::where());
  EXPECT_NE(message_of<invalid_argument>([&] { (void)writable.make_private(0, 64); }).find("held writable"),
            std::string::npos);
  EXPECT_THROW((void)store::buffer().make_private(0, 1), invalid_argument);
  this->expect_shared_as_put(set, shared);
}

// Every OS call that making two chunks private makes fails in turn: each failure throws a
// documented error and leaves every tensor shared, read-only, unchanged and cached. (munmap
// only frees the temporary ranges, whose failure the retirement list retries: no failure.)
TYPED_TEST(overlay_test, every_failure_leaves_the_set_shared_and_read_only) {
  if constexpr (!TestFixture::os_host) {
    GTEST_SKIP() << "the sweep injects OS failures: OS host memory only";
  } else {
    store::client store = this->connect();
    this->put_three_chunks(store);
    store::tensor_set set = store::tensor_set::get(store, "model");
    const std::vector<mapped_at> shared = this->mappings(set);
    const std::uint64_t stored = store.statistics().bytes;
    collect_retired(true);
    address_space_usage before = this->provider_->address_space().usage();
    const std::vector<std::string> names{"b", "d"};
    std::size_t failures = 0;
    std::size_t cleanups = 0;
    std::uint64_t total = 0;
    for (const std::uint32_t site :
         {fault::memfd_create, fault::fallocate, fault::mmap, fault::mprotect, fault::fcntl, fault::fstat}) {
      std::uint64_t calls = 0;
      {
        store::tensor_set probe = store::tensor_set::get(store, "model", {});  // a mapping of its own
        fault::arm(site, 0, 0);
        (void)probe.make_private(names);
        calls = fault::calls();
        fault::disarm();
      }
      total += calls;
      for (std::uint64_t nth = 1; nth <= calls; ++nth) {
        SCOPED_TRACE(fmt::format("site mask {:#x}, call {} of {}", site, nth, calls));
        fault::arm(site, nth, ENOMEM);
        bool threw = false;
        bool succeeded = false;
        try {
          (void)set.make_private(names);
          succeeded = true;
        } catch (const os_error& error) {
          threw = error.code().value() == ENOMEM;
        } catch (const out_of_memory&) {
          threw = true;
        }
        const bool fired = fault::fired();
        fault::disarm();
        ASSERT_TRUE(fired);
        if (succeeded) {
          // The failed call was a cleanup's (a temporary mapping's unmap, which the
          // retirement list retries): the overlay is whole. Start again from a shared set.
          ++cleanups;
          EXPECT_TRUE(set.is_private("b") && set.is_private("d"));
          EXPECT_EQ(this->read(set, 1), this->bytes_[1]);
          EXPECT_EQ(this->read(set, 3), this->bytes_[3]);
          set = store::tensor_set::get(store, "model");
          collect_retired(true);
          before = this->provider_->address_space().usage();
          continue;
        }
        ASSERT_TRUE(threw) << "no documented error";
        ++failures;
        collect_retired(true);
        EXPECT_EQ(this->provider_->address_space().usage(), before);  // the fresh memory is gone
        EXPECT_EQ(set.memory().private_bytes(), 0u);
        this->expect_shared_as_put(set, shared);
        EXPECT_TRUE(this->write_faults_on(set, 1));
        EXPECT_EQ(store::tensor_set::get(store, "model")[1].data, set[1].data);  // still the cached import
      }
    }
    // Per chunk at least: its memfd and size, the temporary range, map and access, and in its
    // place the unmap, the map and the access (the second chunk's swap undoes the first's).
    EXPECT_GE(failures, 16u);
    EXPECT_EQ(failures + cleanups, total);
    EXPECT_LE(cleanups, 2u);  // at most one per temporary mapping
    EXPECT_EQ(store.statistics().bytes, stored);
    // With no failure it succeeds as ever.
    EXPECT_EQ(set.make_private(names).names, (std::vector<std::string>{"b", "c", "d"}));
    EXPECT_EQ(this->read(set, 3), this->bytes_[3]);
  }
}

}  // namespace
}  // namespace vmm::testing
