// Sharing a memory_resource pointer by pointer: the wire messages, the exporter, and the
// importer's mirrors. The design is in vmm/ipc/resource_sharing.hpp.
//
// The importer's book. One mirror per exporter arena a pointer arrived in: an address
// range of the arena's size, and the pages mapped in it by page index, each with the
// exporter's page id, the number of imported pointers that use it, its imported handle and
// its mapping. A pointer maps the pages it lacks and counts the ones it finds; letting go
// of it uncounts them and retires the pages that no pointer uses any more, together with
// the points of every stream that used them. A mirror that maps nothing is dropped (its
// range goes with the last retirement that holds it), so an importer that let go of
// everything holds nothing.
//
// A page index may be needed again while its last mapping still waits in the retirement
// list for a stream (a pointer let go of on stream t, and a new one sharing that page
// arrives before t passed). The mirror remembers its retirements, and an import that
// needs an address one of them still maps waits for that retirement alone
// (detail::collect_retirement), not for every retirement of the process.
//
// The cache (resource_import_options::keep_mapped_bytes). A page whose last pointer let go
// may stay in its mirror with no user (users == 0): a cached page, still mapped, listed in
// the state's cache list in the order pages were let go of. It keeps the point of the
// stream of each pointer that let go of it (released_on, as a page still in use does), so
// that retiring it later, from the cache, waits for the same work as retiring it at once
// would. Every page leaves the mirror through retire_pages(): for a release without a
// cache, for the least recently let-go pages beyond the bound, for a cached page the
// exporter replaced, for trim().
//
// Locks: one mutex per imported resource, held across an import (the driver calls
// included) and a release. Retirement runs under it; it never calls back into the state.

#include <vmm/ipc/resource_sharing.hpp>

#include <vmm/address_range.hpp>
#include <vmm/ipc/fabric.hpp>
#include <vmm/mapping.hpp>
#include <vmm/physical_allocation.hpp>

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <limits>
#include <list>
#include <random>
#include <thread>
#include <utility>

#include "vmm/detail/cleanup.hpp"
#include "vmm/ipc/detail/fd_channel.hpp"
#include "vmm/ipc/detail/little_endian.hpp"
#include "vmm/detail/retirement.hpp"

