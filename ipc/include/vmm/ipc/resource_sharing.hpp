#pragma once
/// @file
/// Sharing a vmm::memory_resource with other processes, pointer by pointer: the feature set
/// of cudaMemPool's IPC pools (cudaMemPoolExportToShareableHandle, cudaMemPoolExportPointer,
/// cudaMemPoolImportPointer) on vmm's stream-ordered resource.
///
///     // process A: owns the resource                  // process B: maps A's pointers
///     vmm::memory_resource pool(where, {.handle_type = vmm::handle_kind::posix_fd});
///     vmm::ipc::resource_exporter exporter(pool);
///     vmm::ipc::send_resource(socket, exporter.export_resource());
///                                                        auto shared =
///                                                        vmm::ipc::imported_resource::receive(socket);
///     void* p = pool.allocate(s, n);
///     vmm::ipc::send_pointer(socket, exporter.export_pointer(p, n));
///                                                        vmm::ipc::imported_pointer q =
///                                                            shared.receive_pointer(socket, t);
///                                                        kernel<<<..., t.get()>>>(q.data());
///                                                        q.reset();   // unmapped once t passes
///     pool.deallocate(s, p, n);   // after B let go (a hand-off says when: vmm/ipc/handoff.hpp)
///
/// Design (docs/design/resource_sharing.md). The importer mirrors the exporter's layout: for
/// each arena of the resource it has seen a pointer in (a "segment") it reserves, on the first
/// pointer there, a range of the arena's size and maps each page at the page's own offset.
/// So a pointer travels as (segment, offset, bytes) and lands at mirror_base + offset. A page
/// is mapped once however many imported pointers cover it, and unmapped in stream order when
/// the last of them lets go (vmm/retirement.hpp); a segment that maps nothing any more frees
/// its range. export_pointer() sends every page of the pointer, each with the exporter's page
/// id (unique for the life of the exporter's physical page), so that an importer never
/// mistakes other memory at a page's offset for what it maps there; each page's handle is
/// exported once (vmm::ipc::exporter's cache).
///
/// Descriptors. On the POSIX-fd path every page travels as a descriptor, and the exporter's
/// cache keeps one per page it ever exported until the resource gives the page up (purge()):
/// raise RLIMIT_NOFILE for pointers of thousands of pages, as for vmm::ipc::exporter.
///
/// Keeping let-go pages (resource_import_options::keep_mapped_bytes). With a bound set, a
/// page no imported pointer uses any more stays imported and mapped while the cached pages fit
/// the bound, and a pointer that arrives with the same page id takes it back with no driver
/// call; beyond the bound the least recently let-go pages go, in stream order. While cached,
/// the exporter cannot give that memory back to its device (as with a cudaMemPool IPC
/// import). The exporter's resource keeps every feature while shared (it allocates, frees,
/// stitches and trims); an importer cannot allocate. Reasons and costs:
/// docs/design/resource_sharing.md.
///
/// The rule both sides rely on, as with cudaMemPool IPC: the exporter frees an allocation
/// only after every importer has let go of it (imported_pointer::reset(), in stream order;
/// vmm::ipc::handoff_producer / handoff_consumer carry that order without a host waiting).
/// An exporter that breaks it lets its importers see memory the resource has reused; the
/// importer notices where it can (a page id that differs from the page it maps at that
/// offset, while a pointer it holds still uses that page) and refuses the import.
///
/// Wire format, version 1: a resource message (32 bytes, "VMMR") and, per pointer, a pointer
/// message (48 bytes and 8 per page id, "VMMP") followed by a whole manifest of its pages
/// (vmm/ipc/manifest.hpp); every integer little-endian, no padding. The layout, field by field,
/// is in docs/design/resource_sharing.md, "Wire format". The receiver checks every byte, then
/// the manifest against the pointer message and the resource; anything that does not hold is
/// a vmm::ipc::protocol_error (a vmm::ipc::bad_manifest for the manifest itself), with
/// nothing mapped and every fd closed.

