// Sharing buffers between processes with vmm::ipc: the manifest format, the export cache,
// import with the exporter's layout, live growth, read-only grants, lifetimes, the
// stream-ordered hand-off, fabric-handle fallback, and every kind of bad input.
//
// The second process is tests/helpers/ipc_peer.cpp, started with posix_spawn (never fork
// after CUDA is initialised) with one end of a socket pair as its descriptor 3. The typed
// suite runs on every provider; GPU kinds skip with the reason where there is no GPU, and
// kinds whose memory cannot be exported (pinned host) skip the sharing tests and check
// that the exporter refuses them. Every error test counts the entries of /proc/self/fd
// (and, on the OS provider, the memfd mappings in /proc/self/maps) before and after.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "helpers/ipc_peer_protocol.hpp"
#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/address_range.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_view.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/ipc/interprocess_event.hpp"
#include "vmm/ipc/exporter.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/handoff.hpp"
#include "vmm/ipc/importer.hpp"
#include "vmm/ipc/manifest.hpp"
#include "vmm/ipc/protocol_error.hpp"
#include "vmm/mapping.hpp"
#include "vmm/physical_allocation.hpp"
#include "vmm/retirement.hpp"

namespace vmm::testing {
namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

std::size_t open_fd_count() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

// Mappings of the OS provider's memfds (named "vmm"): what "nothing mapped" means there.
std::size_t memfd_mapping_count() {
  std::ifstream maps("/proc/self/maps");
  std::size_t count = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("/memfd:vmm") != std::string::npos) ++count;
  return count;
}

std::uint64_t checksum_of(const std::vector<std::uint8_t>& bytes) {
  return checksum(bytes.data(), bytes.size());
}

// ---- the wire format, without any provider ----------------------------------------------

template <class T>
std::vector<std::byte> patched(std::vector<std::byte> bytes, std::size_t at, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    bytes.at(at + i) = static_cast<std::byte>(static_cast<std::uint64_t>(value) >> (8 * i));
  return bytes;
}

struct forgery {
  std::string name;
  std::vector<std::byte> bytes;
  std::string says;  // a piece of the message that must name the problem
};

// Forged variants of `valid`: the bytes of a whole manifest of two chunks of `g` bytes,
// of memory of kind `kind`.
std::vector<forgery> forgeries(const std::vector<std::byte>& valid, std::uint64_t g, memory_kind kind) {
  constexpr std::size_t h = ipc::manifest_header_bytes;
  constexpr std::size_t e = ipc::manifest_chunk_bytes;
  const auto other_kind =
      static_cast<std::uint8_t>(kind == memory_kind::os_host ? memory_kind::device : memory_kind::os_host);
  return {
      {"bad magic", patched<std::uint32_t>(valid, 0, 0xdeadbeef), "magic"},
      {"unknown kind", patched<std::uint8_t>(valid, 6, 3), "kind"},
      {"grant none", patched<std::uint8_t>(valid, 7, 0), "grant"},
      {"grant unknown", patched<std::uint8_t>(valid, 7, 9), "grant"},
      {"more chunks than bytes", patched<std::uint32_t>(valid, 8, 3), "truncated"},
      {"fewer chunks than bytes", patched<std::uint32_t>(valid, 8, 1), "after the last"},
      {"absurd chunk count", patched<std::uint32_t>(valid, 8, 0xffffffff), "at most"},
      {"unknown location kind", patched<std::uint8_t>(valid, 12, 7), "location kind"},
      {"reserved header byte", patched<std::uint8_t>(valid, 13, 1), "reserved"},
      {"reserved header word", patched<std::uint32_t>(valid, 20, 1), "reserved"},
      {"negative location id", patched<std::uint32_t>(valid, 16, 0xffffffff), "negative"},
      {"granularity not a power of two", patched<std::uint64_t>(valid, 32, g + 4096), "granularity"},
      {"granularity zero", patched<std::uint64_t>(valid, 32, 0), "granularity"},
      {"max size below the chunks", patched<std::uint64_t>(valid, 40, g), "max size"},
      {"max size zero", patched<std::uint64_t>(valid, 40, 0), "max size"},
      {"base offset unaligned", patched<std::uint64_t>(valid, 48, 4096), "base offset"},
      {"whole manifest not starting at 0", patched<std::uint64_t>(valid, 56, g), "offset 0"},
      {"end not where the chunks end", patched<std::uint64_t>(valid, 64, 3 * g), "end"},
      {"size past the end", patched<std::uint64_t>(valid, 72, 5 * g), "size"},
      {"zero-sized chunk", patched<std::uint64_t>(valid, h + 8, 0), "size 0"},
      {"chunk size not a multiple of the granularity", patched<std::uint64_t>(valid, h + 8, g + 4096),
       "multiple"},
      {"gap between chunks", patched<std::uint64_t>(valid, h + e, 2 * g), "gap"},
      {"overlapping chunks", patched<std::uint64_t>(valid, h + e, 0), "overlap"},
      {"chunk sizes that overflow", patched<std::uint64_t>(valid, h + 8, ~(g - 1)), "runs past"},
      {"chunk of another kind of memory", patched<std::uint8_t>(valid, h + 16, other_kind), "memory"},
      {"unknown chunk location kind", patched<std::uint8_t>(valid, h + 16, 9), "location kind"},
      {"unknown handle kind", patched<std::uint8_t>(valid, h + 17, 9), "handle kind"},
      {"no handle kind", patched<std::uint8_t>(valid, h + 17, 0), "handle kind"},
      {"reserved chunk bytes", patched<std::uint16_t>(valid, h + 18, 1), "reserved"},
      {"fabric chunk without its handle bytes", patched<std::uint8_t>(valid, h + e + 17, 2), "truncated"},
  };
}

ipc::manifest two_chunk_manifest(std::uint64_t g) {
  ipc::manifest m;
  m.where = location::os_host();
  m.buffer_id = 0x1234;
  m.granularity = g;
  m.max_size = 8 * g;
  m.end = 2 * g;
  m.size = 2 * g - 100;
  m.chunks = {{0, g, location::os_host(), handle_kind::posix_fd, {}},
              {g, g, location::os_host(), handle_kind::posix_fd, {}}};
  return m;
}

// A bad manifest comes from a peer that broke the protocol, never from a bad argument.
static_assert(std::is_base_of_v<ipc::protocol_error, ipc::bad_manifest>);
static_assert(!std::is_base_of_v<std::invalid_argument, ipc::protocol_error>);

