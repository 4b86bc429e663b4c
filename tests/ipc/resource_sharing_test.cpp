// Sharing a memory_resource between processes (vmm/ipc/resource_sharing.hpp): the two wire
// messages, pointers imported by a real second process with the exporter's bytes, pages
// shared by several pointers mapped once, release and re-import, trimming after the
// importer let go, the refusal to allocate from an imported resource, malformed messages
// refused with nothing mapped and every fd closed, a dying importer, the stream-ordered
// hand-off, the importer's cache of let-go pages (keep_mapped_bytes, trim()),
// and threads.
//
// The second process is tests/helpers/resource_peer.cpp (spawned with posix_spawn, one end
// of a socket pair as its descriptor 3). Tests that need no second process import in this
// one, through a provider of their own on the OS kind (an address space of its own, so
// that its usage counts only the import). The typed suite runs on the memory that can be
// exported (OS host, GPU); GPU kinds skip where there is no GPU.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "helpers/resource_peer_protocol.hpp"
#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/error.hpp"
#include "vmm/ipc/handoff.hpp"
#include "vmm/ipc/resource_sharing.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/retirement.hpp"

namespace vmm::testing {
namespace {

constexpr std::size_t kib = 1024;
constexpr std::size_t mib = 1024 * kib;

std::size_t open_fd_count() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

// Mappings of the OS provider's memfds (named "vmm").
std::size_t memfd_mapping_count() {
  std::ifstream maps("/proc/self/maps");
  std::size_t count = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("/memfd:vmm") != std::string::npos) ++count;
  return count;
}

template <class T>
std::vector<std::byte> patched(std::vector<std::byte> bytes, std::size_t at, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    bytes.at(at + i) = static_cast<std::byte>(static_cast<std::uint64_t>(value) >> (8 * i));
  return bytes;
}

// Runs `fn`, which must throw Error with `says` in its what().
template <class Error, class Fn>
void expect_error(Fn&& fn, const std::string& says) {
  try {
    fn();
    ADD_FAILURE() << "nothing thrown; expected an error that says \"" << says << "\"";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(says), std::string::npos) << error.what();
  }
}

// Gives back `imported`'s cache and waits for what was retired: then it holds nothing.
ipc::imported_resource_statistics expect_trimmed_to_nothing(ipc::imported_resource& imported) {
  imported.trim();
  collect_retired(true);
  const ipc::imported_resource_statistics s = imported.statistics();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.pointers, 0u);
  EXPECT_EQ(s.pages_mapped, 0u);
  EXPECT_EQ(s.segments, 0u);
  return s;
}

// ---- the wire, without any provider ------------------------------------------------------

constexpr std::uint64_t g2 = 2 * mib;

ipc::resource_description a_resource() {
  return {0x1234, location::device(1), g2, access_mode::read_only};
}

ipc::pointer_description a_pointer() {
  // 3 MiB + 5 bytes from 1 MiB into segment 3: pages 0, 1 and 2.
  return {0x1234, 3, 64 * g2, mib, 3 * mib + 5, {7, 8, 9}};
}

TEST(resource_sharing_wire, a_resource_message_round_trips) {
  const auto bytes = ipc::serialize(a_resource());
  EXPECT_EQ(bytes.size(), ipc::resource_message_bytes);
  EXPECT_EQ(ipc::parse_resource_description(bytes), a_resource());
  ipc::resource_description os{99, location::os_host(), 4096, access_mode::read_write};
  EXPECT_EQ(ipc::parse_resource_description(ipc::serialize(os)), os);
}

TEST(resource_sharing_wire, every_truncated_or_forged_resource_message_is_refused_by_name) {
  const auto valid = ipc::serialize(a_resource());
  for (std::size_t length = 0; length < valid.size(); ++length) {
    SCOPED_TRACE(length);
    EXPECT_THROW((void)ipc::parse_resource_description(std::span(valid).first(length)), ipc::protocol_error);
  }
  auto longer = valid;
  longer.push_back(std::byte{0});
  const std::vector<std::pair<std::vector<std::byte>, std::string>> forged = {
      {patched<std::uint32_t>(valid, 0, 0xdeadbeef), "bad magic 0xdeadbeef"},
      {patched<std::uint16_t>(valid, 4, 2), "version 2 is not supported"},
      {patched<std::uint8_t>(valid, 6, 0), "unknown grant 0"},
      {patched<std::uint8_t>(valid, 6, 3), "unknown grant 3"},
      {patched<std::uint8_t>(valid, 7, 9), "unknown location kind 9"},
      {patched<std::uint32_t>(valid, 8, 0xffffffff), "negative"},
      {patched<std::uint32_t>(patched<std::uint8_t>(valid, 7, 2), 8, 1),
       "os host memory has no location id 1"},
      {patched<std::uint32_t>(valid, 12, 1), "reserved"},
      {patched<std::uint64_t>(valid, 16, 0), "resource id 0"},
      {patched<std::uint64_t>(valid, 24, 0), "granularity 0"},
      {patched<std::uint64_t>(valid, 24, 2048), "granularity 2048"},
      {patched<std::uint64_t>(valid, 24, 3 * 4096), "granularity 12288"},
      {longer, "33 bytes where 32 are due"},
  };
  for (const auto& [bytes, says] : forged) {
    SCOPED_TRACE(says);
    expect_error<ipc::protocol_error>([&] { (void)ipc::parse_resource_description(bytes); }, says);
  }
  ipc::resource_description bad = a_resource();
  bad.grant = access_mode::none;
  EXPECT_THROW((void)ipc::serialize(bad), invalid_argument);
  bad = a_resource();
  bad.granularity = 1000;
  EXPECT_THROW((void)ipc::serialize(bad), invalid_argument);
}

TEST(resource_sharing_wire, a_pointer_message_round_trips) {
  const auto bytes = ipc::serialize(a_pointer(), g2);
  EXPECT_EQ(bytes.size(), ipc::pointer_header_bytes + 3 * 8);
  EXPECT_EQ(ipc::parse_pointer_description(bytes, g2), a_pointer());
  // The last byte of the segment, alone.
  const ipc::pointer_description last{5, 0, 4 * g2, 4 * g2 - 1, 1, {42}};
  EXPECT_EQ(ipc::parse_pointer_description(ipc::serialize(last, g2), g2), last);
}

