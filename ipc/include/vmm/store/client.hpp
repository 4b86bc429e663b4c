#pragma once
/// @file
/// The client of a vmm-store daemon: named buffers shared between processes.
///
///     vmm::store::client store;                          // the default socket
///     vmm::store::buffer out = store.create("frames", 64 << 20, vmm::location::device(0));
///     fill<<<grid, block, 0, s>>>(static_cast<float*>(out.data()), n);   // writable
///     store.seal("frames");                              // nobody writes any more
///     // in another process:
///     vmm::store::buffer in = store.get("frames");       // read-only, enforced by the mapping
///
/// A vmm::store::buffer is a hold on a named buffer, mapped in this process at an address
/// that never changes. Holding it keeps the daemon's buffer alive (remove() frees only the
/// name); dropping the last handle releases the hold. Read-only handles map the memory with
/// PROT_READ (OS provider) or CU_MEM_ACCESS_FLAGS_PROT_READ (GPUs): a write faults.
///
/// Growth. grow(name, size) grows the daemon's buffer in place; every holder sees it by
/// calling refresh() on its handle (or by get() again), which maps the new chunks after
/// the ones it maps, at the same address: nothing is copied and nothing already mapped
/// moves (vmm::ipc's export generations, importer.hpp).
///
/// Repeated gets are cheap. The client keeps each import it made (per name and access),
/// also after its handles are gone (up to client_options::cached_imports unheld ones). When
/// the daemon's version table (docs/store.md) shows that buffer unchanged since the daemon
/// last answered, a later get() is local: it sends a hold with no reply and returns at once.
/// Otherwise it tells the daemon which buffer, generation and extent it maps already; the
/// daemon takes a hold and answers "current" (no descriptors travel, nothing is mapped), or
/// sends only the growth since. A cached import that the daemon no longer names, or names
/// for another buffer, is dropped.
///
/// Errors. The daemon's refusals are vmm::store::store_error with the daemon's status and
/// message (a cap refusal names the cap). A daemon that went away is store_error with
/// status daemon_gone; mappings made before stay readable. A reply or manifest that breaks
/// the protocol is vmm::ipc::protocol_error (vmm::ipc::bad_manifest is one), and the client
/// is unusable after it. A bad argument of this process (a name that is empty, longer than
/// max_name_bytes, not UTF-8 or with a control character; a get with access none; a
/// negative location id) is vmm::invalid_argument, thrown before anything is sent: the
/// client stays usable, nothing changed. Mapping what the daemon sent may fail here as
/// vmm::ipc::importer says (vmm::out_of_memory: no address range; vmm::invalid_argument:
/// memory this process cannot map, such as a GPU it lacks; vmm::driver_error,
/// vmm::driver_unavailable); the client is unusable after those too.
///
/// Thread safety: one client may be used from several threads (one request at a time);
/// handles may be destroyed on any thread.