namespace vmm::ipc {
namespace {

using detail::load;
using detail::store;

// Field offsets (docs/design/resource_sharing.md, "Wire format").
namespace resource_field {
constexpr std::size_t magic = 0, version = 4, grant = 6, location_kind = 7, location_id = 8, reserved = 12,
                      resource_id = 16, granularity = 24;
}  // namespace resource_field
namespace pointer_field {
constexpr std::size_t magic = 0, version = 4, reserved = 6, resource_id = 8, segment = 16, page_count = 20,
                      segment_size = 24, offset = 32, bytes = 40;
}  // namespace pointer_field
static_assert(resource_field::granularity + 8 == resource_message_bytes);
static_assert(pointer_field::bytes + 8 == pointer_header_bytes);

constexpr std::uint8_t grant_read_only = 1;
constexpr std::uint8_t grant_read_write = 2;

[[noreturn]] void refuse(const std::string& what) {
  throw protocol_error(what);
}

std::uint8_t grant_code(access_mode grant) {
  switch (grant) {
    case access_mode::read_only:
      return grant_read_only;
    case access_mode::read_write:
      return grant_read_write;
    default:
      throw invalid_argument(
          fmt::format("resource sharing: grant {}: share read-only or read-write", to_string(grant)));
  }
}

// What both messages open with, checked: at least the magic and the version, the magic
// `magic`, and the version this library reads. `message` names the message, `header_bytes`
// its header's size.
void check_opening(std::span<const std::byte> bytes, const char* message, std::uint32_t magic,
                   std::size_t header_bytes) {
  static_assert(resource_field::magic == pointer_field::magic &&
                resource_field::version == pointer_field::version);
  if (bytes.size() < 6)
    refuse(
        fmt::format("{}: truncated: {} bytes, the header alone is {}", message, bytes.size(), header_bytes));
  if (const auto got = load<std::uint32_t>(bytes, resource_field::magic); got != magic)
    refuse(fmt::format("{}: bad magic {:#010x} (expected {:#010x})", message, got, magic));
  if (const auto version = load<std::uint16_t>(bytes, resource_field::version);
      version != resource_sharing_version)
    refuse(fmt::format("{}: version {} is not supported (this library reads version {})", message, version,
                       resource_sharing_version));
}

bool valid_granularity(std::uint64_t granularity) {
  return granularity >= 4096 && std::has_single_bit(granularity);
}

// The pages [offset, offset + bytes) touches, for a valid granularity and bytes > 0.
std::uint64_t pages_touched(std::uint64_t offset, std::uint64_t bytes, std::uint64_t granularity) {
  return (offset + bytes - 1) / granularity - offset / granularity + 1;
}

// Every rule of a pointer description but the wire's own; `fail` throws.
template <class Fail>
void check_pointer(const pointer_description& d, std::uint64_t granularity, Fail&& fail) {
  if (d.resource_id == 0) fail("resource id 0");
  if (d.segment >= max_segments)
    fail(fmt::format("segment {} is out of range (at most {})", d.segment, max_segments - 1));
  if (d.segment_size == 0 || d.segment_size % granularity != 0)
    fail(fmt::format("segment size {} is not a non-zero multiple of the granularity {}", d.segment_size,
                     granularity));
  if (d.bytes == 0) fail("a pointer of 0 bytes");
  if (d.offset >= d.segment_size || d.bytes > d.segment_size - d.offset)
    fail(fmt::format("offset {} + {} bytes runs past the end of the segment ({} bytes)", d.offset, d.bytes,
                     d.segment_size));
  const std::uint64_t pages = pages_touched(d.offset, d.bytes, granularity);
  if (pages > max_manifest_chunks) fail(fmt::format("{} pages: more than {}", pages, max_manifest_chunks));
  if (d.page_ids.size() != pages)
    fail(fmt::format("{} page ids for a pointer that touches {} pages", d.page_ids.size(), pages));
  for (std::size_t i = 0; i < d.page_ids.size(); ++i)
    if (d.page_ids[i] == 0) fail(fmt::format("page {} has id 0", i));
}

// Whether `pages` is the manifest of pointer `d`'s pages (docs/design/resource_sharing.md,
// "Wire format"); bad_manifest naming the first difference otherwise.
void check_pages(const pointer_description& d, const manifest& pages, std::uint64_t granularity,
                 std::size_t fds) {
  const auto fail = [&](const std::string& what) {
    throw bad_manifest(
        fmt::format("pointer at segment {} offset {}: its manifest {}", d.segment, d.offset, what));
  };
  validate(pages);
  if (pages.kind != manifest_kind::whole) fail("is a growth manifest");
  if (pages.buffer_id != d.resource_id)
    fail(fmt::format("names buffer {:#x}, not the resource {:#x}", pages.buffer_id, d.resource_id));
  if (pages.granularity != granularity)
    fail(fmt::format("has granularity {}, the resource {}", pages.granularity, granularity));
  if (pages.max_size != d.segment_size)
    fail(fmt::format("has max size {}, the segment {} bytes", pages.max_size, d.segment_size));
  const std::uint64_t first_page_offset = d.offset / granularity * granularity;
  if (pages.base_offset != first_page_offset)
    fail(fmt::format("starts at {} in the segment, the pointer's first page at {}", pages.base_offset,
                     first_page_offset));
  if (pages.chunks.size() != d.page_ids.size())
    fail(fmt::format("lists {} chunks for {} pages", pages.chunks.size(), d.page_ids.size()));
  for (std::size_t i = 0; i < pages.chunks.size(); ++i)
    if (pages.chunks[i].size != granularity)
      fail(fmt::format("lists chunk {} of {} bytes, not one page of {}", i, pages.chunks[i].size,
                       granularity));
  if (fds != pages.fd_count())
    throw invalid_argument(
        fmt::format("imported_resource: {} fds for a manifest of {} posix-fd pages", fds, pages.fd_count()));
}

std::uint64_t fresh_resource_id() {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint64_t nonce = [] {
    std::random_device device;
    return (std::uint64_t{device()} << 32) ^ device() ^ (static_cast<std::uint64_t>(::getpid()) << 17);
  }();
  std::uint64_t x = nonce + 0x9e3779b97f4a7c15ull * (counter.fetch_add(1) + 1);  // splitmix64
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x == 0 ? 1 : x;
}

}  // namespace

// ---- the wire ----------------------------------------------------------------------------

std::vector<std::byte> serialize(const resource_description& d) {
  if (d.resource_id == 0) throw invalid_argument("resource message: resource id 0");
  if (!valid_granularity(d.granularity))
    throw invalid_argument(
        fmt::format("resource message: granularity {} is not a power of two >= 4096", d.granularity));
  if (d.where.id < 0 || (d.where.kind == memory_kind::os_host && d.where.id != 0))
    throw invalid_argument(fmt::format("resource message: location {} has a bad id", to_string(d.where)));
  std::vector<std::byte> bytes(resource_message_bytes);
  store<std::uint32_t>(bytes, resource_field::magic, resource_message_magic);
  store<std::uint16_t>(bytes, resource_field::version, resource_sharing_version);
  store<std::uint8_t>(bytes, resource_field::grant, grant_code(d.grant));
  store<std::uint8_t>(bytes, resource_field::location_kind, static_cast<std::uint8_t>(d.where.kind));
  store<std::uint32_t>(bytes, resource_field::location_id, static_cast<std::uint32_t>(d.where.id));
  store<std::uint64_t>(bytes, resource_field::resource_id, d.resource_id);
  store<std::uint64_t>(bytes, resource_field::granularity, d.granularity);
  return bytes;
}

resource_description parse_resource_description(std::span<const std::byte> bytes) {
  const auto fail = [](const std::string& what) { refuse("resource message: " + what); };
  check_opening(bytes, "resource message", resource_message_magic, resource_message_bytes);
  if (bytes.size() != resource_message_bytes)
    fail(fmt::format("{} bytes where {} are due", bytes.size(), resource_message_bytes));
  resource_description d;
  switch (load<std::uint8_t>(bytes, resource_field::grant)) {
    case grant_read_only:
      d.grant = access_mode::read_only;
      break;
    case grant_read_write:
      d.grant = access_mode::read_write;
      break;
    default:
      fail(fmt::format("unknown grant {}", load<std::uint8_t>(bytes, resource_field::grant)));
  }
  const auto kind = load<std::uint8_t>(bytes, resource_field::location_kind);
  if (kind > static_cast<std::uint8_t>(memory_kind::os_host))
    fail(fmt::format("unknown location kind {}", kind));
  const auto id = load<std::uint32_t>(bytes, resource_field::location_id);
  if (id > static_cast<std::uint32_t>(std::numeric_limits<int>::max()))
    fail(fmt::format("location id {} is negative", static_cast<std::int32_t>(id)));
  d.where = location{static_cast<memory_kind>(kind), static_cast<int>(id)};
  if (d.where.kind == memory_kind::os_host && d.where.id != 0)
    fail(fmt::format("os host memory has no location id {}", d.where.id));
  if (load<std::uint32_t>(bytes, resource_field::reserved) != 0) fail("reserved bytes are not 0");
  d.resource_id = load<std::uint64_t>(bytes, resource_field::resource_id);
  if (d.resource_id == 0) fail("resource id 0");
  d.granularity = load<std::uint64_t>(bytes, resource_field::granularity);
  if (!valid_granularity(d.granularity))
    fail(fmt::format("granularity {} is not a power of two >= 4096", d.granularity));
  return d;
}

std::vector<std::byte> serialize(const pointer_description& d, std::uint64_t granularity) {
  if (!valid_granularity(granularity))
    throw invalid_argument(
        fmt::format("pointer message: granularity {} is not a power of two >= 4096", granularity));
  check_pointer(d, granularity,
                [](const std::string& what) { throw invalid_argument("pointer message: " + what); });
  std::vector<std::byte> bytes(pointer_header_bytes + 8 * d.page_ids.size());
  store<std::uint32_t>(bytes, pointer_field::magic, pointer_message_magic);
  store<std::uint16_t>(bytes, pointer_field::version, resource_sharing_version);
  store<std::uint64_t>(bytes, pointer_field::resource_id, d.resource_id);
  store<std::uint32_t>(bytes, pointer_field::segment, d.segment);
  store<std::uint32_t>(bytes, pointer_field::page_count, static_cast<std::uint32_t>(d.page_ids.size()));
  store<std::uint64_t>(bytes, pointer_field::segment_size, d.segment_size);
  store<std::uint64_t>(bytes, pointer_field::offset, d.offset);
  store<std::uint64_t>(bytes, pointer_field::bytes, d.bytes);
  for (std::size_t i = 0; i < d.page_ids.size(); ++i)
    store<std::uint64_t>(bytes, pointer_header_bytes + 8 * i, d.page_ids[i]);
  return bytes;
}

pointer_description parse_pointer_description(std::span<const std::byte> bytes, std::uint64_t granularity) {
  const auto fail = [](const std::string& what) { refuse("pointer message: " + what); };
  if (!valid_granularity(granularity))
    throw invalid_argument(
        fmt::format("pointer message: granularity {} is not a power of two >= 4096", granularity));
  check_opening(bytes, "pointer message", pointer_message_magic, pointer_header_bytes);
  if (bytes.size() < pointer_header_bytes)
    fail(fmt::format("truncated: {} bytes, the header alone is {}", bytes.size(), pointer_header_bytes));
  if (load<std::uint16_t>(bytes, pointer_field::reserved) != 0) fail("reserved bytes are not 0");
  const std::uint64_t page_count = load<std::uint32_t>(bytes, pointer_field::page_count);
  if (page_count > max_manifest_chunks)
    fail(fmt::format("{} pages: more than {}", page_count, max_manifest_chunks));
  if (bytes.size() != pointer_header_bytes + 8 * page_count)
    fail(fmt::format("{} bytes, but {} page ids call for {}", bytes.size(), page_count,
                     pointer_header_bytes + 8 * page_count));
  pointer_description d;
  d.resource_id = load<std::uint64_t>(bytes, pointer_field::resource_id);
  d.segment = load<std::uint32_t>(bytes, pointer_field::segment);
  d.segment_size = load<std::uint64_t>(bytes, pointer_field::segment_size);
  d.offset = load<std::uint64_t>(bytes, pointer_field::offset);
  d.bytes = load<std::uint64_t>(bytes, pointer_field::bytes);
  d.page_ids.resize(page_count);
  for (std::size_t i = 0; i < page_count; ++i)
    d.page_ids[i] = load<std::uint64_t>(bytes, pointer_header_bytes + 8 * i);
  check_pointer(d, granularity, fail);
  return d;
}

void send_resource(int socket_fd, const resource_description& description,
                   std::chrono::milliseconds timeout) {
  send_message(socket_fd, serialize(description), {}, timeout);
}

resource_description receive_resource(int socket_fd, std::chrono::milliseconds timeout) {
  const message received = receive_message(socket_fd, 0, timeout);
  return parse_resource_description(received.payload);
}

void send_pointer(int socket_fd, const exported_pointer& exported, std::chrono::milliseconds timeout) {
  if (exported.pages.fds.size() != exported.pages.description.fd_count())
    throw invalid_argument(fmt::format("send_pointer: {} fds for a manifest of {} posix-fd pages",
                                       exported.pages.fds.size(), exported.pages.description.fd_count()));
  const detail::deadline until(timeout);
  detail::send_message(socket_fd, exported.bytes, {}, until);
  const int left = until.poll_timeout();
  send_manifest(socket_fd, exported.pages, left < 0 ? no_timeout : std::chrono::milliseconds(left));
}

received_pointer receive_pointer(int socket_fd, std::uint64_t granularity,
                                 std::chrono::milliseconds timeout) {
  const detail::deadline until(timeout);
  const message header = detail::receive_message(socket_fd, 0, until);
  received_pointer result;
  result.description = parse_pointer_description(header.payload, granularity);
  const int left = until.poll_timeout();
  result.pages = receive_manifest(socket_fd, left < 0 ? no_timeout : std::chrono::milliseconds(left));
  check_pages(result.description, result.pages.description, granularity, result.pages.fds.size());
  return result;
}

// ---- the exporter ------------------------------------------------------------------------

resource_exporter::resource_exporter(memory_resource& resource, resource_export_options options)
    : resource_(resource) {
  const provider_capabilities& offered = resource.provider()->capabilities();
  const handle_kind kind = resource.properties().handle_type;
  if (offered.export_kind == handle_kind::none)
    throw invalid_argument(
        fmt::format("resource_exporter: {} memory cannot be exported: it has no shareable "
                    "handle",
                    to_string(offered.where)));
  if (kind == handle_kind::none)
    throw invalid_argument(fmt::format(
        "resource_exporter: the resource ({} memory) was made with handle_type none; make it with "
        "memory_resource_properties::handle_type = posix_fd (or {}, its provider's export kind) to share it",
        to_string(offered.where), to_string(offered.export_kind)));
  if (resource.properties().large_page_size != offered.granularity)
    throw invalid_argument(fmt::format(
        "resource_exporter: the resource has large pages of {} bytes, and pointers are exported page by page "
        "in the granularity ({} bytes); make it with memory_resource_properties::large_page_size = {} to "
        "share it",
        resource.properties().large_page_size, offered.granularity, offered.granularity));
  description_.resource_id = fresh_resource_id();
  description_.where = offered.where;
  description_.granularity = resource.provider()->capabilities().granularity;
  description_.grant = options.grant;
  (void)grant_code(options.grant);  // read-only or read-write
}

resource_exporter::~resource_exporter() = default;

void resource_exporter::purge_ids_locked() {
  std::erase_if(page_ids_, [](const auto& entry) { return entry.first.expired(); });
}

exported_pointer resource_exporter::export_pointer(const void* ptr, std::size_t bytes) {
  const memory_resource::allocation_pages pages = resource_.pages_of(ptr, bytes);
  exported_pointer result;
  pointer_description& d = result.description;
  d.resource_id = description_.resource_id;
  d.segment = static_cast<std::uint32_t>(pages.arena);
  d.segment_size = pages.arena_size;
  d.offset = reinterpret_cast<std::uintptr_t>(ptr) - pages.arena_base;
  d.bytes = bytes;
  {
    std::lock_guard lock(mutex_);
    purge_ids_locked();
    d.page_ids.reserve(pages.pages.size());
    for (const shared_chunk& page : pages.pages) {
      const auto [entry, added] = page_ids_.try_emplace(page_key(page), next_page_id_);
      if (added) ++next_page_id_;
      d.page_ids.push_back(entry->second);
    }
  }
  result.pages = exporter_.export_chunks(
      pages.pages, {.grant = description_.grant, .handle = resource_.properties().handle_type});
  manifest& m = result.pages.description;
  m.buffer_id = description_.resource_id;
  m.base_offset = pages.first_page * pages.page_size;
  m.max_size = pages.arena_size;
  result.pages.bytes = serialize(m);
  result.bytes = serialize(d, description_.granularity);
  return result;
}

void resource_exporter::purge() {
  exporter_.purge();
  std::lock_guard lock(mutex_);
  purge_ids_locked();
}

export_statistics resource_exporter::statistics() const {
  return exporter_.statistics();
}

// ---- the importer ------------------------------------------------------------------------

namespace detail {

class imported_resource_state : public std::enable_shared_from_this<imported_resource_state> {
 public:
  imported_resource_state(const resource_description& description, resource_import_options options);
  imported_resource_state(const imported_resource_state&) = delete;
  imported_resource_state& operator=(const imported_resource_state&) = delete;
  // Retires the cached pages: nothing else is left when no pointer holds the state.
  ~imported_resource_state();