#include <vmm/ipc/exporter.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/importer.hpp>
#include <vmm/ipc/manifest.hpp>
#include <vmm/ipc/protocol_error.hpp>
#include <vmm/memory_resource.hpp>
#include <vmm/stream_ref.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace vmm::ipc {

/// "VMMR" read as a little-endian integer.
inline constexpr std::uint32_t resource_message_magic = 0x524d4d56;
/// "VMMP" read as a little-endian integer.
inline constexpr std::uint32_t pointer_message_magic = 0x504d4d56;
/// The version of both messages this library writes, and the only one it reads.
inline constexpr std::uint16_t resource_sharing_version = 1;
inline constexpr std::size_t resource_message_bytes = 32;
inline constexpr std::size_t pointer_header_bytes = 48;
/// Segments a pointer may name: the arenas a memory_resource makes at most.
inline constexpr std::size_t max_segments = memory_resource::max_arenas;

/// What an importer needs to create an imported_resource (the resource message).
struct resource_description {
  std::uint64_t resource_id = 0;
  location where;
  std::uint64_t granularity = 0;
  access_mode grant = access_mode::read_write;
  friend bool operator==(const resource_description&, const resource_description&) = default;
};

/// One exported pointer (the pointer message, without its manifest). See the file comment.
struct pointer_description {
  std::uint64_t resource_id = 0;
  std::uint32_t segment = 0;
  std::uint64_t segment_size = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  std::vector<std::uint64_t> page_ids;  ///< one per page the pointer touches, in order
  friend bool operator==(const pointer_description&, const pointer_description&) = default;
};

/// The wire bytes of a resource message.
/// @throws vmm::invalid_argument a field breaks the rules of the file comment.
[[nodiscard]] std::vector<std::byte> serialize(const resource_description& description);
/// Parses and checks every byte of a resource message.
/// @throws vmm::ipc::protocol_error truncated, forged, of another version, or a field out of
///         range (the message says which).
[[nodiscard]] resource_description parse_resource_description(std::span<const std::byte> bytes);
/// The wire bytes of a pointer message.
/// @throws vmm::invalid_argument a field breaks the rules of the file comment (the page
///         count is checked against the offset, the bytes and `granularity`).
[[nodiscard]] std::vector<std::byte> serialize(const pointer_description& description,
                                               std::uint64_t granularity);
/// Parses and checks every byte of a pointer message against the resource's granularity:
/// lengths, magic, version, reserved bytes, the segment, the sizes and their sum without
/// overflow, the page count against the pages the pointer touches, the page ids.
/// @throws vmm::ipc::protocol_error the bytes break a rule; the message says which.
[[nodiscard]] pointer_description parse_pointer_description(std::span<const std::byte> bytes,
                                                            std::uint64_t granularity);

/// A pointer ready to send: its description and wire bytes, and the manifest of its pages
/// with their fds.
struct exported_pointer {
  pointer_description description;
  std::vector<std::byte> bytes;
  exported_manifest pages;
};

/// A pointer received with its pages' fds, checked, nothing imported yet.
struct received_pointer {
  pointer_description description;
  received_manifest pages;
};

/// Sends a resource message (no fds).
/// @throws vmm::ipc::timeout_error, vmm::os_error as send_message.
void send_resource(int socket_fd, const resource_description& description,
                   std::chrono::milliseconds timeout = default_timeout);
/// Receives and parses a resource message.
/// @throws vmm::ipc::protocol_error not a valid resource message, or it carries fds (closed).
/// @throws vmm::ipc::timeout_error, vmm::ipc::peer_closed, vmm::os_error as receive_message.
[[nodiscard]] resource_description receive_resource(int socket_fd,
                                                    std::chrono::milliseconds timeout = default_timeout);
/// Sends a pointer message and its manifest; `timeout` bounds both.
/// @throws vmm::invalid_argument `exported` holds another number of fds than its manifest
///         names; nothing was sent.
/// @throws vmm::ipc::timeout_error, vmm::os_error as send_message.
void send_pointer(int socket_fd, const exported_pointer& exported,
                  std::chrono::milliseconds timeout = default_timeout);
