#include <vmm/ipc/manifest.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <string>

#include "vmm/ipc/detail/little_endian.hpp"

namespace vmm::ipc {
namespace {

using detail::load;
using detail::store;

constexpr std::uint8_t grant_read_only = 1;
constexpr std::uint8_t grant_read_write = 2;

// Field offsets of the header and of a chunk entry (see the file comment of manifest.hpp).
namespace header {
constexpr std::size_t magic = 0, version = 4, kind = 6, grant = 7, chunk_count = 8, location_kind = 12,
                      reserved_13 = 13, location_id = 16, reserved_20 = 20, buffer_id = 24, granularity = 32,
                      max_size = 40, base_offset = 48, start = 56, end = 64, size = 72;
}  // namespace header
namespace entry {
constexpr std::size_t offset = 0, size = 8, location_kind = 16, handle_kind = 17, reserved = 18,
                      location_id = 20;
}  // namespace entry

static_assert(header::size + 8 == manifest_header_bytes);
static_assert(entry::location_id + 4 == manifest_chunk_bytes);

[[noreturn]] void fail(const std::string& what) {
  throw bad_manifest("manifest: " + what);
}

constexpr std::uint8_t kind_code(memory_kind kind) {
  return static_cast<std::uint8_t>(kind);
}

memory_kind parse_memory_kind(std::uint8_t code, const std::string& what) {
  switch (code) {
    case kind_code(memory_kind::device):
    case kind_code(memory_kind::pinned_host):
    case kind_code(memory_kind::os_host):
      return static_cast<memory_kind>(code);
    default:
      fail(fmt::format("{}: unknown location kind {}", what, code));
  }
}

location parse_location(std::uint8_t kind, std::uint32_t id, const std::string& what) {
  const memory_kind parsed = parse_memory_kind(kind, what);
  if (id > static_cast<std::uint32_t>(std::numeric_limits<int>::max()))
    fail(fmt::format("{}: location id {} is negative", what, static_cast<std::int32_t>(id)));
  return location{parsed, static_cast<int>(id)};
}

void check_location(const location& where, const std::string& what) {
  if (where.kind != memory_kind::device && where.kind != memory_kind::pinned_host &&
      where.kind != memory_kind::os_host)
    fail(fmt::format("{}: unknown location kind {}", what, static_cast<int>(where.kind)));
  if (where.id < 0) fail(fmt::format("{}: location id {} is negative", what, where.id));
  if (where.kind == memory_kind::os_host && where.id != 0)
    fail(fmt::format("{}: os host memory has no location id {}", what, where.id));
}

bool is_multiple(std::uint64_t value, std::uint64_t granularity) {
  return (value & (granularity - 1)) == 0;
}

// The byte length the counts of a manifest call for (they are bounded: no overflow).
std::uint64_t expected_length(std::uint64_t chunk_count, std::uint64_t fabric_count) {
  return manifest_header_bytes + chunk_count * manifest_chunk_bytes +
         fabric_count * manifest_fabric_handle_bytes;
}

}  // namespace

std::size_t manifest::fd_count() const noexcept {
  return static_cast<std::size_t>(std::count_if(chunks.begin(), chunks.end(), [](const manifest_chunk& c) {
    return c.handle == handle_kind::posix_fd;
  }));
}

void validate(const manifest& m) {
  if (m.kind != manifest_kind::whole && m.kind != manifest_kind::growth)
    fail(fmt::format("unknown kind {}", static_cast<int>(m.kind)));
  if (m.grant != access_mode::read_only && m.grant != access_mode::read_write)
    fail(fmt::format("grant {} is neither read-only nor read-write", static_cast<int>(m.grant)));
  check_location(m.where, "the buffer");
  if (m.chunks.size() > max_manifest_chunks)
    fail(fmt::format("{} chunks; at most {} allowed", m.chunks.size(), max_manifest_chunks));
  if (m.granularity < 4096 || !std::has_single_bit(m.granularity))
    fail(fmt::format("granularity {} is not a power of two of at least 4096", m.granularity));
  if (m.max_size == 0 || !is_multiple(m.max_size, m.granularity))
    fail(fmt::format("max size {} is not a non-zero multiple of the granularity {}", m.max_size,
                     m.granularity));
  if (!is_multiple(m.base_offset, m.granularity))
    fail(fmt::format("base offset {} is not a multiple of the granularity {}", m.base_offset, m.granularity));
  if (m.base_offset > std::numeric_limits<std::uint64_t>::max() - m.max_size)
    fail(fmt::format("base offset {} + max size {} overflows", m.base_offset, m.max_size));
  if (m.kind == manifest_kind::whole && m.start != 0)
    fail(fmt::format("a whole manifest starts at offset 0, not {}", m.start));
  if (!is_multiple(m.start, m.granularity))
    fail(fmt::format("start {} is not a multiple of the granularity {}", m.start, m.granularity));
  if (m.start > m.max_size) fail(fmt::format("start {} lies past the max size {}", m.start, m.max_size));

  std::uint64_t position = m.start;
  for (std::size_t i = 0; i < m.chunks.size(); ++i) {
    const manifest_chunk& c = m.chunks[i];
    const std::string what = fmt::format("chunk {} of {}", i, m.chunks.size());
    check_location(c.where, what);
    if (c.where.kind != m.where.kind)
      fail(fmt::format("{} is {} memory but the buffer is {} memory", what, to_string(c.where),
                       to_string(m.where)));
    if (c.handle != handle_kind::posix_fd && c.handle != handle_kind::fabric)
      fail(fmt::format("{}: unknown handle kind {}", what, static_cast<int>(c.handle)));
    if (c.handle != handle_kind::fabric && c.fabric != fabric_handle{})
      fail(fmt::format("{}: a {} chunk carries fabric handle bytes", what, to_string(c.handle)));
    if (c.size == 0 || !is_multiple(c.size, m.granularity))
      fail(fmt::format("{}: size {} is not a non-zero multiple of the granularity {}", what, c.size,
                       m.granularity));
    if (c.offset != position)
      fail(fmt::format("{}: offset {} leaves {} (chunks must follow each other from {})", what, c.offset,
                       c.offset > position ? "a gap" : "an overlap", position));
    if (c.size > m.max_size - position)
      fail(fmt::format("{}: [{}, +{}) runs past the max size {}", what, c.offset, c.size, m.max_size));
    position += c.size;  // <= max_size: no overflow
  }
  if (m.end != position) fail(fmt::format("end {} differs from where the chunks end, {}", m.end, position));
  if (m.size > m.end) fail(fmt::format("size {} exceeds the {} bytes mapped", m.size, m.end));
}

std::vector<std::byte> serialize(const manifest& m) {
  validate(m);
  std::size_t fabric_count = 0;
  for (const manifest_chunk& c : m.chunks) fabric_count += c.handle == handle_kind::fabric ? 1 : 0;
  std::vector<std::byte> bytes(static_cast<std::size_t>(expected_length(m.chunks.size(), fabric_count)));
  store<std::uint32_t>(bytes, header::magic, manifest_magic);
  store<std::uint16_t>(bytes, header::version, manifest_version);
  store<std::uint8_t>(bytes, header::kind, static_cast<std::uint8_t>(m.kind));
  store<std::uint8_t>(bytes, header::grant,
                      m.grant == access_mode::read_only ? grant_read_only : grant_read_write);
  store<std::uint32_t>(bytes, header::chunk_count, static_cast<std::uint32_t>(m.chunks.size()));
  store<std::uint8_t>(bytes, header::location_kind, kind_code(m.where.kind));
  store<std::uint32_t>(bytes, header::location_id, static_cast<std::uint32_t>(m.where.id));
  store<std::uint64_t>(bytes, header::buffer_id, m.buffer_id);
  store<std::uint64_t>(bytes, header::granularity, m.granularity);
  store<std::uint64_t>(bytes, header::max_size, m.max_size);
  store<std::uint64_t>(bytes, header::base_offset, m.base_offset);
  store<std::uint64_t>(bytes, header::start, m.start);
  store<std::uint64_t>(bytes, header::end, m.end);
  store<std::uint64_t>(bytes, header::size, m.size);
  std::size_t at = manifest_header_bytes;
  for (const manifest_chunk& c : m.chunks) {
    store<std::uint64_t>(bytes, at + entry::offset, c.offset);
    store<std::uint64_t>(bytes, at + entry::size, c.size);
    store<std::uint8_t>(bytes, at + entry::location_kind, kind_code(c.where.kind));
    store<std::uint8_t>(bytes, at + entry::handle_kind, static_cast<std::uint8_t>(c.handle));
    store<std::uint32_t>(bytes, at + entry::location_id, static_cast<std::uint32_t>(c.where.id));
    at += manifest_chunk_bytes;
  }
  for (const manifest_chunk& c : m.chunks) {
    if (c.handle != handle_kind::fabric) continue;
    std::copy(c.fabric.bytes.begin(), c.fabric.bytes.end(), bytes.begin() + static_cast<std::ptrdiff_t>(at));
    at += manifest_fabric_handle_bytes;
  }
  return bytes;
}

manifest parse_manifest(std::span<const std::byte> bytes) {
  // The version first: a later version may lay out everything after it differently.
  if (bytes.size() < header::version + 2)
    fail(fmt::format("truncated: {} bytes, the header alone is {}", bytes.size(), manifest_header_bytes));
  if (const auto magic = load<std::uint32_t>(bytes, header::magic); magic != manifest_magic)
    fail(fmt::format("bad magic {:#010x} (expected {:#010x}): not a vmm manifest", magic, manifest_magic));
  if (const auto version = load<std::uint16_t>(bytes, header::version); version != manifest_version)
    fail(
        fmt::format("version {} is not supported (this reader knows version {})", version, manifest_version));
  if (bytes.size() < manifest_header_bytes)
    fail(fmt::format("truncated: {} bytes, the header alone is {}", bytes.size(), manifest_header_bytes));

  manifest m;
  const auto kind = load<std::uint8_t>(bytes, header::kind);
  if (kind != static_cast<std::uint8_t>(manifest_kind::whole) &&
      kind != static_cast<std::uint8_t>(manifest_kind::growth))
    fail(fmt::format("unknown kind {}", kind));
  m.kind = static_cast<manifest_kind>(kind);
  const auto grant = load<std::uint8_t>(bytes, header::grant);
  if (grant != grant_read_only && grant != grant_read_write)
    fail(fmt::format("grant {} is neither read-only (1) nor read-write (2)", grant));
  m.grant = grant == grant_read_only ? access_mode::read_only : access_mode::read_write;
  const auto chunk_count = load<std::uint32_t>(bytes, header::chunk_count);
  if (chunk_count > max_manifest_chunks)
    fail(fmt::format("{} chunks; at most {} allowed", chunk_count, max_manifest_chunks));
  if (load<std::uint8_t>(bytes, header::reserved_13) != 0 ||
      load<std::uint16_t>(bytes, header::reserved_13 + 1) != 0 ||
      load<std::uint32_t>(bytes, header::reserved_20) != 0)
    fail("reserved header bytes are not zero");
  m.where = parse_location(load<std::uint8_t>(bytes, header::location_kind),
                           load<std::uint32_t>(bytes, header::location_id), "the buffer");
  m.buffer_id = load<std::uint64_t>(bytes, header::buffer_id);
  m.granularity = load<std::uint64_t>(bytes, header::granularity);
  m.max_size = load<std::uint64_t>(bytes, header::max_size);
  m.base_offset = load<std::uint64_t>(bytes, header::base_offset);
  m.start = load<std::uint64_t>(bytes, header::start);
  m.end = load<std::uint64_t>(bytes, header::end);
  m.size = load<std::uint64_t>(bytes, header::size);

  const std::uint64_t entries_end = expected_length(chunk_count, 0);
  if (bytes.size() < entries_end)
    fail(fmt::format("truncated: {} bytes, but {} chunk entries need {}", bytes.size(), chunk_count,
                     entries_end));
  m.chunks.resize(chunk_count);
  std::size_t fabric_count = 0;
  for (std::size_t i = 0; i < chunk_count; ++i) {
    const std::size_t at = manifest_header_bytes + i * manifest_chunk_bytes;
    const std::string what = fmt::format("chunk {} of {}", i, chunk_count);
    manifest_chunk& c = m.chunks[i];
    c.offset = load<std::uint64_t>(bytes, at + entry::offset);
    c.size = load<std::uint64_t>(bytes, at + entry::size);
    c.where = parse_location(load<std::uint8_t>(bytes, at + entry::location_kind),
                             load<std::uint32_t>(bytes, at + entry::location_id), what);
    const auto handle = load<std::uint8_t>(bytes, at + entry::handle_kind);
    if (handle != static_cast<std::uint8_t>(handle_kind::posix_fd) &&
        handle != static_cast<std::uint8_t>(handle_kind::fabric))
      fail(fmt::format("{}: unknown handle kind {}", what, handle));
    c.handle = static_cast<handle_kind>(handle);
    if (load<std::uint16_t>(bytes, at + entry::reserved) != 0)
      fail(fmt::format("{}: reserved bytes are not zero", what));
    fabric_count += c.handle == handle_kind::fabric ? 1 : 0;
  }
  const std::uint64_t length = expected_length(chunk_count, fabric_count);
  if (bytes.size() < length)
    fail(fmt::format("truncated: {} bytes, but {} chunk entries and {} fabric handles need {}", bytes.size(),
                     chunk_count, fabric_count, length));
  if (bytes.size() > length)
    fail(fmt::format("{} bytes after the last of {} chunk entries and {} fabric handles",
                     bytes.size() - length, chunk_count, fabric_count));
  std::size_t at = static_cast<std::size_t>(entries_end);
  for (manifest_chunk& c : m.chunks) {
    if (c.handle != handle_kind::fabric) continue;
    std::copy_n(bytes.begin() + static_cast<std::ptrdiff_t>(at), manifest_fabric_handle_bytes,
                c.fabric.bytes.begin());
    at += manifest_fabric_handle_bytes;
  }
  validate(m);
  return m;
}

}  // namespace vmm::ipc
