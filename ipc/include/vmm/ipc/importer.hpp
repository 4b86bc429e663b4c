#pragma once
/// @file
/// The importing side of sharing: a manifest and its fds become a mapped address range.
///
///     vmm::ipc::imported_buffer shared = vmm::ipc::imported_buffer::receive(socket,
///                                            {.access = vmm::access_mode::read_only});
///     reader<<<grid, block, 0, stream.get()>>>(shared.data(), shared.size());
///     shared.receive_growth(socket);   // the exporter grew: same address, more chunks
///
/// An imported_buffer reserves the exporter's max_size at a new address, imports every
/// chunk's handle and maps each chunk at its manifest offset, so that byte i of the import
/// is byte base_offset + i of the exporter's buffer. Growth manifests map the new tail at
/// the same offsets: the address and the part mapped already are never touched.
///
/// Nothing from a socket is trusted. receive() parses the manifest strictly
/// (parse_manifest), checks it against this process (providers for its locations, the
/// granularity, the requested access against the grant; for growth: the buffer id, the
/// layout and where it starts), checks every message's fd count, and imports every handle
/// before it maps anything. Any failure throws with nothing mapped, nothing reserved, and
/// every received fd closed (each fd is owned from the moment it arrives, and is closed as
/// soon as its handle is imported: an import of thousands of chunks holds at most
/// max_fds_per_message received fds at a time; with import_options::keep_descriptors each
/// chunk keeps its fd instead).
///
/// Exporting again. A process that must hand imported memory on (vmm-store: a client
/// offering it back to a restarted daemon, the daemon serving what it was offered) imports
/// with import_options::keep_descriptors: each posix-fd chunk's allocation keeps the fd it
/// came from, and its export_fd() duplicates it, since the CUDA driver refuses to export a
/// handle the process imported (vmm/physical_allocation.hpp). The cost is one open
/// descriptor per posix-fd chunk for as long as the chunk is mapped (on OS host memory, where
/// the imported handle is a descriptor too, two). A process at its RLIMIT_NOFILE fails the
/// import with vmm::os_error EMFILE, whichever call ran out (the kernel truncating a
/// message's descriptors, or a duplicate), and nothing stays imported.
///
/// Read-only. A manifest's grant is the most access an importer may map; imported_buffer
/// refuses to map more, and a read-only mapping faults on writes (PROT_READ on the host,
/// CU_MEM_ACCESS_FLAGS_PROT_READ on the GPU). A POSIX fd from the CUDA driver carries no
/// access right of its own, though: a process that bypasses vmm could map the memory
/// read-write. The grant protects a cooperating consumer from its own bugs, not the
/// exporter from a hostile process; give hostile processes nothing.
///
/// Lifetimes. Imported memory lives while this process maps it, whatever the exporter does
/// (it may destroy its buffer or exit). Destroying an imported_buffer does not block: it is
/// retired after its stream (vmm/retirement.hpp), then unmapped, its imported handles
/// destroyed and its range freed; if the importing process dies instead, the OS and the
/// driver release the same, and the exporter holds nothing for it.
///
/// Private overlays. make_private() replaces chunks of the import, in this process only, by
/// fresh memory holding a copy of their bytes, mapped read-write at the same addresses: the
/// exporter's memory and every other process's mapping are untouched, and no address
/// changes. The driver maps a physical handle only whole and unmaps only whole mappings, so
/// the unit replaced is one chunk: every chunk that a range touches. A replaced chunk stays
/// private (a later make_private over it maps nothing) until the import is destroyed, which
/// frees the fresh memory with the rest.
///
/// Address space. A manifest says how many bytes to reserve (max_size); a peer could ask
/// for more than this process can spare. import_options::max_size_limit bounds it (by
/// default, the physical memory size of the manifest's location).

#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/manifest.hpp>
#include <vmm/mapped_range.hpp>
#include <vmm/stream_ref.hpp>
#include <vmm/unique_fd.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace vmm::ipc {

/// A manifest received with its fds, validated, nothing imported yet.
struct received_manifest {
  manifest description;
  std::vector<unique_fd> fds;  ///< one per posix-fd chunk, in chunk order
};

/// Receives a manifest sent by send_manifest (the manifest message and its continuation
/// messages), parses it and checks every message's fd count. Whatever it throws, every fd
/// received is closed.
/// @param timeout how long to wait for the whole manifest, every continuation message
///        included (no_timeout: without end).
/// @throws vmm::ipc::bad_manifest the bytes are not a valid manifest, a message carries
///         another number of fds than the manifest calls for, or a continuation message is
///         malformed or out of order.
/// @throws vmm::ipc::timeout_error the manifest was not complete within `timeout`.
/// @throws vmm::ipc::protocol_error, vmm::ipc::peer_closed, vmm::os_error as receive_message
///         (a broken frame, the peer gone, a failed recvmsg).
[[nodiscard]] received_manifest receive_manifest(int socket_fd,
                                                 std::chrono::milliseconds timeout = default_timeout);