TEST(resource_sharing_wire, every_truncated_or_forged_pointer_message_is_refused_by_name) {
  const auto valid = ipc::serialize(a_pointer(), g2);
  for (std::size_t length = 0; length < valid.size(); ++length) {
    SCOPED_TRACE(length);
    EXPECT_THROW((void)ipc::parse_pointer_description(std::span(valid).first(length), g2),
                 ipc::protocol_error);
  }
  auto longer = valid;
  longer.resize(longer.size() + 8);
  const std::uint64_t segment_size = 64 * g2;
  const std::vector<std::pair<std::vector<std::byte>, std::string>> forged = {
      {patched<std::uint32_t>(valid, 0, 0xdeadbeef), "bad magic 0xdeadbeef"},
      {patched<std::uint16_t>(valid, 4, 9), "version 9 is not supported"},
      {patched<std::uint16_t>(valid, 6, 1), "reserved"},
      {patched<std::uint64_t>(valid, 8, 0), "resource id 0"},
      {patched<std::uint32_t>(valid, 16, ipc::max_segments), "segment 256 is out of range"},
      {patched<std::uint32_t>(valid, 16, 0xffffffff), "out of range"},
      {patched<std::uint32_t>(valid, 20, 4), "4 page ids call for"},
      {patched<std::uint32_t>(valid, 20, 2), "2 page ids call for"},
      {patched<std::uint64_t>(valid, 24, 0), "segment size 0"},
      {patched<std::uint64_t>(valid, 24, g2 + 4096), "not a non-zero multiple of the granularity"},
      {patched<std::uint64_t>(valid, 32, segment_size - mib), "runs past the end of the segment"},
      {patched<std::uint64_t>(valid, 32, segment_size), "runs past the end of the segment"},
      {patched<std::uint64_t>(valid, 40, ~std::uint64_t{0}), "runs past the end of the segment"},
      {patched<std::uint64_t>(valid, 40, 0), "0 bytes"},
      {patched<std::uint64_t>(valid, 40, mib), "3 page ids for a pointer that touches 1 pages"},
      {patched<std::uint64_t>(valid, 48 + 8, 0), "page 1 has id 0"},
      {longer, "72 bytes, but 3 page ids call for 72"},
  };
  for (const auto& [bytes, says] : forged) {
    SCOPED_TRACE(says);
    if (says.find("72 bytes") != std::string::npos) {
      // Trailing bytes: the count says 3, the length 4.
      expect_error<ipc::protocol_error>([&] { (void)ipc::parse_pointer_description(bytes, g2); },
                                        "page ids call for");
      continue;
    }
    expect_error<ipc::protocol_error>([&] { (void)ipc::parse_pointer_description(bytes, g2); }, says);
  }
  ipc::pointer_description bad = a_pointer();
  bad.page_ids.pop_back();
  EXPECT_THROW((void)ipc::serialize(bad, g2), invalid_argument);
  bad = a_pointer();
  bad.offset = bad.segment_size;
  EXPECT_THROW((void)ipc::serialize(bad, g2), invalid_argument);
}

// ---- the typed suite ----------------------------------------------------------------------

template <class Kind>
class resource_sharing : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->IsSkipped()) return;
    // Pages go back to the provider as soon as the resource gives them up, so that trimming
    // really gives memory back and fd counts return to their baselines.
    pool_ = chunk_pool::create(this->provider_, {.release_threshold = 0});
    resource_.emplace(
        pool_, memory_resource_properties{.handle_type = handle_kind::posix_fd, .max_size = 256 * mib});
    exporter_.emplace(*resource_);
    // In this process the importer maps through a provider of its own where it can: on the
    // OS kind, an address space of its own; GPU memory has one address space per process.
    importer_provider_ = this->provider_->capabilities().where.kind == memory_kind::os_host
                             ? make_os_host_provider()
                             : this->provider_;
    warm_up();
  }

  // One export, import and mapping, so that whatever the driver opens on its first use of
  // them is open before a test takes a baseline.
  void warm_up() {
    void* p = resource_->allocate_sync(4 * kib);
    {
      ipc::resource_exporter warm(*resource_);
      ipc::imported_resource imported(warm.export_resource(), {.provider = importer_provider_});
      auto [sender, receiver] = ipc::make_socket_pair();
      ipc::send_pointer(sender.get(), warm.export_pointer(p, 4 * kib));
      (void)imported.receive_pointer(receiver.get());
    }
    resource_->deallocate_sync(p, 4 * kib);
    resource_->trim_to(0);
  }

  // The importer's usage against its baseline: on a GPU the exporter's pages share the one
  // CUDA address space with the importer's, so the exporter gives its pages back first
  // (its live allocations freed by then).
  address_space_usage importer_usage() {
    this->resource_->synchronize();
    this->resource_->trim_to(0);
    this->resource_->pool()->trim_to(0);
    return this->importer_provider_->address_space().usage();
  }
  void* allocate_filled(std::size_t bytes, std::uint32_t seed) {
    void* p = resource_->allocate_sync(bytes);
    write_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(p), pattern(bytes, seed));
    return p;
  }
  std::vector<std::uint8_t> contents(const void* p, std::size_t n, memory_provider* through = nullptr) const {
    return read_bytes(through != nullptr ? *through : *this->provider_, reinterpret_cast<std::uintptr_t>(p),
                      n);
  }
  std::uint64_t checksum_at(const void* p, std::size_t n) const {
    const auto bytes = contents(p, n);
    return checksum(bytes.data(), bytes.size());
  }

  ipc::imported_resource import_here(ipc::resource_import_options options = {}) {
    if (options.provider == nullptr) options.provider = importer_provider_;
    return ipc::imported_resource(exporter_->export_resource(), std::move(options));
  }
  // Exports `p` over a socket pair and imports it here.
  ipc::imported_pointer share_here(ipc::imported_resource& imported, const void* p, std::size_t n) {
    auto [sender, receiver] = ipc::make_socket_pair();
    ipc::send_pointer(sender.get(), exporter_->export_pointer(p, n));
    return imported.receive_pointer(receiver.get());
  }

  // The peer, which has sent its baseline report and imported the resource.
  struct peer {
    peer_process process;
    resource_peer_report baseline;
  };
  // `keep_mapped_bytes`: the peer's resource_import_options::keep_mapped_bytes.
  std::unique_ptr<peer> spawn(std::size_t keep_mapped_bytes = 0) {
    std::vector<std::string> argv = {VMM_RESOURCE_PEER_PATH, Kind::name};
    if (keep_mapped_bytes != 0) argv.push_back(std::to_string(keep_mapped_bytes));
    std::unique_ptr<peer> made(new peer{peer_process(std::move(argv)), resource_peer_report{}});
    made->baseline = receive_resource_report(made->process.socket());
    ipc::send_resource(made->process.socket(), exporter_->export_resource());
    return made;
  }
  resource_peer_report command(peer& to, resource_peer_op op, std::uint32_t slot = 0,
                               std::uint64_t value = 0) {
    send_command(to.process.socket(), {op, slot, value});
    return receive_resource_report(to.process.socket());
  }
  resource_peer_report send_to(peer& to, std::uint32_t slot, const void* p, std::size_t n) {
    send_command(to.process.socket(), {resource_peer_op::import, slot, 0});
    ipc::send_pointer(to.process.socket(), exporter_->export_pointer(p, n));
    return receive_resource_report(to.process.socket());
  }
  // Frees `p` (`n` bytes), gives its pages up, and allocates `n` bytes filled with `seed`
  // again: at the same place (checked), with new pages.
  void* reallocate_with_new_pages(void* p, std::size_t n, std::uint32_t seed) {
    const memory_resource::allocation_pages old_pages = resource_->pages_of(p, n);
    resource_->deallocate_sync(p, n);
    resource_->trim_to(0);
    void* q = allocate_filled(n, seed);
    const memory_resource::allocation_pages new_pages = resource_->pages_of(q, n);
    EXPECT_EQ(new_pages.arena, old_pages.arena);
    EXPECT_EQ(new_pages.first_page, old_pages.first_page) << "the resource put the new block elsewhere";
    return q;
  }
  // The distinct pages that the allocations touch, as (arena, page).
  std::set<std::pair<std::size_t, std::size_t>> pages_under(
      const std::vector<std::pair<void*, std::size_t>>& held) {
    std::set<std::pair<std::size_t, std::size_t>> pages;
    for (const auto& [p, n] : held) {
      const memory_resource::allocation_pages under = resource_->pages_of(p, n);
      for (std::size_t i = 0; i < under.pages.size(); ++i) pages.emplace(under.arena, under.first_page + i);
    }
    return pages;
  }

  // Sends a pointer message and a manifest to this process: refused with protocol_error
  // saying `says`, and this process is as it was: no fd, mapping, range or handle more.
  void expect_refused(ipc::imported_resource& imported, std::span<const std::byte> pointer_bytes,
                      const ipc::exported_manifest& pages, const std::string& says) {
    SCOPED_TRACE(says);
    const std::size_t fds_before = open_fd_count();
    const std::size_t mappings_before = memfd_mapping_count();
    const address_space_usage usage_before = importer_provider_->address_space().usage();
    const ipc::imported_resource_statistics statistics_before = imported.statistics();
    {
      auto [sender, receiver] = ipc::make_socket_pair();
      ipc::send_message(sender.get(), pointer_bytes);
      ipc::send_manifest(sender.get(), pages);
      expect_error<ipc::protocol_error>([&] { (void)imported.receive_pointer(receiver.get()); }, says);
    }
    EXPECT_EQ(open_fd_count(), fds_before);
    EXPECT_EQ(memfd_mapping_count(), mappings_before);
    EXPECT_EQ(importer_provider_->address_space().usage(), usage_before);
    const ipc::imported_resource_statistics after = imported.statistics();
    EXPECT_EQ(after.pointers, statistics_before.pointers);
    EXPECT_EQ(after.pages_mapped, statistics_before.pages_mapped);
    EXPECT_EQ(after.segments, statistics_before.segments);
  }

  std::shared_ptr<chunk_pool> pool_;
  std::optional<memory_resource> resource_;  // declared before the exporter: outlives it
  std::optional<ipc::resource_exporter> exporter_;
  std::shared_ptr<memory_provider> importer_provider_;
};
TYPED_TEST_SUITE(resource_sharing, exportable_memory_kinds, memory_kind_names);