  imported_pointer import(received_pointer received, stream_ref stream);
  void release(const imported_pointer& pointer) noexcept;
  imported_resource_statistics statistics() const;
  // Retires cached pages until at most `bytes` of them are left.
  void trim_to(std::size_t bytes) noexcept;
  // Keeps no page from now on, and retires the cached ones (the imported_resource goes).
  void stop_caching() noexcept;

  const resource_description description;
  const std::shared_ptr<memory_provider> provider;
  const access_mode access;
  const stream_ref stream;
  const std::chrono::milliseconds timeout;

 private:
  // A page in the cache list: its mirror's segment and its index there.
  struct cached_page {
    std::uint32_t segment = 0;
    std::size_t page = 0;
  };
  using cache_list = std::list<cached_page>;
  struct page_slot {
    std::uint64_t id = 0;
    std::size_t users = 0;  // 0: cached, listed at `cached_at`
    physical_allocation memory;
    mapping mapped;  // declared after the memory: unmapped first
    // Points on the streams of pointers that let go of the page while others kept it, or
    // while the cache kept it.
    // One point per release, shared by the pages of that release.
    std::vector<std::shared_ptr<const stream_event>> released_on;
    cache_list::iterator cached_at;
  };
  // Pages no pointer uses any more, waiting for their streams in the retirement list.
  // Destroyed in reverse order: unmapped, then the handles, then the range (when this was
  // the last holder of a dropped mirror's range).
  struct retired_pages {
    std::shared_ptr<address_range> range;
    std::vector<std::size_t> pages;
    std::vector<physical_allocation> memory;
    std::vector<mapping> mappings;
  };
  struct mirror {
    std::shared_ptr<address_range> range;
    std::map<std::size_t, page_slot> pages;
    std::vector<std::weak_ptr<retired_pages>> retiring;
  };