TEST(manifest_format, every_field_round_trips) {
  ipc::manifest m = two_chunk_manifest(2 * mib);
  m.kind = ipc::manifest_kind::growth;
  m.start = 2 * mib;
  m.chunks[0].offset = 2 * mib;
  m.chunks[1].offset = 4 * mib;
  m.end = 6 * mib;
  m.grant = access_mode::read_only;
  m.base_offset = 6 * mib;
  const auto bytes = ipc::serialize(m);
  EXPECT_EQ(bytes.size(), ipc::manifest_header_bytes + 2 * ipc::manifest_chunk_bytes);
  EXPECT_EQ(ipc::parse_manifest(bytes), m);
  EXPECT_EQ(m.fd_count(), 2u);
}

TEST(manifest_format, fabric_handles_travel_inside_the_manifest) {
  ipc::manifest m = two_chunk_manifest(2 * mib);
  m.where = m.chunks[0].where = m.chunks[1].where = location::device(0);
  m.chunks[1].handle = handle_kind::fabric;
  for (std::size_t i = 0; i < m.chunks[1].fabric.bytes.size(); ++i)
    m.chunks[1].fabric.bytes[i] = static_cast<std::byte>(i + 1);
  const auto bytes = ipc::serialize(m);
  EXPECT_EQ(bytes.size(),
            ipc::manifest_header_bytes + 2 * ipc::manifest_chunk_bytes + ipc::manifest_fabric_handle_bytes);
  EXPECT_EQ(ipc::parse_manifest(bytes), m);
  EXPECT_EQ(m.fd_count(), 1u);
}

TEST(manifest_format, a_manifest_with_no_chunks_is_whole_and_empty) {
  ipc::manifest m = two_chunk_manifest(2 * mib);
  m.chunks.clear();
  m.end = m.size = 0;
  EXPECT_EQ(ipc::parse_manifest(ipc::serialize(m)), m);
}

TEST(manifest_format, every_truncation_is_refused) {
  const auto valid = ipc::serialize(two_chunk_manifest(2 * mib));
  for (std::size_t length = 0; length < valid.size(); ++length) {
    SCOPED_TRACE(length);
    EXPECT_THROW((void)ipc::parse_manifest(std::span(valid).first(length)), ipc::bad_manifest);
  }
}

TEST(manifest_format, trailing_bytes_are_refused) {
  auto bytes = ipc::serialize(two_chunk_manifest(2 * mib));
  bytes.push_back(std::byte{0});
  EXPECT_THROW((void)ipc::parse_manifest(bytes), ipc::bad_manifest);
}

TEST(manifest_format, every_forgery_is_refused_with_a_message_that_names_it) {
  const auto valid = ipc::serialize(two_chunk_manifest(2 * mib));
  for (const forgery& forged : forgeries(valid, 2 * mib, memory_kind::os_host)) {
    SCOPED_TRACE(forged.name);
    try {
      (void)ipc::parse_manifest(forged.bytes);
      ADD_FAILURE() << "parsed";
    } catch (const ipc::bad_manifest& error) {
      EXPECT_NE(std::string(error.what()).find(forged.says), std::string::npos) << error.what();
    }
  }
}

TEST(manifest_format, an_unknown_version_is_refused_by_name) {
  const auto bytes = patched<std::uint16_t>(ipc::serialize(two_chunk_manifest(2 * mib)), 4, 2);
  try {
    (void)ipc::parse_manifest(bytes);
    ADD_FAILURE() << "parsed";
  } catch (const ipc::bad_manifest& error) {
    EXPECT_NE(std::string(error.what()).find("version 2 is not supported"), std::string::npos)
        << error.what();
  }
  // Whatever follows the version: a later version may lay it out differently.
  EXPECT_THROW((void)ipc::parse_manifest(std::span(bytes).first(8)), ipc::bad_manifest);
}

TEST(manifest_format, serialize_refuses_what_parse_would_refuse) {
  ipc::manifest gap = two_chunk_manifest(2 * mib);
  gap.chunks[1].offset = 4 * mib;
  EXPECT_THROW((void)ipc::serialize(gap), ipc::bad_manifest);
  ipc::manifest stray_fabric_bytes = two_chunk_manifest(2 * mib);
  stray_fabric_bytes.chunks[0].fabric.bytes[0] = std::byte{1};
  EXPECT_THROW((void)ipc::serialize(stray_fabric_bytes), ipc::bad_manifest);
  ipc::manifest no_access = two_chunk_manifest(2 * mib);
  no_access.grant = access_mode::none;
  EXPECT_THROW((void)ipc::serialize(no_access), ipc::bad_manifest);
}

// ---- the typed suite ----------------------------------------------------------------------

template <class Kind>
class ipc_sharing : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->IsSkipped()) return;
    // Chunks go back to the provider as soon as a buffer lets go of them, so that fd
    // counts return to their baselines.
    pool_ = chunk_pool::create(this->provider_, {.release_threshold = 0});
  }

  [[nodiscard]] bool exportable() const {
    return this->provider_->capabilities().export_kind != handle_kind::none;
  }

  // A buffer of `chunks` chunks of one granularity each, holding pattern(seed) over them.
  growable_buffer make_buffer(std::size_t chunks, std::uint32_t seed, std::size_t max_chunks = 16) {
    const std::size_t g = this->granularity_;
    growable_buffer buffer(pool_, {.max_size = max_chunks * g, .policy = chunk_policy::fixed(g)});
    buffer.resize(chunks * g);
    write_bytes(*this->provider_, address(buffer), pattern(chunks * g, seed));
    return buffer;
  }

  static std::uintptr_t address(const growable_buffer& buffer) {
    return reinterpret_cast<std::uintptr_t>(buffer.data());
  }
  std::vector<std::uint8_t> contents(const void* data, std::size_t n) const {
    return read_bytes(*this->provider_, reinterpret_cast<std::uintptr_t>(data), n);
  }
  std::uint64_t checksum_of_buffer(const growable_buffer& buffer) const {
    return checksum_of(contents(buffer.data(), buffer.size()));
  }

  // The peer for this kind of memory; granularity 0: its default provider's.
  peer_process spawn(const std::vector<std::string>& args, std::size_t granularity = 0) const {
    std::vector<std::string> argv{VMM_IPC_PEER_PATH, Kind::name, std::to_string(granularity)};
    argv.insert(argv.end(), args.begin(), args.end());
    return peer_process(std::move(argv));
  }

  // Sends `payload` with `fds` to this process and imports it: Error must be thrown, and
  // afterwards this process holds exactly the fds (and OS memfd mappings) it held before.
  template <class Error>
  void expect_refused(std::span<const std::byte> payload, std::span<const int> fds, const std::string& what,
                      access_mode access = access_mode::read_write) {
    SCOPED_TRACE(what);
    const std::size_t fds_before = open_fd_count();
    const std::size_t mappings_before = memfd_mapping_count();
    {
      auto [sender, receiver] = ipc::make_socket_pair();
      ipc::send_message(sender.get(), payload, fds);
      EXPECT_THROW((void)ipc::imported_buffer::receive(receiver.get(),
                                                       {.access = access, .provider = this->provider_}),
                   Error);
    }
    EXPECT_EQ(open_fd_count(), fds_before);
    EXPECT_EQ(memfd_mapping_count(), mappings_before);
  }

  // One export, import, reservation and mapping, so that whatever the driver opens on its
  // first use of them is open before a test takes its baseline.
  void warm_up_import() {
    const physical_allocation memory(this->provider_, this->granularity_);
    const unique_fd fd = memory.export_fd();
    const physical_allocation imported =
        physical_allocation::import_fd(this->provider_, fd.get(), this->granularity_);
    const address_range range(this->provider_, this->granularity_);
    const mapping mapped(imported, range.address(), access_mode::read_write);
  }

  std::shared_ptr<chunk_pool> pool_;
};
// Sharing needs memory that can be exported: the OS provider's and the GPU's. Pinned host
// memory cannot be (the driver exports no HOST_NUMA handle); the every-kind suite below
// checks that it is refused, and the tests that need no export run on it too.
TYPED_TEST_SUITE(ipc_sharing, exportable_memory_kinds, memory_kind_names);
template <class Kind>
class ipc_sharing_every_kind : public ipc_sharing<Kind> {};
TYPED_TEST_SUITE(ipc_sharing_every_kind, all_memory_kinds, memory_kind_names);

