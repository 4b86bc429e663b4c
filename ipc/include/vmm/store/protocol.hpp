#pragma once
/// @file
/// The vmm-store wire protocol: the requests a client sends the daemon and the replies it
/// gets, as values and as bytes.
///
///     vmm::store::request ask{.op = vmm::store::operation::stat, .name = "weights"};
///     std::vector<std::byte> bytes = vmm::store::encode(ask);      // one fd_channel message
///     vmm::store::request got = vmm::store::decode_request(bytes);  // or protocol_error
///
/// Most code never touches this: vmm::store::client speaks it, vmm::store::server answers.
/// It is public so that the daemon's dispatch can be fuzzed and peers in other languages
/// can be written; docs/store.md describes it in prose.
///
/// Transport. Every request and reply is one vmm::ipc message (fd_channel.hpp) with no
/// descriptors, but hello's reply, which carries the version table's descriptor when
/// daemon_info::version_slots is not 0. A reply that carries memory (create, get, refresh) is
/// followed by a manifest sent with vmm::ipc::send_manifest (its descriptors travel there,
/// and the importer checks every byte of it). Requests carry no descriptors but offer and
/// offer_more (one per chunk of the frame, at most max_offer_chunks): the daemon closes a
/// connection whose other request does, or whose frame's count differs from its chunks'.
///
/// The version table. A read-only shared memory of version_slots u64 words (a sealed memfd):
/// the daemon bumps the word of an entry's slot whenever the entry is removed, sealed,
/// grown, loses its name or ends. Replies that hold an entry (hold_reply) give its slot and
/// the word's value. A client that maps an entry already and reads that value still knows
/// the entry unchanged: it takes a hold with a hold request (no reply) instead of a get.
///
/// Wire format, version 5. Little-endian, no padding.
///
///   request
///     0  4 magic    "VMMS" (0x534d4d56 read as a little-endian u32)
///     4  2 version  5
///     6  2 op       operation
///     8  .. body    by op, exactly (trailing bytes are refused):
///        hello       nothing
///        create      location kind u8 (0 device, 2 os host), flags u8 (bit 0: one chunk,
///                    below; the others 0), 2 bytes 0, location id i32, size u64, max size
///                    u64 (0: the daemon's default), name. One chunk: the size is mapped
///                    as one physical chunk, and each grow maps exactly its growth as one
///                    more (a tensor set: one handle to import, or chunks that end where
///                    its tensors end)
///        seal        flags u8 (bit 0: de-duplicate, below; the others 0), 7 bytes 0, name.
///                    De-duplicate: each chunk whose bytes equal a chunk of another sealed,
///                    de-duplicated entry at the same location maps that chunk instead
///                    (docs/store.md, "De-duplication")
///        get         access u8 (1 read-only, 2 read-write), 7 bytes 0, cached entry u64,
///                    cached generation u64, cached end u64 (all 0: nothing cached), name
///        refresh     entry u64, generation u64, end u64
///        release     entry u64                                    (no reply)
///        hold        entry u64                                    (no reply)
///        grow        size u64, name
///        grant       pid u32, name
///        list, statistics   nothing
///        stat, remove       name
///        seal_set    flags u8 (as seal's), 7 bytes 0, table offset u64, table bytes u64,
///                    name: seal a tensor set whose
///                    table (tensors.hpp) the creator wrote at [offset, offset + bytes) of
///                    the buffer, every tensor inside [0, offset)
///        tensors     entry u64 (one this client holds): the table of its tensor set
///        offer       location kind u8, flags u8 (bit 0: a tensor set), 2 bytes 0, location
///                    id i32, size u64, origin instance u64, origin entry u64, generation
///                    u64, table offset u64, table bytes u64, chunks in all u32, chunks here
///                    k u32 (at most max_offer_chunks), name, k x chunk size u64. Sealed
///                    memory that a client maps, offered back to a restarted daemon; the
///                    frame carries the k chunks' descriptors (on the OS provider, memfds),
///                    in order. The ok reply is empty while chunks are missing, then a
///                    hold_reply (no hold taken)
///        offer_more  chunks here k u32, k x chunk size u64: the next chunks of the offer
///                    this connection began, with their k descriptors
///     a name is u16 length, then that many bytes: 1 to max_name_bytes of valid UTF-8 with
///     no control character (below 0x20, or 0x7f)
///
///   reply
///     0  4 magic    "VMMR" (0x524d4d56)
///     4  2 version  5
///     6  2 status   0 ok, else an error (status below)
///     8  .. body:   error: u16 length + message (UTF-8, at most 4096 bytes);
///                   ok: by the request's op (reply structs below, encoded field by field)
///
/// Versioning. The client's first request is hello; a daemon refuses any request of another
/// version with status unsupported_version and closes the connection, and a client refuses
/// a reply of another version.

#include <vmm/location.hpp>
#include <vmm/ipc/protocol_error.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace vmm::store {