template <class Kind>
class resource_sharing_every_kind : public provider_test<Kind> {};
TYPED_TEST_SUITE(resource_sharing_every_kind, all_memory_kinds, memory_kind_names);

TYPED_TEST(resource_sharing_every_kind,
           a_resource_whose_memory_cannot_be_exported_is_refused_with_the_reason) {
  auto pool = chunk_pool::create(this->provider_);
  const bool exportable = this->provider_->capabilities().export_kind != handle_kind::none;
  if (!exportable) {  // pinned host memory: the resource itself refuses to promise it
    EXPECT_THROW((void)memory_resource(pool, {.handle_type = handle_kind::posix_fd, .max_size = 64 * mib}),
                 invalid_argument);
  }
  memory_resource plain(pool, {.max_size = 64 * mib});  // handle_type none
  expect_error<invalid_argument>([&] { ipc::resource_exporter refused(plain); },
                                 exportable ? "handle_type none" : "cannot be exported");
  if (exportable) {
    memory_resource shareable(pool, {.handle_type = handle_kind::posix_fd, .max_size = 64 * mib});
    ipc::resource_exporter exporter(shareable);
    EXPECT_NE(exporter.export_resource().resource_id, 0u);
    EXPECT_EQ(exporter.export_resource().granularity, this->granularity_);
    EXPECT_EQ(exporter.export_resource().where, this->provider_->capabilities().where);
    expect_error<invalid_argument>(
        [&] { ipc::resource_exporter bad(shareable, {.grant = access_mode::none}); }, "grant");
    // Exportable memory has no large pages unless asked for, and then pointers cannot be
    // exported (they go page by page in the granularity).
    EXPECT_EQ(shareable.properties().large_page_size, this->granularity_);
    memory_resource large(pool, {.handle_type = handle_kind::posix_fd,
                                 .max_size = 64 * mib,
                                 .large_page_size = 16 * this->granularity_});
    expect_error<invalid_argument>([&] { ipc::resource_exporter refused_large(large); }, "large_page_size");
  }
}

TYPED_TEST(resource_sharing, pointers_map_in_another_process_with_the_exporters_bytes_and_layout) {
  const std::size_t g = this->granularity_;
  auto peer = this->spawn();
  const std::vector<std::size_t> sizes = {1000, 3 * mib + 17, 256 * kib, 2 * g, 1};
  std::vector<std::pair<void*, std::size_t>> held;
  for (std::uint32_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE(sizes[i]);
    void* p = this->allocate_filled(sizes[i], 100 + i);
    held.emplace_back(p, sizes[i]);
    const resource_peer_report report = this->send_to(*peer, i, p, sizes[i]);
    EXPECT_EQ(report.checksum, this->checksum_at(p, sizes[i]));
    EXPECT_EQ(report.size, sizes[i]);
    // The same offset within its page as in the exporter's arena.
    const memory_resource::allocation_pages pages = this->resource_->pages_of(p, sizes[i]);
    EXPECT_EQ(report.address % g, (reinterpret_cast<std::uintptr_t>(p) - pages.arena_base) % g);
    EXPECT_EQ(report.pointers, i + 1);
  }
  const resource_peer_report all = this->command(*peer, resource_peer_op::report);
  EXPECT_EQ(all.pages_mapped, this->pages_under(held).size());
  std::set<std::size_t> arenas;
  for (const auto& [p, n] : held) arenas.insert(this->resource_->pages_of(p, n).arena);
  EXPECT_EQ(all.segments, arenas.size());
  // The peer's writes are the exporter's bytes: one memory.
  const resource_peer_report filled = this->command(*peer, resource_peer_op::fill, 1, 0xab);
  EXPECT_EQ(this->contents(held[1].first, held[1].second), std::vector<std::uint8_t>(held[1].second, 0xab));
  EXPECT_EQ(filled.checksum, this->checksum_at(held[1].first, held[1].second));
  peer->process.close_socket();
  EXPECT_TRUE(exited_cleanly(peer->process.wait()));
  for (const auto& [p, n] : held) this->resource_->deallocate_sync(p, n);
}