TYPED_TEST(ipc_sharing_every_kind, unexportable_memory_is_refused_by_the_exporter) {
  growable_buffer buffer = this->make_buffer(1, 1);
  ipc::exporter exporter;
  if (this->exportable()) {
    EXPECT_EQ(exporter.export_buffer(buffer).description.chunks.size(), 1u);
  } else {
    EXPECT_EQ(this->provider_->capabilities().export_kind, handle_kind::none);
    EXPECT_THROW((void)exporter.export_buffer(buffer), invalid_argument);
    EXPECT_EQ(exporter.statistics().handles_exported, 0u);
  }
}

TYPED_TEST(ipc_sharing, a_whole_buffer_maps_in_another_process_with_the_same_bytes) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(3, 2);
  buffer.resize(3 * g - 100);  // the manifest carries size() besides what is mapped
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_buffer(buffer);
  EXPECT_EQ(exported.description.chunks.size(), 3u);
  EXPECT_EQ(exported.description.max_size, buffer.max_size());
  EXPECT_EQ(exported.description.size, 3 * g - 100);
  peer_process peer = this->spawn({"import", "rw"});
  ipc::send_manifest(peer.socket(), exported);
  const peer_report report = receive_report(peer.socket());
  EXPECT_TRUE(exited_cleanly(peer.wait()));
  EXPECT_EQ(report.size, 3 * g - 100);
  EXPECT_EQ(report.capacity, 3 * g);
  EXPECT_EQ(report.checksum, this->checksum_of_buffer(buffer));
}