  using mirror_map = std::map<std::uint32_t, mirror>;

  // Waits for the retirements of `m` that still map a page of `wanted`.
  static void wait_for_retired(mirror& m, const std::map<std::size_t, page_slot>& wanted);
  // Takes the slots `pages` out of mirror `found` (cached ones out of the cache too) and
  // hands their mappings and handles to the retirement list, to go once `point` and the
  // points each slot kept have passed. Leaves the mirror in place, empty or not. Never
  // throws: without room for the retirement it waits for the points here and unmaps at once.
  void retire_pages_locked(mirror_map::iterator found, std::span<const std::size_t> pages,
                           std::shared_ptr<const stream_event> point) noexcept;
  // Retires the least recently let-go cached pages until at most `bytes` are cached.
  void trim_cache_locked(std::size_t bytes) noexcept;

  const std::size_t limit_;
  std::vector<access_grant> grants_;
  mutable std::mutex mutex_;
  mirror_map mirrors_;
  std::size_t keep_bytes_;  // the cache's bound; 0 once the imported_resource is gone
  cache_list cached_;       // least recently let go first
  imported_resource_statistics statistics_;
};

imported_resource_state::imported_resource_state(const resource_description& d,
                                                 resource_import_options options)
    : description(d),
      provider(options.provider != nullptr ? std::move(options.provider) : provider_for(d.where)),
      access(options.access),
      stream(options.stream),
      timeout(options.timeout),
      limit_(options.max_size_limit != 0 ? options.max_size_limit
                                         : 4 * provider->capabilities().physical_memory_size),
      keep_bytes_(options.keep_mapped_bytes) {
  if (provider->capabilities().where != d.where)
    throw invalid_argument(
        fmt::format("imported_resource: the resource is {} memory, the provider given serves "
                    "{} memory",
                    to_string(d.where), to_string(provider->capabilities().where)));
  if (provider->capabilities().granularity != d.granularity)
    throw invalid_argument(
        fmt::format("imported_resource: the exporter's granularity is {}, but {} memory here "
                    "has {}",
                    d.granularity, to_string(d.where), provider->capabilities().granularity));
  if (access != access_mode::read_only && access != access_mode::read_write)
    throw invalid_argument(fmt::format(
        "imported_resource: access {} asked for; import read-only or read-write", to_string(access)));
  if (access == access_mode::read_write && d.grant == access_mode::read_only)
    throw invalid_argument(
        "imported_resource: read-write access asked for, but the exporter granted read-only "
        "access");
  grants_ = provider->capabilities().grants(access);
}

void imported_resource_state::wait_for_retired(mirror& m, const std::map<std::size_t, page_slot>& wanted) {
  std::erase_if(m.retiring, [](const std::weak_ptr<retired_pages>& r) { return r.expired(); });
  for (const std::weak_ptr<retired_pages>& retiring : m.retiring) {
    bool collides = false;
    if (const std::shared_ptr<retired_pages> held = retiring.lock())
      collides = std::any_of(held->pages.begin(), held->pages.end(),
                             [&](std::size_t page) { return wanted.count(page) != 0; });
    // Another thread's collect_retired() may be destroying it: it expires shortly.
    while (collides && !retiring.expired()) {
      vmm::detail::collect_retirement(retiring);
      if (!retiring.expired()) std::this_thread::yield();
    }
  }
}

imported_pointer imported_resource_state::import(received_pointer received, stream_ref use_stream) {
  const pointer_description& d = received.description;
  const manifest& pages = received.pages.description;
  const std::uint64_t g = description.granularity;
  check_pointer(d, g, [](const std::string& what) { refuse("imported_resource: pointer " + what); });
  check_pages(d, pages, g, received.pages.fds.size());
  if (d.resource_id != description.resource_id)
    refuse(fmt::format("imported_resource: a pointer of resource {:#x}, but this is resource {:#x}",
                       d.resource_id, description.resource_id));
  if (pages.where != description.where)
    refuse(fmt::format("imported_resource: a pointer to {} memory in a resource of {} memory",
                       to_string(pages.where), to_string(description.where)));
  for (std::size_t i = 0; i < pages.chunks.size(); ++i)
    if (pages.chunks[i].where != description.where)
      refuse(fmt::format("imported_resource: page {} of the pointer is {} memory in a resource of {} memory",
                         i, to_string(pages.chunks[i].where), to_string(description.where)));
  if (pages.grant != description.grant)
    refuse(fmt::format("imported_resource: a pointer granted {} access in a resource granted {}",
                       to_string(pages.grant), to_string(description.grant)));
  if (d.segment_size > limit_)
    throw invalid_argument(fmt::format(
        "imported_resource: segment {} asks to reserve {} bytes of addresses, more than the limit of {} "
        "(resource_import_options::max_size_limit; by default four times the memory size of {})",
        d.segment, d.segment_size, limit_, to_string(description.where)));
  const std::size_t first = static_cast<std::size_t>(d.offset / g);
  const std::size_t count = d.page_ids.size();

  std::lock_guard lock(mutex_);
  auto found = mirrors_.find(d.segment);
  mirror* m = found == mirrors_.end() ? nullptr : &found->second;
  if (m != nullptr && m->range->size() != d.segment_size)
    refuse(fmt::format("imported_resource: segment {} is {} bytes here, the pointer says {}", d.segment,
                       m->range->size(), d.segment_size));
  // Which pages are mapped already: the same physical page (the same id), a cached page
  // the exporter replaced (stale), or a refusal.
  std::vector<bool> mapped_already(count, false);
  std::vector<std::size_t> stale;
  if (m != nullptr)
    for (std::size_t i = 0; i < count; ++i) {
      const auto slot = m->pages.find(first + i);
      if (slot == m->pages.end()) continue;
      if (slot->second.id != d.page_ids[i] && slot->second.users == 0) {
        stale.push_back(first + i);
        continue;
      }
      if (slot->second.id != d.page_ids[i])
        refuse(fmt::format(
            "imported_resource: page {} of segment {} is mapped here with the exporter's page {} and in use "
            "by "
            "an imported pointer, but the exporter now has page {} there: it freed an allocation this "
            "process had not let go of (let go of imported pointers before the exporter frees them)",
            first + i, d.segment, slot->second.id, d.page_ids[i]));
      mapped_already[i] = true;
    }
  if (!stale.empty()) {
    // Its mapping goes once the streams that used it pass: wait_for_retired() below waits
    // for that before the new page is mapped at its address.
    retire_pages_locked(found, stale, nullptr);
    if (m->pages.empty()) {
      mirrors_.erase(found);  // the range goes with the retirement
      m = nullptr;
    }
  }

  // Declared before the pages it will hold, so that a failure unmaps them before the range goes.
  std::map<std::uint32_t, mirror> new_mirror;
  // Every handle is imported before anything is mapped; each fd is closed once used.
  std::map<std::size_t, page_slot> added;
  std::size_t next_fd = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const manifest_chunk& chunk = pages.chunks[i];
    unique_fd fd;
    if (chunk.handle == handle_kind::posix_fd) fd = std::move(received.pages.fds[next_fd++]);
    if (mapped_already[i]) continue;  // the duplicate's fd closes here
    page_slot slot;
    slot.id = d.page_ids[i];
    slot.users = 1;
    slot.memory = chunk.handle == handle_kind::posix_fd
                      ? physical_allocation::import_fd(provider, fd.get(), g)
                      : import_fabric(provider, chunk.fabric, g);
    added.emplace(first + i, std::move(slot));
  }
  if (m == nullptr) {
    m = &new_mirror
             .emplace(d.segment, mirror{std::make_shared<address_range>(provider, d.segment_size), {}, {}})
             .first->second;
  }
  wait_for_retired(*m, added);
  const std::uintptr_t base = m->range->address();
  for (auto& [page, slot] : added)
    slot.mapped = mapping(slot.memory, base + page * g, std::span<const access_grant>{});
  for (auto run = added.begin(); run != added.end();) {  // one access call per run of new pages
    auto end = std::next(run);
    std::size_t length = 1;
    while (end != added.end() && end->first == run->first + length) ++end, ++length;
    provider->set_access(base + run->first * g, length * g, grants_);
    run = end;
  }