#include <vmm/ipc/importer.hpp>
#include <vmm/location.hpp>
#include <vmm/store/protocol.hpp>
#include <vmm/store/tensors.hpp>
#include <vmm/stream_ref.hpp>

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace vmm::store {

/// A refusal of the daemon, or the daemon gone.
class store_error : public std::runtime_error {
 public:
  /// No reply: the daemon closed the connection or could not be reached.
  static constexpr int daemon_gone = -1;
  store_error(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  /// A vmm::store::status as an int, or daemon_gone.
  [[nodiscard]] int code() const noexcept { return code_; }
  [[nodiscard]] bool is(status s) const noexcept { return code_ == static_cast<int>(s); }

 private:
  int code_;
};

/// The socket a daemon listens at by default: $XDG_RUNTIME_DIR/vmm-store/socket, or
/// /tmp/vmm-store-<uid>/socket without XDG_RUNTIME_DIR.
[[nodiscard]] std::string default_socket_path();
/// Creates the default socket's directory with mode 0700 if missing.
/// @throws vmm::invalid_argument it exists, but is not a directory of this uid with mode 0700.
/// @throws vmm::os_error mkdir failed.
void prepare_socket_directory(const std::string& socket_path);

/// How a client connects.
struct client_options {
  std::string socket_path = default_socket_path();
  /// Imports kept after their last handle went (the cache of repeated gets).
  std::size_t cached_imports = 16;
  /// How long a reply may take.
  std::chrono::milliseconds timeout = std::chrono::milliseconds(30'000);
  /// Reconnect without being asked after the daemon went away: a thread of this client sees
  /// its connection hang up, waits for a daemon at the socket path (inotify on the socket's
  /// directory: no polling), and calls reconnect(), again at each new socket until one
  /// succeeds. The thread ends with the client.
  bool reoffer_after_restart = false;
  /// Called on that thread after each automatic reconnect, with what reconnect() returned
  /// (the offers refused). Must not throw.
  std::function<void(const std::vector<std::string>&)> on_reconnect;
  /// Keep a descriptor of every chunk this client maps read-only through the cache, so that
  /// reconnect() can offer the memory to a restarted daemon: the CUDA driver refuses to
  /// export a handle the process imported, and the kept descriptor is exported instead.
  /// Costs one open descriptor per such chunk while it is mapped (docs/store.md,
  /// "Lifetimes"). false: none kept; after a restart, GPU memory cannot be offered
  /// (reconnect() names each such buffer).
  bool keep_descriptors = true;
};

/// How to create.
struct create_options {
  /// The most the buffer may grow to (address space every holder reserves), a multiple of
  /// the granularity; 0: half the location's physical memory size, or the daemon's cap or
  /// per-client cap where lower (and at least the size).
  std::size_t max_size = 0;
  /// Map the size as one physical chunk, so that a first get imports one handle, and each
  /// later grow's growth (to the granularity) as exactly one more chunk: chunks that end at
  /// sizes the creator chose (a tensor set laid out per tensor).
  bool one_chunk = false;
};

/// How to seal.
struct seal_options {
  /// De-duplicate (docs/store.md, "De-duplication"): the daemon reads every byte of the
  /// buffer once, and each physical chunk whose bytes equal a chunk of another de-duplicated
  /// buffer at the same location is shared with it (stored and counted once). Handles made
  /// before the seal keep mapping the buffer's former memory: get it again to share.
  bool deduplicate = false;
};

/// How to get.
struct get_options {
  /// Map the buffer at addresses that no other handle of this process shares: the cached
  /// import when no handle holds it, a whole new import otherwise (not cached). What
  /// buffer::make_private needs.
  bool own_mapping = false;
};

namespace detail {
struct client_state;
struct cached_import;
class restart_watcher;
}  // namespace detail

/// A hold on a named buffer, mapped here. Move-only. See the file comment.
class buffer {
 public:
  buffer() noexcept;
  buffer(buffer&&) noexcept;
  buffer& operator=(buffer&&) noexcept;
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  /// Releases the hold (never throws; a daemon gone is nothing to release).
  ~buffer();

  /// The first byte; never changes (nullptr when empty or moved from).
  [[nodiscard]] void* data() const noexcept;
  /// Bytes in use as of the last get() or refresh().
  [[nodiscard]] std::size_t size() const noexcept;
  /// Bytes mapped here.
  [[nodiscard]] std::size_t capacity() const noexcept;
  [[nodiscard]] std::size_t max_size() const noexcept;
  [[nodiscard]] access_mode access() const noexcept;
  [[nodiscard]] const std::string& name() const noexcept;
  [[nodiscard]] location where() const noexcept;
  /// The daemon's id of the buffer (a new one per create).
  [[nodiscard]] std::uint64_t entry() const noexcept;
  /// The physical chunks mapped here (0 for an empty handle): what a first get imported.
  [[nodiscard]] std::size_t chunk_count() const noexcept;
  /// The size of each physical chunk mapped here, in address order: where the chunk
  /// boundaries lie (a tensor set laid out per tensor has one at each large tensor's ends).
  /// @throws std::bad_alloc no memory for the list.
  [[nodiscard]] std::vector<std::size_t> chunk_sizes() const;
  /// The provider the memory is mapped through (for copies: provider()->executor()).
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept;
  /// Maps what the buffer grew by since this client last looked; the address stays.
  /// @throws vmm::invalid_argument the handle is empty (default-made, moved from, released).
  /// @throws store_error the daemon refused or is gone.
  /// @throws vmm::ipc::protocol_error, vmm::out_of_memory, vmm::invalid_argument,
  ///         vmm::driver_error as get() (mapping the growth).
  void refresh();
  /// Makes the chunks that [offset, offset + bytes) touches private to this handle: fresh
  /// memory at the buffer's location, holding a copy of their bytes, mapped read-write at
  /// the same addresses (docs/store.md, "Private overlays"). The daemon's memory and every
  /// other process's mapping stay as they were; so does every address. The import leaves
  /// the client's cache: a later get() in this process maps the shared memory again,
  /// read-only, and the private memory is freed with this handle. Returns the bytes of
  /// fresh memory mapped (0: all of it was private already, or bytes is 0).
  /// Work in flight: nothing may use the chunks replaced on any stream but `stream` (which
  /// is synchronized): their shared mappings go at once.
  /// Strong guarantee: on failure the mapping is as it was (shared, read-only), and the
  /// handle stays in the cache.
  /// @throws vmm::invalid_argument the handle is empty, writable (the hold of a creator or
  ///         a granted writer), the range passes capacity(), or another handle of this
  ///         process maps the same addresses (a repeated get: get with
  ///         get_options::own_mapping); nothing changed.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error as
  ///         vmm::ipc::imported_buffer::make_private (fresh memory, mapping, copying).
  std::size_t make_private(std::size_t offset, std::size_t bytes, stream_ref stream = {});
  /// make_private() of every span at once: all of them private, or (on failure) none.
  /// @throws as make_private() above.
  std::size_t make_private(std::span<const ipc::byte_span> spans, stream_ref stream = {});
  /// Whether [offset, offset + bytes) is private here, and so writable (true for 0 bytes).
  /// @throws vmm::invalid_argument the handle is empty, or the range passes capacity().
  [[nodiscard]] bool is_private(std::size_t offset, std::size_t bytes) const;
  /// Bytes of this handle's mapping that are private (0 for an empty handle).
  [[nodiscard]] std::size_t private_bytes() const noexcept;
  /// Releases the hold now; the handle is empty afterwards.
  void release() noexcept;

 private:
  friend class client;
  std::shared_ptr<detail::client_state> state_;
  std::shared_ptr<detail::cached_import> import_;
};

/// A connection to a vmm-store daemon. See the file comment.
class client {
 public:
  /// Connects and says hello (and starts the reconnecting thread of
  /// client_options::reoffer_after_restart).
  /// @throws std::system_error the thread could not start.
  /// @throws vmm::invalid_argument the socket path is empty, too long or holds a NUL byte.
  /// @throws store_error nothing listens at the path (daemon_gone), or the daemon refuses
  ///         this uid (status denied) or this protocol version.
  /// @throws vmm::ipc::protocol_error the daemon's reply is malformed.
  /// @throws vmm::os_error mapping the daemon's version table, or the thread's pipe or
  ///         inotify descriptor, failed.
  explicit client(client_options options = {});
  ~client();
  client(client&&) noexcept;
  client& operator=(client&&) noexcept;

  /// Who the daemon is (a new instance id whenever it restarted).
  [[nodiscard]] const daemon_info& daemon() const noexcept;

  /// Connects to the socket again and says hello; for a daemon that restarted (a new
  /// instance), offers it every sealed buffer this client maps read-only or caches (a
  /// tensor set with its table: the daemon checks it), and takes a hold again for each of
  /// their live handles. Handles and imports keep their addresses. Offers the daemon
  /// refuses (the name is another buffer's already, a cap), and memory this process cannot
  /// export again (a chunk's descriptor cannot be duplicated, or, with
  /// client_options::keep_descriptors false, a GPU's driver refuses to export a handle the
  /// process imported), are left out and returned as "name: why"; those buffers, and every
  /// unsealed or writable one, stay mapped in their handles but are no entry of the daemon
  /// any more (their release sends nothing, and a
  /// get asks the daemon). Against the same instance it only takes this client's holds
  /// again.
  /// @throws store_error daemon_gone (nothing listens, or the daemon went away during the
  ///         offers), denied (this uid), unsupported_version.
  /// @throws vmm::ipc::protocol_error a reply is malformed.
  /// @throws vmm::os_error mapping the version table failed.
  /// @throws vmm::invalid_argument the socket path is unusable.
  std::vector<std::string> reconnect();

  /// Creates `name` with `size` bytes at `where`; a writable handle. The creation is
  /// uncommitted until seal(): if this client's connection closes first, the name goes.
  /// @throws vmm::invalid_argument a bad name or a negative location id (file comment);
  ///         nothing was sent.
  /// @throws store_error exists, cap_exceeded (naming the cap), unavailable (no such
  ///         memory at the daemon), invalid, out_of_memory; daemon_gone.
  /// @throws vmm::ipc::protocol_error, vmm::out_of_memory, vmm::invalid_argument,
  ///         vmm::driver_error mapping what the daemon sent (file comment).
  [[nodiscard]] buffer create(std::string_view name, std::size_t size, location where,
                              create_options options = {});
  /// No writer any more: writable gets and growth are refused from now on; the buffer
  /// stays until remove(), whoever holds it. `options`: de-duplication (seal_options).
  /// @throws vmm::invalid_argument a bad name; nothing was sent.
  /// @throws store_error not_found, denied, out_of_memory (de-duplicating: nothing changed);
  ///         daemon_gone.
  /// @throws vmm::ipc::protocol_error the reply is malformed.
  void seal(std::string_view name, seal_options options = {});
  /// A hold on `name`, mapped with `access`. Read-write only while unsealed and only for
  /// the creator's process or a pid it granted.
  /// @throws vmm::invalid_argument a bad name, or `access` is none; nothing was sent.
  /// @throws store_error not_found, sealed, denied; daemon_gone.
  /// @throws vmm::ipc::protocol_error the daemon sent something malformed.
  /// @throws vmm::out_of_memory, vmm::invalid_argument, vmm::driver_error mapping what the
  ///         daemon sent (file comment).
  [[nodiscard]] buffer get(std::string_view name, access_mode access = access_mode::read_only,
                           get_options options = {});
  /// Grows `name` to `size` bytes (creator or granted writers, unsealed). Holders see it
  /// after refresh().
  /// @throws vmm::invalid_argument a bad name; nothing was sent.
  /// @throws store_error not_found, sealed, denied, cap_exceeded, invalid, out_of_memory;
  ///         daemon_gone.
  /// @throws vmm::ipc::protocol_error the reply is malformed.
  buffer_info grow(std::string_view name, std::size_t size);
  /// seal() of a tensor set: the daemon copies the table (tensors.hpp) this process wrote at
  /// [table_offset, table_offset + table_bytes) of `name`, checks it against the bytes
  /// before table_offset, keeps it and seals, de-duplicating as `options` say.
  /// vmm::store::tensor_set_builder calls this.
  /// @throws vmm::invalid_argument a bad name; nothing was sent.
  /// @throws store_error not_found, sealed, denied, invalid (the table breaks a rule: the
  ///         message names it; nothing changed), out_of_memory (as seal); daemon_gone.
  /// @throws vmm::ipc::protocol_error the reply is malformed.
  void seal_set(std::string_view name, std::uint64_t table_offset, std::uint64_t table_bytes,
                seal_options options = {});
  /// The table of the tensor set that `held` maps, checked against its size.
  /// @throws vmm::invalid_argument `held` is empty.
  /// @throws store_error invalid (a plain buffer), not_found; daemon_gone.
  /// @throws vmm::ipc::protocol_error the reply or the table is malformed.
  [[nodiscard]] std::vector<tensor_info> tensors(const buffer& held);
  /// Lets process `pid` get `name` writable while it is unsealed (creator only).
  /// @throws vmm::invalid_argument a bad name; nothing was sent.
  /// @throws store_error not_found, sealed, denied; daemon_gone.
  /// @throws vmm::ipc::protocol_error the reply is malformed.
  void grant(std::string_view name, pid_t pid);
  /// Every buffer the daemon names.
  /// @throws store_error daemon_gone. @throws vmm::ipc::protocol_error the reply is malformed.
  [[nodiscard]] std::vector<buffer_info> list();
  /// @throws vmm::invalid_argument a bad name; nothing was sent.
  /// @throws store_error not_found; daemon_gone.
  /// @throws vmm::ipc::protocol_error the reply is malformed.
  [[nodiscard]] buffer_info stat(std::string_view name);
  /// Frees the name at once; the memory goes when the last holder lets go.
  /// @throws vmm::invalid_argument a bad name; nothing was sent.
  /// @throws store_error not_found, denied; daemon_gone.
  /// @throws vmm::ipc::protocol_error the reply is malformed.
  void remove(std::string_view name);
  /// The daemon's counters (a debug request: leak checks compare them).
  /// @throws store_error daemon_gone. @throws vmm::ipc::protocol_error the reply is malformed.
  [[nodiscard]] daemon_statistics statistics();
  /// Drops the cached imports no handle holds.
  void drop_cache();

 private:
  std::shared_ptr<detail::client_state> state_;
  std::unique_ptr<detail::restart_watcher> watcher_;  // reoffer_after_restart; goes first
};

}  // namespace vmm::store