TYPED_TEST(resource_sharing, pointers_that_share_pages_map_each_page_once_and_release_it_last) {
  auto peer = this->spawn();
  // Small blocks side by side in one arena: several per page.
  std::vector<std::pair<void*, std::size_t>> held;
  for (std::uint32_t i = 0; i < 6; ++i)
    held.emplace_back(this->allocate_filled(300 * kib + i, 200 + i), 300 * kib + i);
  const std::size_t distinct = this->pages_under(held).size();
  std::size_t touched = 0;
  for (const auto& [p, n] : held) touched += this->resource_->pages_of(p, n).pages.size();
  ASSERT_LT(distinct, touched) << "the blocks share no page";
  for (std::uint32_t i = 0; i < held.size(); ++i)
    EXPECT_EQ(this->send_to(*peer, i, held[i].first, held[i].second).checksum,
              this->checksum_at(held[i].first, held[i].second));
  resource_peer_report report = this->command(*peer, resource_peer_op::report);
  EXPECT_EQ(report.pages_mapped, distinct);
  EXPECT_EQ(report.pages_imported, distinct);
  EXPECT_EQ(report.pages_shared, touched - distinct);
  EXPECT_EQ(report.mappings - peer->baseline.mappings, distinct);

  // Letting go of all but the last keeps exactly the pages the last one touches.
  for (std::uint32_t i = 0; i + 1 < held.size(); ++i)
    report = this->command(*peer, resource_peer_op::release, i);
  EXPECT_EQ(report.pointers, 1u);
  EXPECT_EQ(report.pages_mapped,
            this->resource_->pages_of(held.back().first, held.back().second).pages.size());
  EXPECT_EQ(this->command(*peer, resource_peer_op::report, 5).checksum,
            this->checksum_at(held.back().first, held.back().second));
  report = this->command(*peer, resource_peer_op::release, 5);
  EXPECT_EQ(report.pages_mapped, 0u);
  EXPECT_EQ(report.segments, 0u);
  EXPECT_EQ(report.pages_released, distinct);
  EXPECT_TRUE(report.same_usage(peer->baseline))
      << "ranges " << report.ranges << " handles " << report.handles << " mappings " << report.mappings;
  for (const auto& [p, n] : held) this->resource_->deallocate_sync(p, n);
}

TYPED_TEST(resource_sharing, a_released_pointer_imports_again_with_no_second_export_of_its_pages) {
  auto peer = this->spawn();
  const std::size_t n = 5 * mib + 3;
  void* p = this->allocate_filled(n, 300);
  EXPECT_EQ(this->send_to(*peer, 0, p, n).checksum, this->checksum_at(p, n));
  const std::size_t exported = this->exporter_->statistics().handles_exported;
  EXPECT_TRUE(this->command(*peer, resource_peer_op::release).same_usage(peer->baseline));
  write_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(p), pattern(n, 301));
  const resource_peer_report again = this->send_to(*peer, 0, p, n);
  EXPECT_EQ(again.checksum, this->checksum_at(p, n));
  EXPECT_EQ(again.pages_imported, 2 * this->resource_->pages_of(p, n).pages.size());
  EXPECT_EQ(again.pages_reused, 0u);  // no cache by default
  EXPECT_EQ(again.cached_bytes, 0u);
  EXPECT_EQ(this->exporter_->statistics().handles_exported, exported);  // the cache served them
  EXPECT_TRUE(this->command(*peer, resource_peer_op::release).same_usage(peer->baseline));
  this->resource_->deallocate_sync(p, n);
}

TYPED_TEST(resource_sharing, the_exporter_trims_and_its_memory_is_gone_once_the_importer_let_go) {
  auto peer = this->spawn();
  const std::size_t fds_before = open_fd_count();
  const std::size_t mappings_before = memfd_mapping_count();
  const std::vector<std::size_t> sizes = {7 * mib + 1, 40 * kib, 3 * mib};
  std::vector<std::pair<void*, std::size_t>> held;
  for (std::uint32_t i = 0; i < sizes.size(); ++i) {
    held.emplace_back(this->allocate_filled(sizes[i], 400 + i), sizes[i]);
    EXPECT_EQ(this->send_to(*peer, i, held[i].first, sizes[i]).checksum,
              this->checksum_at(held[i].first, sizes[i]));
  }
  EXPECT_GT(this->resource_->statistics().reserved_current, 0u);
  const std::size_t distinct = this->pages_under(held).size();
  resource_peer_report report;
  for (std::uint32_t i = 0; i < sizes.size(); ++i)
    report = this->command(*peer, resource_peer_op::release, i);
  EXPECT_TRUE(report.same_usage(peer->baseline));
  EXPECT_EQ(report.pages_mapped, 0u);

  for (const auto& [p, n] : held) this->resource_->deallocate_sync(p, n);
  this->resource_->trim_to(0);
  const memory_resource_statistics after = this->resource_->statistics();
  EXPECT_EQ(after.reserved_current, 0u);
  EXPECT_EQ(after.handles, 0u);
  EXPECT_GE(after.pages_released, distinct);
  EXPECT_EQ(this->pool_->statistics().reserved_current, 0u);  // destroyed, not kept idle
  // The export cache drops what the resource gave up: no process holds the memory now.
  this->exporter_->purge();
  EXPECT_EQ(this->exporter_->statistics().cached_chunks, 0u);
  EXPECT_EQ(open_fd_count(), fds_before);
  EXPECT_EQ(memfd_mapping_count(), mappings_before);

  // The resource goes on as before: new memory, shared again.
  void* p = this->allocate_filled(3 * mib, 410);
  EXPECT_EQ(this->send_to(*peer, 0, p, 3 * mib).checksum, this->checksum_at(p, 3 * mib));
  EXPECT_TRUE(this->command(*peer, resource_peer_op::release).same_usage(peer->baseline));
  this->resource_->deallocate_sync(p, 3 * mib);
}

TYPED_TEST(resource_sharing, allocating_from_an_imported_resource_is_refused_with_a_clear_error) {
  auto peer = this->spawn();
  EXPECT_EQ(this->command(*peer, resource_peer_op::allocate).status,
            resource_peer_status::allocation_refused);
  ipc::imported_resource imported = this->import_here();
  const address_space_usage before = this->importer_provider_->address_space().usage();
  expect_error<invalid_argument>([&] { (void)imported.allocate({}, 4096); },
                                 "cannot allocate from an imported resource");
  expect_error<invalid_argument>([&] { (void)imported.allocate_sync(1); },
                                 "cannot allocate from an imported resource");
  EXPECT_EQ(this->importer_provider_->address_space().usage(), before);
  EXPECT_EQ(imported.statistics().pointers, 0u);
}

TYPED_TEST(resource_sharing, the_same_pointer_imported_twice_maps_nothing_more_and_closes_the_duplicate_fds) {
  ipc::imported_resource imported = this->import_here();
  const address_space_usage before = this->importer_provider_->address_space().usage();
  const std::size_t n = 4 * mib + 100;
  void* p = this->allocate_filled(n, 500);
  const std::size_t pages = this->resource_->pages_of(p, n).pages.size();
  owned_stream first_stream(this->importer_provider_->executor());
  owned_stream second_stream(this->importer_provider_->executor());
  ipc::imported_pointer first = this->share_here(imported, p, n);
  first.set_stream(first_stream.get());
  const std::size_t fds = open_fd_count();
  const address_space_usage mapped = this->importer_provider_->address_space().usage();
  ipc::imported_pointer second = this->share_here(imported, p, n);
  second.set_stream(second_stream.get());
  EXPECT_EQ(second.data(), first.data());
  EXPECT_EQ(open_fd_count(), fds);  // every received fd was closed
  EXPECT_EQ(this->importer_provider_->address_space().usage(), mapped);
  ipc::imported_resource_statistics s = imported.statistics();
  EXPECT_EQ(s.pages_imported, pages);
  EXPECT_EQ(s.pages_shared, pages);
  EXPECT_EQ(this->contents(second.data(), n, this->importer_provider_.get()), pattern(n, 500));
  first.reset();  // its stream's point is kept by the pages the second still maps
  EXPECT_EQ(imported.statistics().pages_mapped, pages);
  EXPECT_EQ(this->contents(second.data(), n, this->importer_provider_.get()), pattern(n, 500));
  second.reset();
  collect_retired(true);
  s = imported.statistics();
  EXPECT_EQ(s.pages_mapped, 0u);
  EXPECT_EQ(s.pages_released, pages);
  this->resource_->deallocate_sync(p, n);
  EXPECT_EQ(this->importer_usage(), before);
}