/// How to import.
struct import_options {
  /// The access to map with: at most the manifest's grant.
  access_mode access = access_mode::read_write;
  /// The provider for every chunk; null: provider_for() of each chunk's location. Its
  /// location and granularity must match the manifest's.
  std::shared_ptr<memory_provider> provider;
  /// Where work using the import is queued: destruction is ordered after it (the legacy
  /// default stream when not given).
  stream_ref stream;
  /// The largest max_size a manifest may make this process reserve; 0: the physical memory
  /// size of the manifest's location (provider_capabilities::physical_memory_size) rounded
  /// up to its granularity, what a growable_buffer there reserves by default.
  std::size_t max_size_limit = 0;
  /// How long imported_buffer::receive() waits for the whole manifest, every continuation
  /// message included; the handles it imports between them count against it too.
  /// no_timeout waits without end.
  std::chrono::milliseconds timeout = default_timeout;
  /// Keep each posix-fd chunk's descriptor in its allocation, growth included, so that the
  /// chunks can be exported again (see "Exporting again" in the file comment): one open
  /// descriptor per chunk while it is mapped. false: each is closed once imported.
  bool keep_descriptors = false;
};

/// Bytes [offset, offset + length) of an import.
struct byte_span {
  std::size_t offset = 0;
  std::size_t length = 0;
};

/// Another process's buffer, mapped here with its layout. See the file comment. Move-only.
class imported_buffer {
 public:
  /// Nothing imported.
  imported_buffer() noexcept;
  /// Imports a whole manifest with its fds (one per posix-fd chunk, in order), which it
  /// closes as it goes (or keeps: import_options::keep_descriptors).
  /// @throws vmm::ipc::bad_manifest the manifest is a growth manifest.
  /// @throws vmm::invalid_argument the fd count differs from the manifest's, the access
  ///         asked exceeds the grant, a location has no provider here, the granularity
  ///         differs, or a handle is not the memory the manifest says (wrong size, not
  ///         memory at all).
  /// @throws vmm::invalid_argument the manifest's max_size passes max_size_limit.
  /// @throws vmm::out_of_memory no address range of max_size is left.
  /// @throws vmm::driver_error, vmm::os_error importing or mapping failed.
  /// Whatever the failure, nothing stays mapped or reserved.
  imported_buffer(const manifest& description, std::vector<unique_fd> fds, import_options options = {});
  /// Receives a manifest from send_manifest on `socket_fd` and imports it, holding at most
  /// one message's fds at a time, within options.timeout. Same errors as above and as
  /// receive_manifest() (vmm::ipc::timeout_error included). After an exception the socket
  /// may be in the middle of a manifest: close it.
  /// @throws vmm::ipc::bad_manifest, vmm::ipc::protocol_error, vmm::ipc::timeout_error,
  ///         vmm::ipc::peer_closed, vmm::os_error as receive_manifest().
  /// @throws vmm::invalid_argument, vmm::out_of_memory, vmm::driver_error, vmm::os_error
  ///         as the constructor above.
  [[nodiscard]] static imported_buffer receive(int socket_fd, import_options options = {});

  imported_buffer(imported_buffer&& other) noexcept;
  imported_buffer& operator=(imported_buffer&& other) noexcept;
  imported_buffer(const imported_buffer&) = delete;
  imported_buffer& operator=(const imported_buffer&) = delete;
  /// Retires the import after its stream (never blocks): unmapped, the imported handles
  /// destroyed and the range freed once the stream has passed.
  ~imported_buffer();

  /// Maps the chunks of a growth manifest after what is mapped, with its fds (kept as the
  /// import's options say).
  /// Strong guarantee: on failure the import is exactly as it was, the fds closed.
  /// @throws vmm::ipc::bad_manifest not a growth manifest of this buffer (buffer id,
  ///         location, granularity, max size or base offset differ), or it does not start
  ///         where this import ends.
  /// @throws vmm::invalid_argument as the constructor.
  void grow(const manifest& tail, std::vector<unique_fd> fds);
  /// Receives a growth manifest from `socket_fd` and maps it, as grow(), waiting at most
  /// `timeout` for the whole manifest (see import_options::timeout). Same errors as grow()
  /// and as receive_manifest(). After an exception the socket may be in the middle of a
  /// manifest: close it.
  void receive_growth(int socket_fd, std::chrono::milliseconds timeout = default_timeout);