/// Receives a pointer message and its manifest within `timeout`, and checks both (the
/// message against `granularity`, the manifest on its own and against the message).
/// Whatever it throws, every fd received is closed.
/// @throws vmm::ipc::protocol_error the pointer message is malformed, carries fds, or the
///         manifest does not describe its pages (vmm::ipc::bad_manifest for a manifest that
///         does not parse or that disagrees with its fds).
/// @throws vmm::ipc::timeout_error, vmm::ipc::peer_closed, vmm::os_error as receive_message.
[[nodiscard]] received_pointer receive_pointer(int socket_fd, std::uint64_t granularity,
                                               std::chrono::milliseconds timeout = default_timeout);

/// How a resource is exported.
struct resource_export_options {
  /// The most access an importer may map (see export_options::grant for what it protects).
  access_mode grant = access_mode::read_write;
};

/// The exporting side: one resource, its pointers, and the export cache of its pages.
/// Thread-safe. The resource must outlive the exporter.
class resource_exporter {
 public:
  /// @throws vmm::invalid_argument the resource's memory cannot be exported: it was made
  ///         with handle_type none (make it with memory_resource_properties::handle_type =
  ///         posix_fd), its provider exports no handle (pinned host memory), or the grant is
  ///         not read-only or read-write. The message says which.
  explicit resource_exporter(memory_resource& resource, resource_export_options options = {});
  resource_exporter(const resource_exporter&) = delete;
  resource_exporter& operator=(const resource_exporter&) = delete;
  /// Closes every cached fd; importers keep what they imported.
  ~resource_exporter();

  /// What an importer needs to create an imported_resource (send it with send_resource()).
  [[nodiscard]] resource_description export_resource() const noexcept { return description_; }
  /// The pointer `ptr`, a live allocation of `bytes` bytes of the resource, with all its
  /// pages (memory_resource::pages_of()). The first export of a page exports its handle;
  /// later ones dup the cached fd.
  /// @throws vmm::invalid_argument `ptr` is not a live allocation of `bytes` bytes of the
  ///         resource.
  /// @throws vmm::driver_error, vmm::os_error exporting a handle failed.
  [[nodiscard]] exported_pointer export_pointer(const void* ptr, std::size_t bytes);

  /// Drops the cache entries and page ids of pages the resource gave up (trimmed, or
  /// given back to its pool), closing their fds; each export does it too. Once every
  /// importer has let go of such a page, no process holds its memory any more. Throws
  /// nothing but std::system_error from a broken mutex.
  void purge();
  /// The export cache's counters (vmm::ipc::exporter). As purge().
  [[nodiscard]] export_statistics statistics() const;
  [[nodiscard]] memory_resource& resource() const noexcept { return resource_; }

 private:
  using page_key = std::weak_ptr<const pooled_chunk>;
  void purge_ids_locked();

  memory_resource& resource_;
  resource_description description_;
  exporter exporter_;
  mutable std::mutex mutex_;
  std::map<page_key, std::uint64_t, std::owner_less<>> page_ids_;
  std::uint64_t next_page_id_ = 1;
};

/// How a resource is imported.
struct resource_import_options {
  /// The access to map with: read-only or read-write, at most the resource's grant.
  access_mode access = access_mode::read_write;
  /// The provider for the memory; null: provider_for() of the resource's location. Its
  /// location and granularity must be the resource's.
  std::shared_ptr<memory_provider> provider;
  /// The stream imported pointers are used on unless import_pointer() is given another:
  /// their release is ordered after it (the legacy default stream when not given).
  stream_ref stream;
  /// The largest segment (exporter arena) this process reserves a mirror for; 0: four times
  /// the physical memory size of the resource's location
  /// (provider_capabilities::physical_memory_size), which holds any arena of a resource
  /// made with the default max_size. A pointer in a larger segment is refused.
  std::size_t max_size_limit = 0;
  /// How long receive() and receive_pointer() wait for the whole message.
  std::chrono::milliseconds timeout = default_timeout;
  /// How many bytes of pages that no imported pointer uses any more this process keeps
  /// imported and mapped (with access), so that a pointer arriving with them again maps at
  /// once, with no driver call (see "Keeping let-go pages" in the file comment). Counted in
  /// whole pages: at most keep_mapped_bytes / granularity pages are kept; beyond that the
  /// least recently let-go pages are unmapped and released, in stream order. 0 (the
  /// default): every page is released once the last pointer that uses it lets go. A kept
  /// page's physical memory stays alive in the exporter's device (this process holds its
  /// handle) until imported_resource::trim() or the imported_resource's destruction.
  std::size_t keep_mapped_bytes = 0;
};