TYPED_TEST(resource_sharing, a_pointer_let_go_of_on_a_busy_stream_imports_again_at_once) {
  // The first pointer's pages wait in the retirement list for the stream (on a GPU) while
  // another pointer keeps the mirror: importing it again needs those addresses now.
  ipc::imported_resource imported = this->import_here();
  const address_space_usage before = this->importer_provider_->address_space().usage();
  const std::size_t n = 64 * mib;
  void* p = this->allocate_filled(n, 520);
  void* other = this->allocate_filled(3 * mib, 521);
  ASSERT_EQ(this->resource_->pages_of(p, n).arena, this->resource_->pages_of(other, 3 * mib).arena);
  const owned_stream stream(this->importer_provider_->executor());
  ipc::imported_pointer keeps_the_mirror = this->share_here(imported, other, 3 * mib);
  for (std::uint8_t round = 1; round <= 3; ++round) {
    SCOPED_TRACE(round);
    ipc::imported_pointer shared = this->share_here(imported, p, n);
    shared.set_stream(stream.get());
    this->importer_provider_->executor().fill(shared.data(), round, n, stream.get());
    shared.reset();  // unmapped once the fill has passed
    ipc::imported_pointer again = this->share_here(imported, p, n);
    EXPECT_EQ(this->contents(again.data(), n, this->importer_provider_.get()),
              std::vector<std::uint8_t>(n, round));
  }
  EXPECT_EQ(this->contents(keeps_the_mirror.data(), 3 * mib, this->importer_provider_.get()),
            pattern(3 * mib, 521));
  keeps_the_mirror.reset();
  collect_retired(true);
  EXPECT_EQ(imported.statistics().pages_mapped, 0u);
  this->resource_->deallocate_sync(p, n);
  this->resource_->deallocate_sync(other, 3 * mib);
  EXPECT_EQ(this->importer_usage(), before);
}

TYPED_TEST(resource_sharing, imported_pointers_outlive_the_imported_resource_object) {
  const address_space_usage before = this->importer_provider_->address_space().usage();
  void* p = this->allocate_filled(mib, 510);
  ipc::imported_pointer kept;
  {
    ipc::imported_resource imported = this->import_here();
    kept = this->share_here(imported, p, mib);
  }
  EXPECT_EQ(this->contents(kept.data(), mib, this->importer_provider_.get()), pattern(mib, 510));
  ipc::imported_pointer moved = std::move(kept);
  EXPECT_FALSE(kept);
  kept.reset();  // nothing
  moved.reset();
  EXPECT_FALSE(moved);
  collect_retired(true);
  this->resource_->deallocate_sync(p, mib);
  EXPECT_EQ(this->importer_usage(), before);
}

// The manifest of `exported` with its description changed by `change`, re-serialized.
template <class Change>
ipc::exported_manifest forged_pages(const ipc::exported_pointer& exported, Change&& change) {
  ipc::exported_manifest pages;
  pages.description = exported.pages.description;
  change(pages.description);
  pages.bytes = ipc::serialize(pages.description);
  for (std::size_t i = 0; i < pages.description.fd_count(); ++i)
    pages.fds.emplace_back(
        ::fcntl(exported.pages.fds[i % exported.pages.fds.size()].get(), F_DUPFD_CLOEXEC, 0));
  return pages;
}

TYPED_TEST(resource_sharing, malformed_pointers_are_refused_with_nothing_mapped_and_every_fd_closed) {
  const std::size_t g = this->granularity_;
  ipc::imported_resource imported = this->import_here();
  const std::size_t n = 3 * mib + 5;
  void* p = this->allocate_filled(n, 600);
  const ipc::exported_pointer valid = this->exporter_->export_pointer(p, n);
  ASSERT_EQ(valid.description.page_ids.size(), 2u);
  const std::vector<std::byte>& bytes = valid.bytes;
  const std::uint64_t segment_size = valid.description.segment_size;

  this->expect_refused(imported, patched<std::uint32_t>(bytes, 0, 0x0badf00d), valid.pages,
                       "bad magic 0x0badf00d");
  this->expect_refused(imported, patched<std::uint16_t>(bytes, 4, 2), valid.pages,
                       "version 2 is not supported");
  this->expect_refused(imported, patched<std::uint32_t>(bytes, 16, ipc::max_segments), valid.pages,
                       "segment 256 is out of range");
  this->expect_refused(imported, patched<std::uint64_t>(bytes, 32, segment_size - mib), valid.pages,
                       "runs past the end of the segment");
  this->expect_refused(imported,
                       patched<std::uint64_t>(bytes, 40, segment_size - valid.description.offset + 1),
                       valid.pages, "runs past the end of the segment");
  for (const std::size_t length :
       {std::size_t{0}, std::size_t{5}, ipc::pointer_header_bytes - 1, bytes.size() - 1})
    this->expect_refused(imported, std::span(bytes).first(length), valid.pages, "pointer message");
  // Another resource's pointer, its manifest consistent with it.
  this->expect_refused(imported, patched<std::uint64_t>(bytes, 8, valid.description.resource_id ^ 1),
                       forged_pages(valid, [&](ipc::manifest& m) { m.buffer_id ^= 1; }),
                       "a pointer of resource");
  this->expect_refused(imported, patched<std::uint64_t>(bytes, 8, valid.description.resource_id ^ 1),
                       valid.pages, "not the resource");
  this->expect_refused(imported, patched<std::uint64_t>(bytes, 32, valid.description.offset + g), valid.pages,
                       "starts at");  // the pages of another place

  // Manifests that do not describe the pointer's pages.
  this->expect_refused(imported, bytes, forged_pages(valid, [&](ipc::manifest& m) { m.base_offset += g; }),
                       "starts at");
  this->expect_refused(imported, bytes, forged_pages(valid, [&](ipc::manifest& m) { m.buffer_id ^= 1; }),
                       "names buffer");
  this->expect_refused(imported, bytes, forged_pages(valid, [&](ipc::manifest& m) { m.max_size += g; }),
                       "max size");
  this->expect_refused(imported, bytes,
                       forged_pages(valid,
                                    [&](ipc::manifest& m) {
                                      m.chunks.pop_back();
                                      m.end = m.size = g;
                                    }),
                       "lists 1 chunks for 2 pages");
  this->expect_refused(imported, bytes,
                       forged_pages(valid, [&](ipc::manifest& m) { m.kind = ipc::manifest_kind::growth; }),
                       "growth manifest");
  this->expect_refused(imported, bytes,
                       forged_pages(valid,
                                    [&](ipc::manifest& m) {
                                      m.chunks.resize(1);
                                      m.chunks[0].size = 2 * g;
                                      m.end = m.size = 2 * g;
                                    }),
                       "lists 1 chunks");
  {
    // A page of another device (os host memory has no id 1): the bytes patched, as no
    // serialize() would write them for os host memory.
    ipc::exported_manifest other_device = forged_pages(valid, [](ipc::manifest&) {});
    const std::size_t location_id = ipc::manifest_header_bytes + ipc::manifest_chunk_bytes + 20;
    other_device.bytes = patched<std::uint32_t>(other_device.bytes, location_id,
                                                valid.pages.description.chunks[1].where.id + 1);
    this->expect_refused(imported, bytes, other_device, "memory");
  }
  // A manifest whose message lacks one of its fds.
  {
    SCOPED_TRACE("a missing fd");
    const std::size_t fds_before = open_fd_count();
    {
      auto [sender, receiver] = ipc::make_socket_pair();
      ipc::send_message(sender.get(), bytes);
      const int one[] = {valid.pages.fds[0].get()};
      ipc::send_message(sender.get(), valid.pages.bytes, one);
      EXPECT_THROW((void)imported.receive_pointer(receiver.get()), ipc::bad_manifest);
    }
    EXPECT_EQ(open_fd_count(), fds_before);
  }
  // A pointer message must carry no fd.
  {
    SCOPED_TRACE("an fd on the pointer message");
    const std::size_t fds_before = open_fd_count();
    {
      auto [sender, receiver] = ipc::make_socket_pair();
      const int stray[] = {valid.pages.fds[0].get()};
      ipc::send_message(sender.get(), bytes, stray);
      ipc::send_manifest(sender.get(), valid.pages);
      EXPECT_THROW((void)imported.receive_pointer(receiver.get()), ipc::protocol_error);
    }
    EXPECT_EQ(open_fd_count(), fds_before);
  }
  // After all of that, the pointer itself imports.
  ipc::imported_pointer fine = this->share_here(imported, p, n);
  EXPECT_EQ(this->contents(fine.data(), n, this->importer_provider_.get()), pattern(n, 600));
  fine.reset();
  this->resource_->deallocate_sync(p, n);
}