TYPED_TEST(ipc_sharing, each_handle_is_exported_once_and_later_exports_reuse_the_cached_fd) {
  growable_buffer buffer = this->make_buffer(3, 3);
  ipc::exporter exporter;
  const ipc::exported_manifest first = exporter.export_buffer(buffer);
  EXPECT_EQ(exporter.statistics().handles_exported, 3u);
  EXPECT_EQ(exporter.statistics().cache_hits, 0u);
  const ipc::exported_manifest second = exporter.export_buffer(buffer);
  const ipc::exported_manifest part = exporter.export_range(buffer, this->granularity_, this->granularity_);
  const ipc::export_statistics statistics = exporter.statistics();
  EXPECT_EQ(statistics.handles_exported, 3u);
  EXPECT_EQ(statistics.cache_hits, 4u);
  EXPECT_EQ(statistics.cached_chunks, 3u);
  ASSERT_EQ(second.fds.size(), first.fds.size());
  for (std::size_t i = 0; i < first.fds.size(); ++i) {
    // Distinct descriptors (each manifest owns its own), one open file description.
    EXPECT_NE(first.fds[i].get(), second.fds[i].get());
    struct stat a {};
    struct stat b {};
    ASSERT_EQ(::fstat(first.fds[i].get(), &a), 0);
    ASSERT_EQ(::fstat(second.fds[i].get(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino);
    EXPECT_EQ(a.st_dev, b.st_dev);
  }
  if (!first.fds.empty()) {
    struct stat a {};
    struct stat b {};
    ASSERT_EQ(::fstat(first.fds[1].get(), &a), 0);
    ASSERT_EQ(::fstat(part.fds[0].get(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino);
  }
}

TYPED_TEST(ipc_sharing, cache_entries_go_when_their_chunks_die) {
  this->warm_up_import();
  ipc::exporter exporter;
  const std::size_t fds_before = open_fd_count();
  {
    growable_buffer buffer = this->make_buffer(2, 4);
    (void)exporter.export_buffer(buffer);
    EXPECT_EQ(exporter.statistics().cached_chunks, 2u);
    exporter.purge();  // the chunks live: nothing to drop
    EXPECT_EQ(exporter.statistics().cached_chunks, 2u);
  }
  exporter.purge();
  const ipc::export_statistics statistics = exporter.statistics();
  EXPECT_EQ(statistics.cached_chunks, 0u);
  EXPECT_EQ(statistics.entries_dropped, 2u);
  EXPECT_EQ(open_fd_count(), fds_before);
}

TYPED_TEST(ipc_sharing, a_chunk_range_exports_with_its_offsets) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(4, 5);
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_range(buffer, g, 2 * g);
  EXPECT_EQ(exported.description.base_offset, g);
  EXPECT_EQ(exported.description.max_size, 2 * g);
  EXPECT_EQ(exported.description.chunks.size(), 2u);
  EXPECT_THROW((void)exporter.export_range(buffer, g / 2, g), invalid_argument);
  peer_process peer = this->spawn({"import", "rw"});
  ipc::send_manifest(peer.socket(), exported);
  const peer_report report = receive_report(peer.socket());
  EXPECT_TRUE(exited_cleanly(peer.wait()));
  EXPECT_EQ(report.capacity, 2 * g);
  EXPECT_EQ(report.checksum, checksum_of(this->contents(static_cast<char*>(buffer.data()) + g, 2 * g)));
}

TYPED_TEST(ipc_sharing, a_view_exports_its_chunks_in_the_views_order) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(3, 6);
  const std::size_t order[] = {2, 0};
  const chunk_view view = permute(buffer, order);
  ipc::exporter exporter;
  peer_process peer = this->spawn({"import", "rw"});
  ipc::send_manifest(peer.socket(), exporter.export_view(view));
  const peer_report report = receive_report(peer.socket());
  EXPECT_TRUE(exited_cleanly(peer.wait()));
  EXPECT_EQ(report.capacity, 2 * g);
  EXPECT_EQ(report.checksum, checksum_of(this->contents(view.data(), view.size())));
  EXPECT_THROW((void)exporter.export_view(chunk_view{}), invalid_argument);
}

TYPED_TEST(ipc_sharing, an_importer_follows_growth_at_the_same_offsets_and_address) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(1, 7);
  ipc::exporter exporter;
  peer_process peer = this->spawn({"follow", "2"});
  const ipc::exported_manifest whole = exporter.export_buffer(buffer);
  ipc::send_manifest(peer.socket(), whole);
  const peer_report first = receive_report(peer.socket());
  EXPECT_EQ(first.capacity, g);
  EXPECT_EQ(first.checksum, this->checksum_of_buffer(buffer));

  // Two more chunks, with bytes of their own; the first chunk keeps its bytes.
  buffer.resize(3 * g - 4096);
  write_bytes(*this->provider_, this->address(buffer) + g, pattern(2 * g, 8));
  const ipc::exported_manifest growth = exporter.export_growth(buffer, whole.description);
  EXPECT_EQ(growth.description.kind, ipc::manifest_kind::growth);
  EXPECT_EQ(growth.description.start, g);
  EXPECT_EQ(growth.description.chunks.size(), 2u);
  ipc::send_manifest(peer.socket(), growth);
  const peer_report second = receive_report(peer.socket());
  EXPECT_EQ(second.address, first.address);
  EXPECT_EQ(second.capacity, 3 * g);
  EXPECT_EQ(second.size, 3 * g - 4096);
  EXPECT_EQ(second.checksum, this->checksum_of_buffer(buffer));

  // Growth within what is mapped: no chunk to map, the new size arrives. The bytes written
  // meanwhile over the first chunk are seen too: the memory is shared, not copied.
  buffer.resize(3 * g);
  write_bytes(*this->provider_, this->address(buffer), pattern(g, 9));
  const ipc::exported_manifest no_chunks = exporter.export_growth(buffer, growth.description);
  EXPECT_TRUE(no_chunks.description.chunks.empty());
  ipc::send_manifest(peer.socket(), no_chunks);
  const peer_report third = receive_report(peer.socket());
  EXPECT_EQ(third.address, first.address);
  EXPECT_EQ(third.size, 3 * g);
  EXPECT_EQ(third.checksum, this->checksum_of_buffer(buffer));
  EXPECT_TRUE(exited_cleanly(peer.wait()));
  EXPECT_EQ(exporter.statistics().handles_exported, 3u);
}

// The last manifest an importer at `end` bytes of export `of` would hold.
ipc::manifest state_at(const ipc::exported_manifest& of, std::uint64_t end) {
  ipc::manifest state = of.description;
  state.end = end;
  return state;
}

TYPED_TEST(ipc_sharing, growth_is_refused_when_the_chunks_below_the_importer_changed) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(3, 10);
  growable_buffer other = this->make_buffer(1, 11);
  ipc::exporter exporter;
  ipc::exported_manifest of_other = exporter.export_buffer(other);
  EXPECT_THROW((void)exporter.export_growth(buffer, of_other.description),
               invalid_argument);  // another buffer's
  const ipc::exported_manifest whole = exporter.export_buffer(buffer);
  EXPECT_THROW((void)exporter.export_growth(buffer, state_at(whole, g / 2)),
               invalid_argument);  // not a boundary
  EXPECT_THROW((void)exporter.export_growth(other, whole.description), invalid_argument);
  buffer.resize(g);  // shrinks: chunks 1 and 2 go back to the pool
  buffer.collect_retired();
  EXPECT_THROW((void)exporter.export_growth(buffer, state_at(whole, 3 * g)),
               invalid_argument);  // past the end now
  buffer.resize(3 * g);            // new chunks at the same offsets
  EXPECT_THROW((void)exporter.export_growth(buffer, state_at(whole, 3 * g)), invalid_argument);
  // An importer of that export that maps only chunk 0 is refused too: the export shared the
  // old chunks 1 and 2, and another of its importers may map them.
  EXPECT_THROW((void)exporter.export_growth(buffer, state_at(whole, g)), invalid_argument);
  // A new export starts a generation of its own.
  const ipc::exported_manifest again = exporter.export_buffer(buffer);
  EXPECT_EQ(exporter.export_growth(buffer, again.description).description.chunks.size(), 0u);
}

// Regression (use after free): export_growth kept an iterator into the exporter's table
// of exported layouts, and the purge inside the export erased the entry it pointed to
// when the buffer had shrunk to nothing and grown again.
TYPED_TEST(ipc_sharing, growth_after_shrinking_to_nothing_is_refused_without_touching_freed_state) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(1, 13);
  ipc::exporter exporter;
  const ipc::exported_manifest whole = exporter.export_buffer(buffer);
  buffer.resize(0);
  buffer.collect_retired();
  EXPECT_THROW((void)exporter.export_growth(buffer, state_at(whole, 0)), invalid_argument);
  buffer.resize(2 * g);
  EXPECT_THROW((void)exporter.export_growth(buffer, state_at(whole, 0)), invalid_argument);
}

// Regression: the growth check compared every importer with the one layout the latest
// export had written, so an importer of an earlier export, whose chunks the buffer had
// since replaced, passed the check and kept showing the old chunks' bytes.
TYPED_TEST(ipc_sharing, each_export_is_checked_on_its_own_so_a_stale_importer_is_refused) {
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(2, 14);
  ipc::exporter exporter;
  const ipc::exported_manifest to_a = exporter.export_buffer(buffer);  // importer A: chunks 0, 1
  buffer.resize(g);
  buffer.collect_retired();
  buffer.resize(2 * g);                                                // chunk 1 replaced
  const ipc::exported_manifest to_b = exporter.export_buffer(buffer);  // importer B: the new chunk 1
  buffer.resize(3 * g);
  EXPECT_EQ(exporter.export_growth(buffer, to_b.description).description.chunks.size(), 1u);
  EXPECT_THROW((void)exporter.export_growth(buffer, to_a.description), invalid_argument);
}