/// What an imported resource holds now, and has done (lifetime counters).
struct imported_resource_statistics {
  std::size_t pointers = 0;        ///< imported pointers alive
  std::size_t segments = 0;        ///< mirrors reserved (one per exporter arena in use)
  std::size_t pages_mapped = 0;    ///< pages mapped now
  std::size_t pages_imported = 0;  ///< handles imported and mapped (lifetime)
  std::size_t pages_shared = 0;    ///< pages received that were mapped already: fd closed (lifetime)
  std::size_t pages_released = 0;  ///< pages retired once no pointer used them (lifetime)
  /// Pages received that were cached (kept after every pointer let go, see
  /// resource_import_options::keep_mapped_bytes) and taken back: fd closed, no driver call
  /// (lifetime). Not counted in pages_shared.
  std::size_t pages_reused = 0;
  /// Bytes of the pages cached now: mapped, counted in pages_mapped, used by no pointer.
  std::size_t cached_bytes = 0;
};

namespace detail {
class imported_resource_state;
}

/// One imported pointer: [data(), data() + size()) maps the exporter's allocation. Its
/// pages stay mapped while it lives; destroying it (or reset()) lets go of them in stream
/// order, after the work queued on stream() so far. Move-only; safe to outlive the
/// imported_resource it came from.
class imported_pointer {
 public:
  imported_pointer() noexcept = default;
  imported_pointer(imported_pointer&& other) noexcept;
  imported_pointer& operator=(imported_pointer&& other) noexcept;
  imported_pointer(const imported_pointer&) = delete;
  imported_pointer& operator=(const imported_pointer&) = delete;
  /// reset().
  ~imported_pointer();

  /// The first byte (nullptr when empty).
  [[nodiscard]] void* data() const noexcept { return data_; }
  /// The exporter's allocation size.
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  /// The exporter's arena, and the offset in it.
  [[nodiscard]] std::uint32_t segment() const noexcept { return segment_; }
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
  [[nodiscard]] stream_ref stream() const noexcept { return stream_; }
  /// Orders the release after work on `stream` instead.
  void set_stream(stream_ref stream) noexcept { stream_ = stream; }
  explicit operator bool() const noexcept { return data_ != nullptr; }
  /// Lets go now: pages no other imported pointer uses are unmapped once the work queued on
  /// stream() so far has passed (at once on host memory). Never throws; becomes empty.
  void reset() noexcept;

 private:
  friend class detail::imported_resource_state;
  std::shared_ptr<detail::imported_resource_state> state_;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::uint32_t segment_ = 0;
  std::uint64_t offset_ = 0;
  stream_ref stream_;
};

/// Another process's memory_resource, as seen here: the pointers it shares are mapped at
/// the exporter's layout. See the file comment. Thread-safe; move-only. Imported pointers
/// keep what they map alive, so the object may be destroyed before them.
class imported_resource {
 public:
  /// Nothing is reserved or mapped until the first pointer arrives.
  /// @throws vmm::invalid_argument the location has no provider here, the provider given
  ///         serves other memory or has another granularity, or the access asked for is
  ///         not read-only or read-write or exceeds the grant.
  /// @throws vmm::driver_unavailable GPU memory and no usable driver or GPU.
  explicit imported_resource(const resource_description& description, resource_import_options options = {});
  /// Receives a resource message (receive_resource) within options.timeout and imports it.
  /// Same errors as above and as receive_resource().
  /// @throws vmm::invalid_argument, vmm::driver_unavailable as the constructor above.
  /// @throws vmm::ipc::protocol_error, vmm::ipc::timeout_error, vmm::ipc::peer_closed,
  ///         vmm::os_error as receive_resource().
  [[nodiscard]] static imported_resource receive(int socket_fd, resource_import_options options = {});
  imported_resource(imported_resource&&) noexcept;
  imported_resource& operator=(imported_resource&&) noexcept;
  imported_resource(const imported_resource&) = delete;
  imported_resource& operator=(const imported_resource&) = delete;
  /// Gives back the cached pages (trim()); pointers that outlive the object let go of
  /// their pages as with keep_mapped_bytes 0.
  ~imported_resource();