  // Nothing below throws.
  imported_pointer result;
  result.state_ = shared_from_this();
  const std::size_t fresh = added.size();
  std::size_t reused = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (!mapped_already[i]) continue;
    page_slot& slot = m->pages.find(first + i)->second;
    if (slot.users++ != 0) continue;
    cached_.erase(slot.cached_at);  // out of the cache; its streams' points stay with it
    statistics_.cached_bytes -= g;
    ++reused;
  }
  m->pages.merge(added);
  mirrors_.merge(new_mirror);
  ++statistics_.pointers;
  statistics_.pages_imported += fresh;
  statistics_.pages_reused += reused;
  statistics_.pages_shared += count - fresh - reused;
  result.data_ = reinterpret_cast<void*>(base + d.offset);
  result.bytes_ = static_cast<std::size_t>(d.bytes);
  result.segment_ = d.segment;
  result.offset_ = d.offset;
  result.stream_ = use_stream;
  return result;
}

void imported_resource_state::release(const imported_pointer& pointer) noexcept {
  const std::uint64_t g = description.granularity;
  const std::size_t first = static_cast<std::size_t>(pointer.offset_ / g);
  const std::size_t count = static_cast<std::size_t>(pages_touched(pointer.offset_, pointer.bytes_, g));
  stream_executor& executor = provider->executor();
  std::lock_guard lock(mutex_);
  const auto found = mirrors_.find(pointer.segment_);
  if (found == mirrors_.end()) return;  // cannot be: the pointer's pages are counted
  mirror& m = found->second;
  const auto slot_of = [&](std::size_t page) -> page_slot& { return m.pages.find(page)->second; };
  const bool caching = keep_bytes_ >= g;

  // Everything that can fail comes first: the one point on the pointer's stream that every
  // page of this release waits for (kept pages share it: one event per release, not per
  // page), room for it on the kept pages, and the cache entries of the pages that become
  // cached.
  std::vector<std::size_t> going;  // pages retired now
  std::shared_ptr<const stream_event> point;
  cache_list newly_cached;
  bool prepared = false;
  vmm::detail::cleanup("imported_resource: letting go of a pointer", [&] {
    for (std::size_t page = first; page < first + count; ++page) {
      page_slot& slot = slot_of(page);
      if (slot.users > 1 || caching) {
        std::erase_if(slot.released_on, [](const auto& e) { return e->done(); });
        slot.released_on.reserve(slot.released_on.size() + 1);
        if (slot.users == 1) newly_cached.push_back({pointer.segment_, page});
      } else {
        if (going.empty()) going.reserve(count);
        going.push_back(page);
      }
    }
    point = std::make_shared<const stream_event>(executor, pointer.stream_);
    prepared = true;
  });
  if (!prepared) {
    // No room or no point: wait for the stream here, then unmap at once.
    vmm::detail::cleanup("imported_resource: waiting for a stream",
                         [&] { executor.synchronize(pointer.stream_); });
    going.clear();
  }

  for (std::size_t page = first; page < first + count; ++page) {
    page_slot& slot = slot_of(page);
    if (prepared && (slot.users > 1 || caching)) {
      slot.released_on.push_back(point);
      if (--slot.users == 0) {
        cached_.splice(cached_.end(), newly_cached, newly_cached.begin());
        slot.cached_at = std::prev(cached_.end());
        statistics_.cached_bytes += g;
      }
    } else if (!prepared && slot.users > 1) {
      --slot.users;
    } else if (!prepared) {
      // One at a time: no room to list them. The mirror keeps the rest of the pointer's
      // pages, so it stays until the loop ends.
      const std::size_t one = page;
      retire_pages_locked(found, std::span(&one, 1), nullptr);
    }
  }
  --statistics_.pointers;
  if (!going.empty()) retire_pages_locked(found, going, std::move(point));
  if (m.pages.empty()) mirrors_.erase(found);  // the range goes with its last retirement
  trim_cache_locked(keep_bytes_);
}

