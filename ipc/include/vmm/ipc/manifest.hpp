#pragma once
/// @file
/// The manifest: what an exporter tells an importer about a shared buffer, as bytes.
///
///     vmm::ipc::manifest m = vmm::ipc::parse_manifest(got.payload);  // or bad_manifest
///     std::size_t fds = m.fd_count();          // the posix-fd chunks' fds travel alongside
///     for (const vmm::ipc::manifest_chunk& chunk : m.chunks)
///       std::printf("%zu bytes at +%zu\n", std::size_t(chunk.size), std::size_t(chunk.offset));
///     std::vector<std::byte> again = vmm::ipc::serialize(m);   // the same bytes
///
/// Most code never touches a manifest: vmm::ipc::exporter makes them and
/// vmm::ipc::imported_buffer reads them.
///
/// A manifest lists the physical chunks of a buffer (or of a chunk range of it) with the
/// offset of each in the importer's new address range, its size, where it lives and how
/// its handle travels (a file descriptor sent alongside, or a fabric handle inside the
/// manifest). The importer reserves max_size bytes and maps each chunk at its offset, so
/// that its address range has the exporter's layout, and a later growth manifest maps the
/// new tail at the same offsets without touching what is mapped already.
///
/// Wire format, version 1. Fixed layout, every integer little-endian, no padding:
///
///   header, 80 bytes
///    off size field
///      0   4  magic          "VMMF" (0x464d4d56 read as a little-endian u32)
///      4   2  version        1
///      6   1  kind           1 whole (the importer starts a new range), 2 growth (a tail)
///      7   1  grant          most access an importer may map: 1 read-only, 2 read-write
///      8   4  chunk_count    entries that follow (whole: >= 0; growth: >= 0)
///     12   1  location kind  of the buffer: 0 device, 1 pinned host, 2 os host
///     13   3  reserved       0
///     16   4  location id    device ordinal or NUMA node (>= 0; 0 for os host)
///     20   4  reserved       0
///     24   8  buffer_id      names the export generation: a whole export and the growth that
///                            follows it (growth manifests must match it)
///     32   8  granularity    the exporter's: a power of two >= 4096
///     40   8  max_size       bytes the importer reserves: non-zero multiple of granularity
///     48   8  base_offset    where the importer's range starts in the exporter's buffer
///     56   8  start          offset of the first chunk: 0 for whole manifests; for growth,
///                            what the importer must map already
///     64   8  end            start + the chunks' sizes; <= max_size
///     72   8  size           bytes in use (the buffer's size()); <= end
///   chunk entries, 24 bytes each, in address order
///      0   8  offset         from the importer's range start; the first is `start`, each
///                            next one is the previous offset + size (no gap, no overlap)
///      8   8  size           non-zero multiple of granularity
///     16   1  location kind  as in the header, and the same kind as the header's
///     17   1  handle kind    1 posix fd (the next fd of the message), 2 fabric
///     18   2  reserved       0
///     20   4  location id    as in the header
///   fabric handles, 64 bytes for each chunk whose handle kind is fabric, in chunk order.
///
/// The length of the bytes must be exactly what the counts say. parse_manifest() checks all
/// of the above before anything uses the manifest; the importer then checks what needs its
/// own process (providers, granularity, the import it extends).
///
/// Transport (send_manifest / receive_manifest, over vmm::ipc::send_message frames): the
/// manifest bytes travel in one message with the first max_fds_per_message fds; the
/// remaining fds follow in continuation messages of at most max_fds_per_message fds each,
/// whose payload is exactly 8 bytes: manifest_continuation_magic and the continuation's
/// number (1, 2, ...), both u32 little-endian. Every message's fd count is checked.

#include <vmm/error.hpp>
#include <vmm/ipc/protocol_error.hpp>
#include <vmm/location.hpp>
#include <vmm/ipc/fabric.hpp>
#include <vmm/provider.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace vmm::ipc {

/// A manifest that does not parse or does not hold together, or the messages that carry it
/// do not agree with it (their descriptor counts, a continuation out of place): the
/// exporter broke the protocol. Nothing was mapped and every descriptor received is closed;
/// close the socket. validate() and serialize() raise it too, for a manifest built in memory
/// that no peer would accept. It is a protocol_error, not a std::invalid_argument (it was in
/// 0.1): code that caught vmm::invalid_argument for a bad manifest catches this type, or
/// vmm::ipc::protocol_error, instead.
class bad_manifest : public protocol_error {
 public:
  using protocol_error::protocol_error;
};

/// "VMMF" read as a little-endian integer.
inline constexpr std::uint32_t manifest_magic = 0x464d4d56;
/// "VMMC": the payload of a continuation message that carries more of a manifest's fds.
inline constexpr std::uint32_t manifest_continuation_magic = 0x434d4d56;
/// The version this library writes and the only one it reads.
inline constexpr std::uint16_t manifest_version = 1;
inline constexpr std::size_t manifest_header_bytes = 80;
inline constexpr std::size_t manifest_chunk_bytes = 24;
inline constexpr std::size_t manifest_fabric_handle_bytes = 64;
/// The most chunk entries a manifest may list (about 24 MiB of entries).
inline constexpr std::size_t max_manifest_chunks = std::size_t{1} << 20;

/// Whether a manifest starts an import or extends one.
enum class manifest_kind : std::uint8_t {
  whole = 1,   ///< the importer reserves a new range and maps these chunks
  growth = 2,  ///< the importer maps these chunks after what it maps already
};

/// One physical chunk of a manifest.
struct manifest_chunk {
  std::uint64_t offset = 0;  ///< from the start of the importer's range
  std::uint64_t size = 0;
  location where;
  handle_kind handle = handle_kind::posix_fd;
  fabric_handle fabric{};  ///< the handle itself when handle == fabric; zeros otherwise
  friend bool operator==(const manifest_chunk&, const manifest_chunk&) = default;
};

/// A manifest as values. See the file comment for what each field means.
struct manifest {
  manifest_kind kind = manifest_kind::whole;
  access_mode grant = access_mode::read_write;
  location where;  ///< where the buffer's memory lives (every chunk's kind is this one's)
  std::uint64_t buffer_id = 0;
  std::uint64_t granularity = 0;
  std::uint64_t max_size = 0;
  std::uint64_t base_offset = 0;
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint64_t size = 0;
  std::vector<manifest_chunk> chunks;

  /// The number of file descriptors that travel with the manifest (posix-fd chunks).
  [[nodiscard]] std::size_t fd_count() const noexcept;
  friend bool operator==(const manifest&, const manifest&) = default;
};

/// Checks every rule of the file comment on a manifest built in memory.
/// @throws vmm::ipc::bad_manifest naming the first rule broken (and the chunk).
void validate(const manifest& description);

/// The wire bytes of `description`, after validate().
/// @throws vmm::ipc::bad_manifest the manifest breaks a rule.
[[nodiscard]] std::vector<std::byte> serialize(const manifest& description);

/// Parses and validates wire bytes. Every byte is checked: magic, version, kind, grant,
/// reserved bytes, counts against the length, location and handle kinds, sizes, contiguous
/// offsets, totals without overflow.
/// @throws vmm::ipc::bad_manifest the bytes are truncated, forged, of another version, or
///         break a rule; the message says which.
[[nodiscard]] manifest parse_manifest(std::span<const std::byte> bytes);

}  // namespace vmm::ipc