/// "VMMS" and "VMMR" read as little-endian integers.
inline constexpr std::uint32_t request_magic = 0x534d4d56;
inline constexpr std::uint32_t reply_magic = 0x524d4d56;
/// The version this library writes and the only one it reads.
inline constexpr std::uint16_t protocol_version = 5;
/// The longest name, in bytes.
inline constexpr std::size_t max_name_bytes = 255;
/// The largest request payload: every request fits in far less. Larger frames are refused
/// before their payload is read.
inline constexpr std::size_t max_request_bytes = 1024;
/// The most chunks (and descriptors) one offer or offer_more frame carries.
inline constexpr std::size_t max_offer_chunks = 64;
/// The longest error message a reply carries.
inline constexpr std::size_t max_error_bytes = 4096;

/// What a request asks for.
enum class operation : std::uint16_t {
  hello = 1,
  create = 2,
  seal = 3,
  get = 4,
  refresh = 5,
  release = 6,
  grow = 7,
  grant = 8,
  list = 9,
  stat = 10,
  remove = 11,
  statistics = 12,
  hold = 13,
  seal_set = 14,
  tensors = 15,
  offer = 16,
  offer_more = 17,
};

/// The outcome of a request, as the daemon reports it.
enum class status : std::uint16_t {
  ok = 0,
  bad_request = 1,          ///< the request broke the protocol; the daemon closes the connection
  unsupported_version = 2,  ///< another protocol version; the daemon closes the connection
  not_found = 3,            ///< no buffer of that name (or entry)
  exists = 4,               ///< create: the name is taken
  denied = 5,               ///< uid not allowed, or writable access not granted
  cap_exceeded = 6,         ///< a daemon or client cap would be passed (the message names it)
  sealed = 7,               ///< writable access or growth asked of a sealed buffer
  out_of_memory = 8,        ///< the memory itself ran out
  invalid = 9,              ///< a request well-formed but impossible (size past max size, ...)
  unavailable = 10,         ///< the daemon cannot serve that location (no GPU, no export)
  internal = 11,            ///< anything else the daemon hit; the message says what
};

/// "ok", "not found", ...
[[nodiscard]] const char* to_string(status code) noexcept;
/// Whether `name` is a valid buffer name: 1 to max_name_bytes bytes of valid UTF-8 (no
/// overlong forms, surrogates or code points past U+10FFFF) without control characters.
/// @param why set to the reason when invalid (may be null).
[[nodiscard]] bool valid_name(std::string_view name, std::string* why = nullptr);

/// A request as values. Fields an operation does not use are left at their defaults.
struct request {
  operation op = operation::hello;
  std::string name;
  location where;                               ///< create
  std::uint64_t size = 0;                       ///< create, grow
  std::uint64_t max_size = 0;                   ///< create
  bool one_chunk = false;                       ///< create: its size (and each grow) as one chunk
  access_mode access = access_mode::read_only;  ///< get
  std::uint64_t entry = 0;                      ///< get (cached), refresh, release, hold
  std::uint64_t generation = 0;                 ///< get (cached), refresh
  std::uint64_t end = 0;                        ///< get (cached), refresh
  std::uint32_t pid = 0;                        ///< grant
  std::uint64_t table_offset = 0;               ///< seal_set
  std::uint64_t table_bytes = 0;                ///< seal_set, offer
  bool deduplicate = false;                     ///< seal, seal_set: share chunks of equal bytes
  bool tensor_set = false;                      ///< offer: a tensor set, its table at table_offset
  std::uint64_t origin = 0;                     ///< offer: the instance of the daemon it came from
  std::uint32_t chunk_total = 0;                ///< offer: chunks of the whole offer
  std::vector<std::uint64_t> chunk_sizes;       ///< offer, offer_more: this frame's chunks
  friend bool operator==(const request&, const request&) = default;
};

/// The bytes of `message`.
/// @throws vmm::invalid_argument the name is invalid (where the op takes one), the access
///         of a get is none, or a create's location cannot be stored.
[[nodiscard]] std::vector<std::byte> encode(const request& message);
/// Parses a request, checking every byte (magic, version, op, reserved bytes, lengths, the
/// name); an unknown version throws unsupported_version_error.
/// @throws vmm::ipc::protocol_error the bytes are not a valid request of this version.
[[nodiscard]] request decode_request(std::span<const std::byte> bytes);

/// A request of another protocol version: the daemon says so, then closes the connection.
class unsupported_version_error : public ipc::protocol_error {
 public:
  using ipc::protocol_error::protocol_error;
};

/// What the daemon says about one buffer (stat, list).
struct buffer_info {
  std::string name;
  std::uint64_t entry = 0;  ///< the daemon's id of this buffer: a new id per create
  location where;
  std::uint64_t size = 0;      ///< bytes in use
  std::uint64_t capacity = 0;  ///< bytes of physical memory behind it
  std::uint64_t max_size = 0;  ///< the most it may grow to
  std::uint32_t holders = 0;   ///< holds taken by every client together
  bool sealed = false;
  std::uint32_t tensors = 0;      ///< tensors of its set (0: a plain buffer)
  std::uint64_t named_bytes = 0;  ///< bytes its tensors name together
  /// Bytes of physical memory counted to it (by the caps and daemon_statistics::bytes): its
  /// capacity, less the chunks it shares that another buffer pays for (de-duplication).
  std::uint64_t stored_bytes = 0;
  /// Bytes of its capacity in chunks that another live buffer maps too.
  std::uint64_t shared_bytes = 0;
  friend bool operator==(const buffer_info&, const buffer_info&) = default;
};