void imported_resource_state::retire_pages_locked(mirror_map::iterator found,
                                                  std::span<const std::size_t> pages,
                                                  std::shared_ptr<const stream_event> point) noexcept {
  mirror& m = found->second;
  std::shared_ptr<retired_pages> retired;
  std::vector<std::shared_ptr<const stream_event>> points;
  vmm::detail::cleanup("imported_resource: retiring pages", [&] {
    std::size_t waits = 1;
    for (const std::size_t page : pages) waits += m.pages.find(page)->second.released_on.size();
    auto made = std::make_shared<retired_pages>();
    made->pages.reserve(pages.size());
    made->memory.reserve(pages.size());
    made->mappings.reserve(pages.size());
    points.reserve(waits);
    m.retiring.reserve(m.retiring.size() + 1);
    retired = std::move(made);
  });
  if (point != nullptr) {
    if (retired != nullptr)
      points.push_back(std::move(point));
    else
      vmm::detail::cleanup("imported_resource: waiting for a stream", [&] { point->synchronize(); });
  }

  for (const std::size_t page : pages) {
    const auto slot = m.pages.find(page);
    if (slot->second.users == 0) {
      cached_.erase(slot->second.cached_at);
      statistics_.cached_bytes -= description.granularity;
    }
    if (retired != nullptr) {
      retired->pages.push_back(page);
      retired->memory.push_back(std::move(slot->second.memory));
      retired->mappings.push_back(std::move(slot->second.mapped));
      for (auto& kept : slot->second.released_on) points.push_back(std::move(kept));
    } else {
      for (const auto& kept : slot->second.released_on)
        vmm::detail::cleanup("imported_resource: waiting for a stream", [&] { kept->synchronize(); });
    }
    m.pages.erase(slot);  // unmaps now what did not move to `retired`
    ++statistics_.pages_released;
  }
  if (retired != nullptr) {
    // Pages let go of together share their point: each point once.
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    retired->range = m.range;
    m.retiring.push_back(retired);
    vmm::detail::retire(std::move(points), std::move(retired));
  }
}