TYPED_TEST(resource_sharing, a_page_the_importer_still_maps_with_other_memory_is_refused) {
  // The exporter frees and trims an allocation this process still holds, then allocates
  // again at the same place with new pages: the importer must not show its old pages there.
  // A cache changes nothing for pages in use.
  for (const std::size_t keep : {std::size_t{0}, 64 * mib}) {
    SCOPED_TRACE(keep);
    ipc::imported_resource imported = this->import_here({.keep_mapped_bytes = keep});
    const std::size_t n = 3 * mib;
    void* p = this->allocate_filled(n, 700);
    ipc::imported_pointer held = this->share_here(imported, p, n);
    void* q = this->reallocate_with_new_pages(p, n, 701);
    const ipc::exported_pointer exported = this->exporter_->export_pointer(q, n);
    this->expect_refused(imported, exported.bytes, exported.pages,
                         "it freed an allocation this process had not let go of");
    EXPECT_EQ(this->contents(held.data(), n, this->importer_provider_.get()),
              pattern(n, 700));  // still the old memory
    held.reset();                // with a cache, its pages stay mapped, unused
    ipc::imported_pointer fresh = this->share_here(imported, q, n);
    EXPECT_EQ(this->contents(fresh.data(), n, this->importer_provider_.get()), pattern(n, 701));
    fresh.reset();
    this->resource_->deallocate_sync(q, n);
  }
}

TYPED_TEST(resource_sharing, a_segment_larger_than_the_limit_is_refused_before_anything_is_reserved) {
  void* p = this->allocate_filled(mib, 800);
  const ipc::exported_pointer exported = this->exporter_->export_pointer(p, mib);
  ipc::imported_resource small =
      this->import_here({.max_size_limit = exported.description.segment_size - this->granularity_});
  const address_space_usage before = this->importer_provider_->address_space().usage();
  const std::size_t fds_before = open_fd_count();
  {
    auto [sender, receiver] = ipc::make_socket_pair();
    ipc::send_pointer(sender.get(), exported);
    expect_error<invalid_argument>([&] { (void)small.receive_pointer(receiver.get()); }, "max_size_limit");
  }
  EXPECT_EQ(this->importer_provider_->address_space().usage(), before);
  EXPECT_EQ(open_fd_count(), fds_before);
  // The default limit, four times the memory, holds any arena of a default resource.
  ipc::imported_resource default_limit = this->import_here();
  ipc::imported_pointer fine = this->share_here(default_limit, p, mib);
  EXPECT_NE(fine.data(), nullptr);
  fine.reset();
  this->resource_->deallocate_sync(p, mib);
}

TYPED_TEST(resource_sharing, a_read_only_grant_is_kept) {
  ipc::resource_exporter read_only(*this->resource_, {.grant = access_mode::read_only});
  EXPECT_EQ(read_only.export_resource().grant, access_mode::read_only);
  expect_error<invalid_argument>(
      [&] {
        ipc::imported_resource refused(read_only.export_resource(), {.provider = this->importer_provider_});
      },
      "granted read-only");
  ipc::imported_resource imported(read_only.export_resource(),
                                  {.access = access_mode::read_only, .provider = this->importer_provider_});
  void* p = this->allocate_filled(mib, 900);
  auto [sender, receiver] = ipc::make_socket_pair();
  ipc::send_pointer(sender.get(), read_only.export_pointer(p, mib));
  ipc::imported_pointer shared = imported.receive_pointer(receiver.get());
  EXPECT_EQ(this->contents(shared.data(), mib, this->importer_provider_.get()), pattern(mib, 900));
  // A pointer of the same memory from another export of it (granted more): refused.
  ipc::send_pointer(sender.get(), this->exporter_->export_pointer(p, mib));
  EXPECT_THROW((void)imported.receive_pointer(receiver.get()), ipc::protocol_error);
  shared.reset();
  this->resource_->deallocate_sync(p, mib);
}

TYPED_TEST(resource_sharing, an_importer_that_dies_leaves_the_exporter_unharmed) {
  const std::size_t n = 6 * mib + 7;
  void* p = this->allocate_filled(n, 1000);
  {
    auto peer = this->spawn();
    EXPECT_EQ(this->send_to(*peer, 0, p, n).checksum, this->checksum_at(p, n));
    send_command(peer->process.socket(), {resource_peer_op::die, 0, 0});
    const int status = peer->process.wait();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    EXPECT_THROW((void)receive_resource_report(peer->process.socket()), ipc::peer_closed);
  }
  EXPECT_EQ(this->contents(p, n), pattern(n, 1000));
  // The resource goes on: frees, trims, allocates, and shares with a new importer.
  this->resource_->deallocate_sync(p, n);
  this->resource_->trim_to(0);
  EXPECT_EQ(this->resource_->statistics().reserved_current, 0u);
  void* q = this->allocate_filled(n, 1001);
  auto peer = this->spawn();
  EXPECT_EQ(this->send_to(*peer, 0, q, n).checksum, this->checksum_at(q, n));
  EXPECT_TRUE(this->command(*peer, resource_peer_op::release).same_usage(peer->baseline));
  this->resource_->deallocate_sync(q, n);
}