/// Who the daemon is: hello's reply. `instance` is new at every start: a client that sees
/// another instance than before knows the daemon restarted, empty.
struct daemon_info {
  std::uint64_t instance = 0;
  std::uint64_t started_ns = 0;  ///< CLOCK_REALTIME at start, in nanoseconds
  std::uint32_t pid = 0;
  std::uint16_t version = protocol_version;
  std::uint32_t version_slots = 0;  ///< words of the version table (0: none is offered)
  friend bool operator==(const daemon_info&, const daemon_info&) = default;
};

/// hold_reply::slot of an entry without a word in the version table.
inline constexpr std::uint32_t no_version_slot = 0xffffffff;

/// How a reply to get/create/refresh delivers memory.
enum class delivery : std::uint8_t {
  current = 0,  ///< nothing follows: the client's cached import is up to date
  whole = 1,    ///< a whole manifest follows: import it
  growth = 2,   ///< a growth manifest follows: map it after the cached import
};

/// The ok reply of create, get and refresh.
struct hold_reply {
  std::uint64_t entry = 0;
  std::uint64_t size = 0;
  delivery sent = delivery::current;
  bool sealed = false;
  std::uint32_t slot = no_version_slot;  ///< the entry's word in the version table
  std::uint64_t version = 0;             ///< that word's value as of this reply
  friend bool operator==(const hold_reply&, const hold_reply&) = default;
};

/// The daemon's counters (statistics): what a leak check compares.
struct daemon_statistics {
  std::uint64_t connections = 0;
  std::uint64_t entries = 0;         ///< buffers alive, named or removed but still held
  std::uint64_t named_entries = 0;   ///< buffers that a name reaches
  std::uint64_t holds = 0;           ///< holds of every connection together
  std::uint64_t bytes = 0;           ///< bytes stored: physical memory of every live buffer,
                                     ///< each chunk once (what the cap counts)
  std::uint64_t capacity = 0;        ///< bytes named: every live buffer's capacity added up
  std::uint64_t pool_used = 0;       ///< chunk pools' used_current, every location
  std::uint64_t pool_reserved = 0;   ///< chunk pools' reserved_current, every location
  std::uint64_t cached_exports = 0;  ///< the exporter's cached chunks
  std::uint64_t open_fds = 0;        ///< entries of the daemon's /proc/self/fd
  friend bool operator==(const daemon_statistics&, const daemon_statistics&) = default;
};

/// Reply bodies: the bytes after the reply header, and back. Decoders check every byte and
/// throw vmm::ipc::protocol_error. The encoders throw nothing but std::bad_alloc (the
/// daemon encodes only what it has checked).
[[nodiscard]] std::vector<std::byte> encode_ok(std::span<const std::byte> body = {});
[[nodiscard]] std::vector<std::byte> encode_error(status code, std::string_view message);
[[nodiscard]] std::vector<std::byte> encode(const buffer_info& info);
[[nodiscard]] std::vector<std::byte> encode(const std::vector<buffer_info>& infos);
[[nodiscard]] std::vector<std::byte> encode(const daemon_info& info);
[[nodiscard]] std::vector<std::byte> encode(const hold_reply& reply);
[[nodiscard]] std::vector<std::byte> encode(const daemon_statistics& counters);

/// A reply split into its status and body; the error message when not ok.
struct reply {
  status code = status::ok;
  std::string message;          ///< when code != ok
  std::vector<std::byte> body;  ///< when code == ok
};
/// @throws vmm::ipc::protocol_error bad magic, another version, an unknown status, a
///         truncated or oversized error message.
[[nodiscard]] reply decode_reply(std::span<const std::byte> bytes);
/// @throws vmm::ipc::protocol_error the body is not a valid buffer_info (its name included).
[[nodiscard]] buffer_info decode_buffer_info(std::span<const std::byte> body);
/// @throws vmm::ipc::protocol_error as decode_buffer_info, or the count does not fit the body.
[[nodiscard]] std::vector<buffer_info> decode_buffer_infos(std::span<const std::byte> body);
/// @throws vmm::ipc::protocol_error the body is not a valid daemon_info.
[[nodiscard]] daemon_info decode_daemon_info(std::span<const std::byte> body);
/// @throws vmm::ipc::protocol_error the body is not a valid hold_reply.
[[nodiscard]] hold_reply decode_hold_reply(std::span<const std::byte> body);
/// @throws vmm::ipc::protocol_error the body is not a valid daemon_statistics.
[[nodiscard]] daemon_statistics decode_daemon_statistics(std::span<const std::byte> body);

}  // namespace vmm::store