void imported_resource_state::trim_cache_locked(std::size_t bytes) noexcept {
  const std::uint64_t g = description.granularity;
  while (statistics_.cached_bytes > bytes) {
    // The least recently let-go page, with the others of its segment among those to go.
    const std::uint32_t segment = cached_.front().segment;
    const std::size_t excess = static_cast<std::size_t>((statistics_.cached_bytes - bytes + g - 1) / g);
    std::vector<std::size_t> victims;
    vmm::detail::cleanup("imported_resource: trimming the cache", [&] {
      victims.reserve(excess);
      std::size_t seen = 0;
      for (auto at = cached_.begin(); at != cached_.end() && seen < excess; ++at, ++seen)
        if (at->segment == segment) victims.push_back(at->page);
    });
    const std::size_t one = cached_.front().page;
    const auto found = mirrors_.find(segment);
    retire_pages_locked(found, victims.empty() ? std::span(&one, 1) : std::span<const std::size_t>(victims),
                        nullptr);
    if (found->second.pages.empty()) mirrors_.erase(found);  // the range goes with its last retirement
  }
}

void imported_resource_state::trim_to(std::size_t bytes) noexcept {
  std::lock_guard lock(mutex_);
  trim_cache_locked(bytes);
}

void imported_resource_state::stop_caching() noexcept {
  std::lock_guard lock(mutex_);
  keep_bytes_ = 0;
  trim_cache_locked(0);
}