TYPED_TEST(resource_sharing, a_consumer_fills_each_pointer_in_stream_order_and_lets_go_before_the_free) {
  auto peer = this->spawn();
  const owned_stream stream(this->provider_->executor());
  std::optional<ipc::handoff_producer> producer;
  for (std::uint32_t round = 1; round <= 3; ++round) {
    SCOPED_TRACE(round);
    const std::size_t n = round * mib + 1000 * round;
    void* p = this->resource_->allocate(stream.get(), n);
    this->provider_->executor().fill(p, 0, n, stream.get());  // the exporter's work on it, queued
    (void)this->send_to(*peer, 0, p, n);
    send_command(peer->process.socket(), {resource_peer_op::consume, 0, 0x40 + round});
    if (!producer) producer.emplace(peer->process.socket(), this->provider_);
    producer->publish(stream.get());        // the peer's stream waits for the fill above
    producer->wait_consumed(stream.get());  // this stream waits for the peer's fill
    const resource_peer_report report = receive_resource_report(peer->process.socket());
    EXPECT_EQ(report.pointers, 0u);  // it let go before it finished
    std::vector<std::uint8_t> seen(n);
    this->provider_->executor().copy(seen.data(), p, n, stream.get());
    this->provider_->executor().synchronize(stream.get());
    EXPECT_EQ(seen, std::vector<std::uint8_t>(n, static_cast<std::uint8_t>(0x40 + round)));
    this->resource_->deallocate(stream.get(), p, n);
  }
  EXPECT_EQ(producer->rounds(), 3u);
  EXPECT_TRUE(this->command(*peer, resource_peer_op::report).same_usage(peer->baseline));
  peer->process.close_socket();
  EXPECT_TRUE(exited_cleanly(peer->process.wait()));
}

// ---- the cache of let-go pages (resource_import_options::keep_mapped_bytes) -----------------

TYPED_TEST(resource_sharing, with_a_cache_a_pointer_let_go_of_imports_again_with_no_page_imported) {
  const std::size_t g = this->granularity_;
  const std::size_t n = 5 * mib + 3;
  void* p = this->allocate_filled(n, 1100);
  const std::size_t pages = this->resource_->pages_of(p, n).pages.size();
  auto peer = this->spawn(pages * g);
  resource_peer_report report = this->send_to(*peer, 0, p, n);
  EXPECT_EQ(report.checksum, this->checksum_at(p, n));
  EXPECT_EQ(report.pages_imported, pages);
  report = this->command(*peer, resource_peer_op::release);
  EXPECT_EQ(report.pointers, 0u);
  EXPECT_EQ(report.pages_mapped, pages);  // kept, unused
  EXPECT_EQ(report.cached_bytes, pages * g);
  EXPECT_EQ(report.pages_released, 0u);
  EXPECT_EQ(report.mappings - peer->baseline.mappings, pages);

  write_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(p), pattern(n, 1101));
  report = this->send_to(*peer, 0, p, n);
  EXPECT_EQ(report.checksum, this->checksum_at(p, n));  // the new bytes, through the kept mapping
  EXPECT_EQ(report.pages_imported, pages);              // no page imported the second time
  EXPECT_EQ(report.pages_reused, pages);
  EXPECT_EQ(report.pages_shared, 0u);
  EXPECT_EQ(report.cached_bytes, 0u);
  EXPECT_EQ(report.mappings - peer->baseline.mappings, pages);

  report = this->command(*peer, resource_peer_op::release);
  EXPECT_EQ(report.cached_bytes, pages * g);
  report = this->command(*peer, resource_peer_op::trim);
  EXPECT_EQ(report.cached_bytes, 0u);
  EXPECT_EQ(report.pages_mapped, 0u);
  EXPECT_EQ(report.segments, 0u);
  EXPECT_EQ(report.pages_released, pages);
  EXPECT_TRUE(report.same_usage(peer->baseline))
      << "ranges " << report.ranges << " handles " << report.handles << " mappings " << report.mappings;
  this->resource_->deallocate_sync(p, n);
}

TYPED_TEST(resource_sharing, with_a_cache_a_page_the_exporter_replaced_is_retired_and_the_new_one_imported) {
  const std::size_t g = this->granularity_;
  ipc::imported_resource imported = this->import_here({.keep_mapped_bytes = 64 * mib});
  const address_space_usage before = this->importer_provider_->address_space().usage();
  const std::size_t n = 3 * mib;
  void* p = this->allocate_filled(n, 1200);
  const std::size_t pages = this->resource_->pages_of(p, n).pages.size();
  this->share_here(imported, p, n).reset();
  ASSERT_EQ(imported.statistics().cached_bytes, pages * g);
  // The exporter frees it (the importer let go) and puts new pages at the same place.
  void* q = this->reallocate_with_new_pages(p, n, 1201);

  ipc::imported_pointer fresh = this->share_here(imported, q, n);
  EXPECT_EQ(this->contents(fresh.data(), n, this->importer_provider_.get()), pattern(n, 1201));
  ipc::imported_resource_statistics s = imported.statistics();
  EXPECT_EQ(s.pages_released, pages);  // the old pages, retired
  EXPECT_EQ(s.pages_imported, 2 * pages);
  EXPECT_EQ(s.pages_reused, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.pages_mapped, pages);
  fresh.reset();
  imported.trim();
  collect_retired(true);
  s = imported.statistics();
  EXPECT_EQ(s.pages_mapped, 0u);
  EXPECT_EQ(s.pages_released, 2 * pages);
  this->resource_->deallocate_sync(q, n);
  EXPECT_EQ(this->importer_usage(), before);
}