  /// Makes every chunk that one of `spans` touches private (see the file comment), all of
  /// them or none: for each one not private yet, fresh memory of its size is created through
  /// its provider, mapped at a temporary address, filled with a copy of the chunk on
  /// `stream` (then synchronized), and mapped read-write in the chunk's place; the
  /// exporter's chunk is let go here. Returns the bytes of fresh memory mapped (0 when all
  /// of it was private already, or the spans are empty).
  /// Work in flight: the caller must have no work queued on the chunks replaced (on any
  /// stream but `stream`, which is synchronized first): their old mappings go at once.
  /// Strong guarantee: on failure every chunk is mapped as it was, shared and with its
  /// access; the fresh memory is freed.
  /// @throws vmm::invalid_argument the import is empty, or a span passes capacity()
  ///         (nothing changed).
  /// @throws vmm::out_of_memory no fresh memory or no temporary addresses are left.
  /// @throws vmm::driver_error, vmm::os_error creating, mapping, copying or unmapping failed.
  std::size_t make_private(std::span<const byte_span> spans, stream_ref stream = {});
  /// Whether every chunk that [offset, offset + length) touches is private (true when
  /// length is 0): those bytes are writable here.
  /// @throws vmm::invalid_argument the range passes capacity().
  [[nodiscard]] bool is_private(std::size_t offset, std::size_t length) const;
  /// Bytes of the import that are private.
  [[nodiscard]] std::size_t private_bytes() const noexcept;

  /// The first byte (nullptr when empty); never changes, growth included.
  [[nodiscard]] void* data() const noexcept { return run_.data(); }
  /// Bytes in use at the exporter when it sent the latest manifest (<= capacity()).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Bytes mapped.
  [[nodiscard]] std::size_t capacity() const noexcept { return run_.mapped(); }
  /// The address range reserved: the exporter's max size.
  [[nodiscard]] std::size_t max_size() const noexcept { return run_.size(); }
  /// Chunks mapped.
  [[nodiscard]] std::size_t chunk_count() const noexcept { return run_.chunks().size(); }
  /// The chunks mapped, in address order (their sizes give the chunk boundaries).
  [[nodiscard]] const std::vector<shared_chunk>& chunks() const noexcept { return run_.chunks(); }
  /// The access the mappings grant.
  [[nodiscard]] access_mode access() const noexcept { return access_; }
  /// Whether each posix-fd chunk keeps its descriptor (import_options::keep_descriptors).
  [[nodiscard]] bool keeps_descriptors() const noexcept { return keep_descriptors_; }
  /// The exporter's name for the buffer.
  [[nodiscard]] std::uint64_t buffer_id() const noexcept { return buffer_id_; }
  /// Where this import starts in the exporter's buffer.
  [[nodiscard]] std::uint64_t base_offset() const noexcept { return base_offset_; }
  /// The provider the range was allocated through (null when empty).
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept { return run_.provider(); }
  [[nodiscard]] stream_ref stream() const noexcept { return stream_; }
  /// Orders destruction after work on `stream` instead.
  void set_stream(stream_ref stream) noexcept { stream_ = stream; }

 private:
  struct fd_source;
  struct unmapped {};
  // Checks a whole manifest and the options; maps nothing yet.
  imported_buffer(unmapped, const manifest& description, import_options options);
  // Throws unless `tail` is a growth manifest of this import that starts where it ends.
  void check_growth(const manifest& tail) const;
  // Imports every handle of `description`, then maps them at their offsets and sets access
  // over the new part; appends them, and takes the manifest's size, only once all of that
  // succeeded.
  void map_chunks(const manifest& description, fd_source& fds);
  [[nodiscard]] std::shared_ptr<memory_provider> provider_of(const location& where) const;

  // Calls fn(index, offset) for each chunk that [offset, offset + length) touches.
  template <class Fn>
  void for_chunks_touching(std::size_t offset, std::size_t length, Fn&& fn) const;

  std::shared_ptr<memory_provider> chosen_provider_;  // import_options::provider
  mapped_range run_;
  location where_;
  std::uint64_t buffer_id_ = 0;
  std::uint64_t granularity_ = 0;
  std::uint64_t base_offset_ = 0;
  std::size_t max_size_limit_ = 0;
  std::size_t size_ = 0;
  access_mode access_ = access_mode::none;
  bool keep_descriptors_ = false;
  stream_ref stream_;
  std::vector<bool> private_chunks_;  // by chunk index; past its end: shared
};

}  // namespace vmm::ipc