imported_resource_state::~imported_resource_state() {
  trim_cache_locked(0);
}

imported_resource_statistics imported_resource_state::statistics() const {
  std::lock_guard lock(mutex_);
  imported_resource_statistics s = statistics_;
  s.segments = mirrors_.size();
  s.pages_mapped = 0;
  for (const auto& [segment, m] : mirrors_) s.pages_mapped += m.pages.size();
  return s;
}

}  // namespace detail

// ---- imported_pointer, imported_resource --------------------------------------------------

imported_pointer::imported_pointer(imported_pointer&& other) noexcept
    : state_(std::move(other.state_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      segment_(std::exchange(other.segment_, 0)),
      offset_(std::exchange(other.offset_, 0)),
      stream_(std::exchange(other.stream_, stream_ref())) {}

imported_pointer& imported_pointer::operator=(imported_pointer&& other) noexcept {
  if (this != &other) {
    reset();
    state_ = std::move(other.state_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    segment_ = std::exchange(other.segment_, 0);
    offset_ = std::exchange(other.offset_, 0);
    stream_ = std::exchange(other.stream_, stream_ref());
  }
  return *this;
}

imported_pointer::~imported_pointer() {
  reset();
}

void imported_pointer::reset() noexcept {
  if (state_ == nullptr) return;
  state_->release(*this);
  state_.reset();  // the state may go with it, outside its lock
  data_ = nullptr;
  bytes_ = 0;
  segment_ = 0;
  offset_ = 0;
}

imported_resource::imported_resource(const resource_description& description, resource_import_options options)
    : state_(std::make_shared<detail::imported_resource_state>(description, std::move(options))) {}

imported_resource imported_resource::receive(int socket_fd, resource_import_options options) {
  const resource_description description = receive_resource(socket_fd, options.timeout);
  return imported_resource(description, std::move(options));
}

imported_resource::imported_resource(imported_resource&&) noexcept = default;

imported_resource& imported_resource::operator=(imported_resource&& other) noexcept {
  if (this != &other) {
    if (state_ != nullptr) state_->stop_caching();
    state_ = std::move(other.state_);
  }
  return *this;
}

imported_resource::~imported_resource() {
  if (state_ != nullptr) state_->stop_caching();
}

void imported_resource::trim() noexcept {
  if (state_ != nullptr) state_->trim_to(0);
}

imported_pointer imported_resource::import_pointer(received_pointer received, stream_ref stream) {
  return state_->import(std::move(received), stream);
}

imported_pointer imported_resource::import_pointer(received_pointer received) {
  return state_->import(std::move(received), state_->stream);
}

imported_pointer imported_resource::receive_pointer(int socket_fd, stream_ref stream) {
  return import_pointer(ipc::receive_pointer(socket_fd, state_->description.granularity, state_->timeout),
                        stream);
}

imported_pointer imported_resource::receive_pointer(int socket_fd) {
  return receive_pointer(socket_fd, state_->stream);
}

void* imported_resource::allocate(stream_ref, std::size_t bytes, std::size_t) {
  throw invalid_argument(fmt::format(
      "imported_resource: {} bytes asked for, but a process cannot allocate from an imported resource: it "
      "maps "
      "memory that resource {:#x} of another process allocated (allocate there and share the pointer)",
      bytes, state_->description.resource_id));
}

void* imported_resource::allocate_sync(std::size_t bytes, std::size_t alignment) {
  return allocate(stream_ref(), bytes, alignment);
}

const resource_description& imported_resource::description() const noexcept {
  return state_->description;
}
access_mode imported_resource::access() const noexcept {
  return state_->access;
}
const std::shared_ptr<memory_provider>& imported_resource::provider() const noexcept {
  return state_->provider;
}
imported_resource_statistics imported_resource::statistics() const {
  return state_->statistics();
}

}  // namespace vmm::ipc