TYPED_TEST(resource_sharing, the_cache_keeps_at_most_its_bound_and_gives_up_the_least_recently_let_go_first) {
  const std::size_t g = this->granularity_;
  const std::size_t bound = 2 * g + g / 2;  // two pages
  ipc::imported_resource imported = this->import_here({.keep_mapped_bytes = bound});
  const address_space_usage before = this->importer_provider_->address_space().usage();
  // Three allocations of one page each.
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::uint32_t i = 0; i < 3; ++i) {
    void* p = this->resource_->allocate_sync(g, g);
    write_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(p), pattern(g, 1300 + i));
    blocks.emplace_back(p, g);
    ASSERT_EQ(this->resource_->pages_of(p, g).pages.size(), 1u);
  }
  ASSERT_EQ(this->pages_under(blocks).size(), 3u);
  const auto take = [&](std::uint32_t i) {
    ipc::imported_pointer shared = this->share_here(imported, blocks[i].first, g);
    EXPECT_EQ(this->contents(shared.data(), g, this->importer_provider_.get()), pattern(g, 1300 + i));
    EXPECT_LE(imported.statistics().cached_bytes, bound);
    return shared;
  };
  const auto let_go = [&](ipc::imported_pointer& shared) {
    shared.reset();
    collect_retired(true);
    EXPECT_LE(imported.statistics().cached_bytes, bound);
  };
  std::vector<ipc::imported_pointer> held;
  for (std::uint32_t i = 0; i < 3; ++i) held.push_back(take(i));
  for (ipc::imported_pointer& shared : held) let_go(shared);  // 0, then 1, then 2
  ipc::imported_resource_statistics s = imported.statistics();
  EXPECT_EQ(s.cached_bytes, 2 * g);
  EXPECT_EQ(s.pages_mapped, 2u);
  EXPECT_EQ(s.pages_released, 1u);  // block 0, let go of first
  EXPECT_EQ(s.pages_imported, 3u);

  // Blocks 1 and 2 come from the cache, block 0 is imported again.
  held[1] = take(1);
  held[2] = take(2);
  s = imported.statistics();
  EXPECT_EQ(s.pages_reused, 2u);
  EXPECT_EQ(s.pages_imported, 3u);
  EXPECT_EQ(s.cached_bytes, 0u);
  held[0] = take(0);
  EXPECT_EQ(imported.statistics().pages_imported, 4u);

  // Let go in another order: 2, 0, 1. Block 2 goes first out of the cache.
  for (const std::uint32_t i : {2u, 0u, 1u}) let_go(held[i]);
  s = imported.statistics();
  EXPECT_EQ(s.cached_bytes, 2 * g);
  EXPECT_EQ(s.pages_released, 2u);
  held[0] = take(0);
  held[1] = take(1);
  EXPECT_EQ(imported.statistics().pages_reused, 4u);
  EXPECT_EQ(imported.statistics().pages_imported, 4u);
  held[2] = take(2);
  EXPECT_EQ(imported.statistics().pages_imported, 5u);

  for (ipc::imported_pointer& shared : held) let_go(shared);
  imported.trim();
  collect_retired(true);
  EXPECT_EQ(imported.statistics().pages_mapped, 0u);
  for (const auto& [p, n] : blocks) this->resource_->deallocate_sync(p, n);
  EXPECT_EQ(this->importer_usage(), before);
}

TYPED_TEST(resource_sharing, trim_gives_back_every_cached_page_and_the_exporters_memory_goes) {
  const std::size_t fds_before = open_fd_count();
  const std::size_t mappings_before = memfd_mapping_count();
  ipc::imported_resource imported = this->import_here({.keep_mapped_bytes = 64 * mib});
  const address_space_usage before = this->importer_provider_->address_space().usage();
  const std::vector<std::size_t> sizes = {7 * mib + 1, 40 * kib};
  std::vector<std::pair<void*, std::size_t>> held;
  for (std::uint32_t i = 0; i < sizes.size(); ++i) {
    held.emplace_back(this->allocate_filled(sizes[i], 1400 + i), sizes[i]);
    this->share_here(imported, held[i].first, sizes[i]).reset();
  }
  const std::size_t distinct = this->pages_under(held).size();
  EXPECT_EQ(imported.statistics().cached_bytes, distinct * this->granularity_);
  EXPECT_EQ(imported.statistics().pages_mapped, distinct);

  for (const auto& [p, n] : held) this->resource_->deallocate_sync(p, n);
  this->resource_->trim_to(0);
  this->exporter_->purge();
  EXPECT_EQ(this->resource_->statistics().reserved_current, 0u);
  if (this->provider_->capabilities().where.kind == memory_kind::os_host) {
    EXPECT_GT(memfd_mapping_count(), mappings_before);  // the cache still maps the memory
  }

  EXPECT_EQ(expect_trimmed_to_nothing(imported).pages_released, distinct);
  EXPECT_EQ(this->importer_usage(), before);
  EXPECT_EQ(open_fd_count(), fds_before);
  EXPECT_EQ(memfd_mapping_count(), mappings_before);
}

TYPED_TEST(resource_sharing, destroying_the_imported_resource_gives_its_cache_back) {
  const std::size_t g = this->granularity_;
  const address_space_usage before = this->importer_usage();
  void* p = this->resource_->allocate_sync(2 * g, g);
  void* q = this->resource_->allocate_sync(2 * g, g);
  ASSERT_EQ(this->pages_under({{p, 2 * g}, {q, 2 * g}}).size(), 4u);
  // On a GPU the exporter's four pages are in the same address space: the importer's
  // mappings are counted from here.
  const address_space_usage exported = this->importer_provider_->address_space().usage();
  ipc::imported_pointer kept;
  {
    ipc::imported_resource imported = this->import_here({.keep_mapped_bytes = 64 * mib});
    this->share_here(imported, p, 2 * g).reset();
    kept = this->share_here(imported, q, 2 * g);
    ASSERT_EQ(imported.statistics().cached_bytes, 2 * g);
    EXPECT_EQ(this->importer_provider_->address_space().usage().mappings, exported.mappings + 4);
  }
  collect_retired(true);
  EXPECT_EQ(this->importer_provider_->address_space().usage().mappings, exported.mappings + 2);  // kept's own
  kept.reset();  // as with no cache: unmapped
  collect_retired(true);
  this->resource_->deallocate_sync(p, 2 * g);
  this->resource_->deallocate_sync(q, 2 * g);
  EXPECT_EQ(this->importer_usage(), before);
}

TYPED_TEST(resource_sharing, threads_export_import_and_let_go_at_once) {
  // Without a cache, and with one that holds a few pages (evicting often).
  for (const std::size_t keep : {std::size_t{0}, 3 * this->granularity_}) {
    SCOPED_TRACE(keep);
    ipc::imported_resource imported = this->import_here({.keep_mapped_bytes = keep});
    const address_space_usage before = this->importer_provider_->address_space().usage();
    constexpr int threads = 4;
    constexpr int rounds = 12;
    std::vector<std::thread> workers;
    std::atomic<int> wrong{0};
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        std::mt19937 random(static_cast<std::uint32_t>(t));
        auto [sender, receiver] = ipc::make_socket_pair();
        for (int round = 0; round < rounds; ++round) {
          const std::size_t n = 1 + random() % (3 * mib);
          const auto seed = static_cast<std::uint32_t>(t * 1000 + round);
          void* p = this->resource_->allocate_sync(n);
          write_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(p), pattern(n, seed));
          ipc::send_pointer(sender.get(), this->exporter_->export_pointer(p, n));
          ipc::imported_pointer shared = imported.receive_pointer(receiver.get());
          if (read_bytes(*this->importer_provider_, reinterpret_cast<std::uintptr_t>(shared.data()), n) !=
              pattern(n, seed))
            ++wrong;
          shared.reset();
          this->resource_->deallocate_sync(p, n);
        }
      });
    for (std::thread& worker : workers) worker.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_LE(imported.statistics().cached_bytes, keep);
    (void)expect_trimmed_to_nothing(imported);
    EXPECT_EQ(this->resource_->statistics().allocations, 0u);
    EXPECT_EQ(this->importer_usage(), before);
  }
}

}  // namespace
}  // namespace vmm::testing