TYPED_TEST(ipc_sharing, a_read_only_grant_maps_read_only_and_writes_fault) {
  growable_buffer buffer = this->make_buffer(2, 12);
  const auto before = this->contents(buffer.data(), buffer.size());
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_buffer(buffer, {.grant = access_mode::read_only});
  EXPECT_EQ(exported.description.grant, access_mode::read_only);
  peer_process peer = this->spawn({"write_read_only"});
  ipc::send_manifest(peer.socket(), exported);
  const peer_report report = receive_report(peer.socket());
  EXPECT_TRUE(exited_cleanly(peer.wait()));
  EXPECT_EQ(report.checksum, checksum_of(before));
  EXPECT_EQ(report.status, peer_status::write_faulted);
  EXPECT_EQ(this->contents(buffer.data(), buffer.size()), before);
}

// Duplicates of a manifest's fds, for an import that takes them.
std::vector<unique_fd> duplicates(const ipc::exported_manifest& exported) {
  std::vector<unique_fd> copies;
  for (const unique_fd& fd : exported.fds) copies.emplace_back(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  return copies;
}

// keep_descriptors: each posix-fd chunk keeps the fd it came from, growth included, one more
// open descriptor per chunk than the same import without it; they close with the import.
// An import without it keeps none.
TYPED_TEST(ipc_sharing, an_import_that_keeps_descriptors_holds_one_per_chunk_until_it_goes) {
  this->warm_up_import();
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(2, 14);
  ipc::exporter exporter;
  const ipc::export_options as_fds{.grant = access_mode::read_only, .handle = handle_kind::posix_fd};
  const ipc::exported_manifest whole = exporter.export_buffer(buffer, as_fds);
  buffer.resize(3 * g);
  const ipc::exported_manifest growth = exporter.export_growth(buffer, whole.description, as_fds);
  ASSERT_EQ(growth.fds.size(), 1u);
  const ipc::import_options plain{.access = access_mode::read_only, .provider = this->provider_};
  ipc::import_options keeping = plain;
  keeping.keep_descriptors = true;
  const std::size_t fds_before = open_fd_count();
  {
    ipc::imported_buffer closed(whole.description, duplicates(whole), plain);
    const std::size_t per_handle = (open_fd_count() - fds_before) / 2;  // OS memory: a memfd each
    EXPECT_FALSE(closed.keeps_descriptors());
    const std::size_t at_kept = open_fd_count();
    ipc::imported_buffer kept(whole.description, duplicates(whole), keeping);
    EXPECT_TRUE(kept.keeps_descriptors());
    EXPECT_EQ(open_fd_count() - at_kept, 2 * (per_handle + 1));
    const std::size_t at_growth = open_fd_count();
    kept.grow(growth.description, duplicates(growth));
    EXPECT_EQ(open_fd_count() - at_growth, per_handle + 1);
    closed.grow(growth.description, duplicates(growth));
    ASSERT_EQ(kept.chunk_count(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(kept.chunks()[i]->memory().keeps_descriptor()) << "chunk " << i;
      EXPECT_FALSE(closed.chunks()[i]->memory().keeps_descriptor()) << "chunk " << i;
    }
    EXPECT_EQ(this->contents(kept.data(), 3 * g), this->contents(buffer.data(), 3 * g));
    // A kept chunk exports the same memory: an import of its export shows the same bytes.
    ipc::manifest one = whole.description;
    one.chunks.resize(1);
    one.max_size = one.end = one.size = g;
    std::vector<unique_fd> again;
    again.push_back(kept.chunks()[1]->memory().export_fd());
    const ipc::imported_buffer second(one, std::move(again), plain);
    EXPECT_EQ(this->contents(second.data(), g),
              this->contents(static_cast<std::byte*>(buffer.data()) + g, g));
    // Moved, the import keeps them; the moved-from one holds none.
    ipc::imported_buffer moved = std::move(kept);
    EXPECT_TRUE(moved.keeps_descriptors());
    EXPECT_FALSE(kept.keeps_descriptors());  // NOLINT(bugprone-use-after-move): the contract under test
  }
  collect_retired(true);
  EXPECT_EQ(open_fd_count(), fds_before);
}

TYPED_TEST(ipc_sharing, read_write_access_is_refused_where_the_grant_is_read_only) {
  this->warm_up_import();
  growable_buffer buffer = this->make_buffer(2, 13);
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_buffer(buffer, {.grant = access_mode::read_only});
  std::vector<int> fds;
  for (const unique_fd& fd : exported.fds) fds.push_back(fd.get());
  this->template expect_refused<invalid_argument>(exported.bytes, fds, "read-write from a read-only grant");
  this->template expect_refused<invalid_argument>(exported.bytes, fds, "no access", access_mode::none);
}

TYPED_TEST(ipc_sharing, the_import_outlives_the_exporters_buffer_and_cache) {
  this->warm_up_import();
  peer_process peer = this->spawn({"hold"});
  const std::size_t fds_before = open_fd_count();
  const std::size_t mappings_before = memfd_mapping_count();
  std::optional<growable_buffer> buffer(this->make_buffer(2, 14));
  const std::uint64_t expected = this->checksum_of_buffer(*buffer);
  auto exporter = std::make_unique<ipc::exporter>();
  ipc::send_manifest(peer.socket(), exporter->export_buffer(*buffer));
  EXPECT_EQ(receive_report(peer.socket()).checksum, expected);
  buffer.reset();
  exporter.reset();
  // This process holds no fd, no handle and no mapping of the memory any more.
  EXPECT_EQ(open_fd_count(), fds_before);
  EXPECT_EQ(memfd_mapping_count(), mappings_before);
  send_go(peer.socket());
  EXPECT_EQ(receive_report(peer.socket()).checksum, expected);
  EXPECT_TRUE(exited_cleanly(peer.wait()));
}

TYPED_TEST(ipc_sharing, the_import_outlives_the_exporting_process) {
  const std::size_t g = this->granularity_;
  this->warm_up_import();
  peer_process peer = this->spawn({"export", "15", "3", "none"});
  const std::size_t fds_before = open_fd_count();
  const std::size_t mappings_before = memfd_mapping_count();
  {
    ipc::imported_buffer import = ipc::imported_buffer::receive(peer.socket(), {.provider = this->provider_});
    EXPECT_EQ(import.capacity(), 3 * g);
    EXPECT_EQ(import.chunk_count(), 3u);
    send_go(peer.socket());
    EXPECT_TRUE(exited_cleanly(peer.wait()));
    // The exporter is gone with its buffer and its cache; the memory is still here.
    EXPECT_EQ(this->contents(import.data(), 3 * g), pattern(3 * g, 15));
  }
  EXPECT_EQ(open_fd_count(), fds_before);
  EXPECT_EQ(memfd_mapping_count(), mappings_before);
}

TYPED_TEST(ipc_sharing, an_importer_that_dies_leaves_nothing_behind) {
  this->warm_up_import();
  const std::size_t fds_before = open_fd_count();
  const std::size_t mappings_before = memfd_mapping_count();
  {
    growable_buffer buffer = this->make_buffer(2, 16);
    const auto bytes = this->contents(buffer.data(), buffer.size());
    ipc::exporter exporter;
    peer_process peer = this->spawn({"die"});
    ipc::send_manifest(peer.socket(), exporter.export_buffer(buffer));
    EXPECT_EQ(receive_report(peer.socket()).checksum, checksum_of(bytes));
    const int status = peer.wait();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    EXPECT_THROW((void)ipc::receive_message(peer.socket()), ipc::peer_closed);
    EXPECT_EQ(this->contents(buffer.data(), buffer.size()), bytes);
    // Nothing to clean up for the importer: the cache holds this process's own entries.
    EXPECT_EQ(exporter.statistics().cached_chunks, 2u);
  }
  EXPECT_EQ(open_fd_count(), fds_before);
  EXPECT_EQ(memfd_mapping_count(), mappings_before);
}

TYPED_TEST(ipc_sharing, a_manifest_of_more_fds_than_one_message_carries_arrives_whole) {
  // Small chunks on the OS provider keep this cheap; GPUs have 2 MiB at the least.
  const bool os = this->provider_->capabilities().where.kind == memory_kind::os_host;
  const std::size_t g = os ? 4096 : this->granularity_;
  auto provider = os ? make_os_host_provider({.granularity = g}) : this->provider_;
  const std::size_t chunks = ipc::max_fds_per_message + 7;
  growable_buffer buffer(chunk_pool::create(provider, {.release_threshold = 0}),
                         {.max_size = (chunks + 1) * g, .policy = chunk_policy::fixed(g)});
  buffer.resize(chunks * g);
  write_bytes(*provider, this->address(buffer), pattern(chunks * g, 17));
  ipc::exporter exporter;
  ipc::exported_manifest exported = exporter.export_buffer(buffer);
  ASSERT_EQ(exported.fds.size(), chunks);
  peer_process peer = this->spawn({"import", "ro"}, os ? g : 0);
  ipc::send_manifest(peer.socket(), exported);
  const peer_report report = receive_report(peer.socket());
  EXPECT_TRUE(exited_cleanly(peer.wait()));
  EXPECT_EQ(report.capacity, chunks * g);
  EXPECT_EQ(report.checksum, checksum_of(read_bytes(*provider, this->address(buffer), chunks * g)));

  // The same through receive_manifest, in this process. The sent fds are closed before
  // the receive (those in flight do not count), so that OS chunks (each a memfd), the
  // cache and the received fds stay under the usual limit of 1024 descriptors.
  exported = {};
  auto [sender, receiver] = ipc::make_socket_pair();
  ipc::manifest description;
  {
    const ipc::exported_manifest again = exporter.export_buffer(buffer);  // a new generation
    description = again.description;
    ipc::send_manifest(sender.get(), again);
  }
  const ipc::received_manifest received = ipc::receive_manifest(receiver.get());
  EXPECT_EQ(received.description, description);
  EXPECT_EQ(received.fds.size(), chunks);
}

TYPED_TEST(ipc_sharing, a_consumer_reads_each_round_after_the_producer_publishes_it) {
  growable_buffer buffer = this->make_buffer(2, 18);
  ipc::exporter exporter;
  peer_process peer = this->spawn({"consume", "3"});
  ipc::send_manifest(peer.socket(), exporter.export_buffer(buffer));
  ipc::handoff_producer producer(peer.socket(), this->provider_);
  for (std::uint32_t round = 1; round <= 3; ++round) {
    SCOPED_TRACE(round);
    const auto bytes = pattern(buffer.size(), 100 + round);
    write_bytes(*this->provider_, this->address(buffer), bytes);
    producer.publish(nullptr);
    EXPECT_THROW(producer.publish(nullptr), invalid_argument);  // one round at a time
    producer.wait_consumed(nullptr);
    EXPECT_EQ(receive_report(peer.socket()).checksum, checksum_of(bytes));
  }
  EXPECT_EQ(producer.rounds(), 3u);
  EXPECT_TRUE(exited_cleanly(peer.wait()));
}

// A hand-off message as handoff.hpp's file comment lays it out: u32 magic, u32 type, u64
// round, then `extra` zero bytes.
std::vector<std::byte> handoff_message(std::uint32_t magic, std::uint32_t type, std::uint64_t round,
                                       std::size_t extra = 0) {
  std::vector<std::byte> bytes(16 + extra);
  bytes = patched<std::uint32_t>(std::move(bytes), 0, magic);
  bytes = patched<std::uint32_t>(std::move(bytes), 4, type);
  return patched<std::uint64_t>(std::move(bytes), 8, round);
}
constexpr std::uint32_t handoff_magic = 0x484d4d56;  // "VMMH"
constexpr std::uint32_t handoff_events = 1, handoff_ready = 2, handoff_done = 3;

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

TYPED_TEST(ipc_sharing, hand_off_messages_out_of_order_or_malformed_are_protocol_errors) {
  const auto consumer_given = [&](std::span<const std::byte> first, std::span<const int> fds = {}) {
    auto [producer_end, consumer_end] = ipc::make_socket_pair();
    ipc::send_message(producer_end.get(), first, fds);
    (void)ipc::handoff_consumer(consumer_end.get(), this->provider_);
  };
  const std::size_t events_extra = 2 * sizeof(ipc::interprocess_event_handle::bytes);
  const std::size_t fds_before = open_fd_count();
  expect_error<ipc::protocol_error>([&] { consumer_given(handoff_message(handoff_magic, handoff_ready, 1)); },
                                    "message type 2 where \"events\" (1) was due");
  expect_error<ipc::protocol_error>(
      [&] { consumer_given(handoff_message(0x0badf00d, handoff_events, 0, events_extra)); },
      "bad magic 0x0badf00d");
  expect_error<ipc::protocol_error>(
      [&] { consumer_given(handoff_message(handoff_magic, handoff_events, 0, 1)); },
      "a \"events\" message of 17 bytes, expected 144");
  expect_error<ipc::protocol_error>([&] { consumer_given(std::vector<std::byte>(15)); },
                                    "a message of 15 bytes where \"events\" was due");
  // Hand-off messages carry no fds; one that does is refused, and the fd closed.
  const int stray[] = {STDIN_FILENO};
  expect_error<ipc::protocol_error>(
      [&] { consumer_given(handoff_message(handoff_magic, handoff_events, 0, events_extra), stray); },
      "expected 0 descriptors but the message carries 1");
  EXPECT_EQ(open_fd_count(), fds_before);

  auto [producer_end, consumer_end] = ipc::make_socket_pair();
  ipc::handoff_producer producer(producer_end.get(), this->provider_);
  (void)ipc::receive_message(consumer_end.get(), 0);  // the events
  producer.publish(nullptr);
  ipc::send_message(consumer_end.get(), handoff_message(handoff_magic, handoff_done, 2));
  expect_error<ipc::protocol_error>([&] { producer.wait_consumed(nullptr); },
                                    "\"done\" of round 2 where round 1 was due");
}

TYPED_TEST(ipc_sharing, a_producer_waits_for_done_no_longer_than_its_timeout) {
  auto [producer_end, consumer_end] = ipc::make_socket_pair();  // the consumer never answers
  ipc::handoff_producer producer(producer_end.get(), this->provider_, std::chrono::milliseconds{200});
  producer.publish(nullptr);
  expect_error<ipc::timeout_error>([&] { producer.wait_consumed(nullptr); },
                                   "timed out with 0 of 16 header bytes received");
}

TYPED_TEST(ipc_sharing_every_kind, an_interprocess_event_records_and_waits_through_the_provider) {
  using ipc::interprocess_event;
  using ipc::interprocess_event_handle;
  interprocess_event event(this->provider_);
  EXPECT_TRUE(event.created_here());
  event.record(nullptr);
  event.enqueue_wait(nullptr);
  event.synchronize();
  EXPECT_TRUE(event.done());
  interprocess_event moved = std::move(event);
  EXPECT_FALSE(event);
  EXPECT_THROW(event.record(nullptr), invalid_argument);
  EXPECT_TRUE(moved.done());
  if (this->provider_->capabilities().where.kind == memory_kind::os_host) {
    // A host event opens anywhere and is always passed; a GPU event's handle does not open.
    interprocess_event opened = interprocess_event::open(this->provider_, moved.handle());
    EXPECT_FALSE(opened.created_here());
    EXPECT_TRUE(opened.done());
    interprocess_event_handle foreign;
    foreign.bytes.fill(std::byte{0x5a});
    EXPECT_THROW((void)interprocess_event::open(this->provider_, foreign), invalid_argument);
  }
}

TYPED_TEST(ipc_sharing_every_kind, fabric_handles_are_chosen_only_where_they_work_else_posix_fds) {
  const handle_kind kind = this->provider_->capabilities().export_kind;
  const std::string reason = this->provider_->capabilities().fabric_unavailable_reason;
  this->RecordProperty("export_handle_kind", to_string(kind));
  this->RecordProperty("fabric_unavailable_reason", reason);
  EXPECT_EQ(kind == handle_kind::fabric, reason.empty()) << reason;
  if (this->provider_->capabilities().where.kind == memory_kind::device && query_device(0).fabric_supported &&
      kind != handle_kind::fabric) {
    // Without an IMEX channel the attribute says yes and creating a fabric handle says no
    // (docs/GPU-FACTS.md, "Capabilities").
    EXPECT_NE(reason.find("CU_MEM_HANDLE_TYPE_FABRIC"), std::string::npos) << reason;
    EXPECT_EQ(kind, handle_kind::posix_fd);
  }
  if (kind == handle_kind::none) return;
  growable_buffer buffer = this->make_buffer(1, 19);
  ipc::exporter exporter;
  const ipc::exported_manifest automatic = exporter.export_buffer(buffer);
  ASSERT_EQ(automatic.description.chunks.size(), 1u);
  EXPECT_EQ(automatic.description.chunks[0].handle, kind);
  if (kind != handle_kind::fabric) {
    try {
      (void)exporter.export_buffer(buffer, {.handle = handle_kind::fabric});
      ADD_FAILURE() << "exported a fabric handle where none is available";
    } catch (const invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(reason), std::string::npos) << error.what();
    }
  }
  // Whatever the automatic choice, a POSIX fd can be asked for, and it imports elsewhere.
  const ipc::exported_manifest posix = exporter.export_buffer(buffer, {.handle = handle_kind::posix_fd});
  EXPECT_EQ(posix.description.chunks[0].handle, handle_kind::posix_fd);
  peer_process peer = this->spawn({"import", "rw"});
  ipc::send_manifest(peer.socket(), automatic);
  EXPECT_EQ(receive_report(peer.socket()).checksum, this->checksum_of_buffer(buffer));
  EXPECT_TRUE(exited_cleanly(peer.wait()));
}

// ---- bad input: nothing mapped, every received fd closed ----------------------------------

TYPED_TEST(ipc_sharing, a_truncated_manifest_is_refused_with_nothing_mapped_and_every_fd_closed) {
  this->warm_up_import();
  growable_buffer buffer = this->make_buffer(2, 20);
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_buffer(buffer);
  const int fds[] = {exported.fds[0].get(), exported.fds[1].get()};
  for (const std::size_t length :
       {std::size_t{0}, std::size_t{7}, ipc::manifest_header_bytes - 1,
        ipc::manifest_header_bytes + ipc::manifest_chunk_bytes - 1, exported.bytes.size() - 1})
    this->template expect_refused<ipc::bad_manifest>(std::span(exported.bytes).first(length), fds,
                                                     "truncated to " + std::to_string(length) + " bytes");
}

TYPED_TEST(ipc_sharing, a_forged_manifest_is_refused_with_nothing_mapped_and_every_fd_closed) {
  this->warm_up_import();
  growable_buffer buffer = this->make_buffer(2, 21);
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_buffer(buffer);
  const int fds[] = {exported.fds[0].get(), exported.fds[1].get()};
  for (const forgery& forged :
       forgeries(exported.bytes, this->granularity_, this->provider_->capabilities().where.kind))
    this->template expect_refused<ipc::bad_manifest>(forged.bytes, fds, forged.name);
  // Valid as bytes, wrong as a start: a growth manifest cannot begin an import.
  this->template expect_refused<ipc::bad_manifest>(patched<std::uint8_t>(exported.bytes, 6, 2), fds,
                                                   "a growth manifest as a start");
  // The bytes of one manifest, a continuation that is not one.
  const std::size_t fds_before = open_fd_count();
  {
    auto [sender, receiver] = ipc::make_socket_pair();
    ipc::manifest many = exported.description;
    many.chunks.clear();
    std::uint64_t offset = 0;
    for (std::size_t i = 0; i < ipc::max_fds_per_message + 1; ++i, offset += this->granularity_)
      many.chunks.push_back({offset, this->granularity_, many.where, handle_kind::posix_fd, {}});
    many.end = many.size = offset;
    many.max_size = offset;
    std::vector<int> first(ipc::max_fds_per_message, fds[0]);
    ipc::send_message(sender.get(), ipc::serialize(many), first);
    const std::byte not_a_continuation[8] = {};
    ipc::send_message(sender.get(), not_a_continuation, std::span(fds).first(1));
    EXPECT_THROW((void)ipc::imported_buffer::receive(receiver.get(), {.provider = this->provider_}),
                 ipc::bad_manifest);
    // A continuation in order, but without the fd it owes.
    ipc::send_message(sender.get(), ipc::serialize(many), first);
    const std::vector<std::byte> continuation = patched<std::uint32_t>(
        patched<std::uint32_t>(std::vector<std::byte>(8), 0, ipc::manifest_continuation_magic), 4, 1);
    ipc::send_message(sender.get(), continuation);
    try {
      (void)ipc::receive_manifest(receiver.get());
      ADD_FAILURE() << "a continuation without its fd was accepted";
    } catch (const ipc::bad_manifest& error) {
      EXPECT_NE(std::string(error.what()).find("continuation 1 carries 0 fds instead of 1"),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_EQ(open_fd_count(), fds_before);
}

TYPED_TEST(ipc_sharing, a_manifest_whose_continuation_never_comes_times_out_with_nothing_mapped) {
  this->warm_up_import();
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(1, 27);
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_buffer(buffer);
  // More chunks than one message has fds for: the exporter owes a continuation, and never
  // sends it, though it keeps the connection open.
  ipc::manifest many = exported.description;
  many.chunks.clear();
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < ipc::max_fds_per_message + 1; ++i, offset += g)
    many.chunks.push_back({offset, g, many.where, handle_kind::posix_fd, {}});
  many.end = many.size = many.max_size = offset;
  const std::vector<int> first(ipc::max_fds_per_message, exported.fds[0].get());
  constexpr std::chrono::milliseconds timeout{200};

  const std::size_t fds_before = open_fd_count();
  const std::size_t mappings_before = memfd_mapping_count();
  {
    auto [sender, receiver] = ipc::make_socket_pair();
    ipc::send_message(sender.get(), ipc::serialize(many), first);
    expect_error<ipc::timeout_error>(
        [&] {
          (void)ipc::imported_buffer::receive(receiver.get(),
                                              {.provider = this->provider_, .timeout = timeout});
        },
        "timed out with 0 of 16 header bytes received");
    ipc::send_message(sender.get(), ipc::serialize(many), first);
    expect_error<ipc::timeout_error>([&] { (void)ipc::receive_manifest(receiver.get(), timeout); },
                                     "timed out with 0 of 16 header bytes received");
  }
  EXPECT_EQ(open_fd_count(), fds_before);
  EXPECT_EQ(memfd_mapping_count(), mappings_before);
}

TYPED_TEST(ipc_sharing, an_unknown_version_is_refused_with_nothing_mapped_and_every_fd_closed) {
  this->warm_up_import();
  growable_buffer buffer = this->make_buffer(2, 22);
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_buffer(buffer);
  const int fds[] = {exported.fds[0].get(), exported.fds[1].get()};
  for (const std::uint16_t version : {0, 2, 0xffff})
    this->template expect_refused<ipc::bad_manifest>(patched<std::uint16_t>(exported.bytes, 4, version), fds,
                                                     "version " + std::to_string(version));
}

TYPED_TEST(ipc_sharing, a_wrong_fd_count_is_refused_with_nothing_mapped_and_every_fd_closed) {
  this->warm_up_import();
  growable_buffer buffer = this->make_buffer(2, 23);
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_buffer(buffer);
  const int two[] = {exported.fds[0].get(), exported.fds[1].get()};
  const int three[] = {exported.fds[0].get(), exported.fds[1].get(), exported.fds[0].get()};
  // Fds that disagree with the manifest: the exporter broke the protocol.
  this->template expect_refused<ipc::bad_manifest>(exported.bytes, {}, "no fds");
  this->template expect_refused<ipc::bad_manifest>(exported.bytes, std::span(two).first(1), "one fd short");
  this->template expect_refused<ipc::bad_manifest>(exported.bytes, three, "one fd too many");
  // The constructor that takes a manifest and fds checks the same, as its caller's argument.
  std::vector<unique_fd> one;
  one.emplace_back(::fcntl(two[0], F_DUPFD_CLOEXEC, 0));
  EXPECT_THROW(ipc::imported_buffer(exported.description, std::move(one), {.provider = this->provider_}),
               invalid_argument);
}

TYPED_TEST(ipc_sharing, sizes_that_differ_from_the_handles_are_refused_with_nothing_mapped) {
  this->warm_up_import();
  const std::size_t g = this->granularity_;
  growable_buffer buffer = this->make_buffer(1, 24);
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_buffer(buffer);
  ipc::manifest forged = exported.description;  // one chunk of g, claimed to be 2g
  forged.chunks[0].size = 2 * g;
  forged.end = forged.size = 2 * g;
  const int fds[] = {exported.fds[0].get()};
  // The OS provider sees the memfd's size; the driver refuses to map past the handle.
  this->template expect_refused<std::exception>(ipc::serialize(forged), fds, "a chunk twice its handle");
}

TYPED_TEST(ipc_sharing, fds_that_are_not_memory_are_refused_with_nothing_mapped) {
  this->warm_up_import();
  growable_buffer buffer = this->make_buffer(1, 25);
  ipc::exporter exporter;
  const ipc::exported_manifest exported = exporter.export_buffer(buffer);
  int pipe_ends[2] = {-1, -1};
  ASSERT_EQ(::pipe2(pipe_ends, O_CLOEXEC), 0);
  const unique_fd read_end(pipe_ends[0]);
  const unique_fd write_end(pipe_ends[1]);
  const int fds[] = {read_end.get()};
  this->template expect_refused<std::exception>(exported.bytes, fds, "a pipe instead of memory");
}

TYPED_TEST(ipc_sharing, a_corrupt_manifest_from_another_process_is_refused_with_every_fd_closed) {
  this->warm_up_import();
  for (const std::string corruption : {"truncate", "extra_fd", "missing_fd", "wrong_size"}) {
    SCOPED_TRACE(corruption);
    peer_process peer = this->spawn({"export", "26", "2", corruption});
    const std::size_t fds_before = open_fd_count();
    const std::size_t mappings_before = memfd_mapping_count();
    EXPECT_ANY_THROW((void)ipc::imported_buffer::receive(peer.socket(), {.provider = this->provider_}));
    EXPECT_EQ(open_fd_count(), fds_before);
    EXPECT_EQ(memfd_mapping_count(), mappings_before);
    peer.close_socket();  // the exporter sees the refusal as the end of the conversation
    EXPECT_TRUE(exited_cleanly(peer.wait()));
  }
}

}  // namespace
}  // namespace vmm::testing