  /// Maps the pages of `received` that are not mapped yet (importing their handles; the
  /// fds of the pages mapped already are closed), at the exporter's offsets in the mirror
  /// of its segment (reserved on the first pointer in it), and returns the pointer. Its
  /// release is ordered after `stream`. A cached page with the same page id is taken out of
  /// the cache; a cached page with another id is retired (once the streams that used it
  /// have passed: this call waits for them) and the new page imported in its place.
  /// Strong guarantee: on failure nothing new is mapped or reserved, every fd is closed.
  /// @throws vmm::ipc::protocol_error `received` is not a pointer of this resource (its id,
  ///         location, granularity, grant or page layout differ), its segment was seen with
  ///         another size, or a page it names is mapped here with other memory while an
  ///         imported pointer still uses it (the exporter freed an allocation this process
  ///         had not let go of; a cached page is no reason to refuse).
  /// @throws vmm::invalid_argument the segment is larger than max_size_limit, or a handle is
  ///         not the memory the manifest says.
  /// @throws vmm::out_of_memory no address range of the segment's size is left.
  /// @throws vmm::driver_error, vmm::os_error importing or mapping failed.
  [[nodiscard]] imported_pointer import_pointer(received_pointer received, stream_ref stream);
  /// import_pointer() on the options' stream.
  /// @throws as import_pointer(received, stream).
  [[nodiscard]] imported_pointer import_pointer(received_pointer received);
  /// receive_pointer() within the options' timeout, then import_pointer(). After an
  /// exception other than one of import_pointer's own, close the socket.
  /// @throws vmm::ipc::protocol_error, vmm::ipc::timeout_error, vmm::ipc::peer_closed,
  ///         vmm::os_error as receive_pointer() (a broken message, the peer gone).
  /// @throws vmm::invalid_argument, vmm::out_of_memory, vmm::driver_error as import_pointer().
  [[nodiscard]] imported_pointer receive_pointer(int socket_fd, stream_ref stream);
  /// receive_pointer() on the options' stream. @throws as receive_pointer(socket_fd, stream).
  [[nodiscard]] imported_pointer receive_pointer(int socket_fd);

  /// Always throws: an imported resource maps memory another process allocated, and
  /// cannot allocate (as cudaMallocFromPoolAsync on an imported pool).
  /// @throws vmm::invalid_argument always, saying so.
  [[nodiscard]] void* allocate(stream_ref stream, std::size_t bytes,
                               std::size_t alignment = memory_resource::default_alignment);
  /// Always throws, as allocate().
  /// @throws vmm::invalid_argument always, saying so.
  [[nodiscard]] void* allocate_sync(std::size_t bytes,
                                    std::size_t alignment = memory_resource::default_alignment);

  [[nodiscard]] const resource_description& description() const noexcept;
  [[nodiscard]] access_mode access() const noexcept;
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept;
  /// Throws nothing but std::system_error from a broken mutex.
  [[nodiscard]] imported_resource_statistics statistics() const;

  /// Gives back every cached page (resource_import_options::keep_mapped_bytes): unmapped
  /// and released once the streams that used it have passed (vmm/retirement.hpp), as a
  /// page no pointer uses is without a cache. Pages imported pointers use stay. The cache
  /// fills again as pointers let go. Never throws.
  void trim() noexcept;

 private:
  std::shared_ptr<detail::imported_resource_state> state_;
};

}  // namespace vmm::ipc
