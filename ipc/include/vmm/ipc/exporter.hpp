#pragma once
/// @file
/// The exporting side of sharing: buffers become a manifest plus file descriptors.
///
///     vmm::ipc::exporter exporter;
///     vmm::ipc::exported_manifest sent = exporter.export_buffer(buffer);
///     vmm::ipc::send_manifest(socket, sent);                 // the importer maps it
///     buffer.resize(2 * buffer.size());
///     sent = exporter.export_growth(buffer, sent.description);
///     vmm::ipc::send_manifest(socket, sent);                 // only the new chunks travel
///
/// Export cost and the cache. The driver's first cuMemExportToShareableHandle of a physical
/// handle costs many times a later export of the same handle (docs/GPU-FACTS.md, "Per-call
/// costs").
/// An exporter therefore exports each chunk once and keeps the resulting fd (or fabric
/// handle); every later manifest that names the chunk gets a dup of the cached fd (about a
/// microsecond), so sharing a buffer again, with the same or another importer, costs no
/// driver call at all.
///
/// Entries follow the chunks' lives, not the exporter's: a buffer's chunks are shared_chunk
/// (shared_ptr), and the cache holds only a weak_ptr to each. An entry whose chunk has died
/// (the buffer shrank or was destroyed) is dropped, and its fd closed, at the next export
/// through the exporter or at purge(); a cached fd never keeps memory alive beyond that.
/// A chunk given back to a pool and lent again is a new chunk: it is exported afresh.
///
/// Live growth. Each export_buffer() starts an export generation, named by the manifest's
/// buffer_id. An importer follows the buffer's growth with export_growth(buffer, last),
/// `last` being the last manifest sent to that importer: a manifest of the chunks past
/// last.end only, at their offsets, in the same generation. The exporter keeps, per
/// generation, every chunk it ever exported in it, at its offset, and refuses a growth
/// manifest when the buffer no longer maps one of them there (it shrank and grew again):
/// an importer of that generation may map the old chunk, and would show bytes the buffer
/// no longer holds. Importers of different generations are checked apart, so one importer
/// being up to date never lets another map stale memory.
///
/// The cache holds one fd per exported chunk: a buffer of thousands of chunks needs as many
/// descriptors (raise RLIMIT_NOFILE, or grow in larger chunks). All functions are
/// thread-safe.

#include <vmm/chunk_view.hpp>
#include <vmm/ipc/fabric.hpp>
#include <vmm/growable_buffer.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/manifest.hpp>
#include <vmm/unique_fd.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

namespace vmm::ipc {

/// A manifest ready to send: its description, its wire bytes, and one owned fd per
/// posix-fd chunk, in chunk order.
struct exported_manifest {
  manifest description;
  std::vector<std::byte> bytes;
  std::vector<unique_fd> fds;
};

/// How to export.
struct export_options {
  /// The most access an importer may map (read_only: importers map it read-only).
  /// vmm's importer enforces it; see imported_buffer for what a POSIX fd can and cannot
  /// enforce.
  access_mode grant = access_mode::read_write;
  /// The handle kind for every chunk; nullopt: each chunk's provider's
  /// capabilities().export_kind (fabric where the device and an IMEX channel allow it, else
  /// a POSIX fd).
  std::optional<handle_kind> handle;
};

/// What an exporter has done (lifetime counters, except cached_chunks).
struct export_statistics {
  std::size_t handles_exported = 0;  ///< provider exports made: the costly first exports
  std::size_t cache_hits = 0;        ///< chunks served from the cache without a driver call
  std::size_t entries_dropped = 0;   ///< entries dropped because their chunk died
  std::size_t cached_chunks = 0;     ///< entries held now (one open fd each for posix fds)
};

/// Exports buffers as manifests, exporting each physical chunk once. See the file comment.
class exporter {
 public:
  /// An exporter with nothing cached. Throws nothing but std::bad_alloc.
  exporter();
  exporter(const exporter&) = delete;
  exporter& operator=(const exporter&) = delete;
  /// Closes every cached fd. Importers keep what they imported.
  ~exporter();

  /// Every chunk `buffer` maps now, [0, capacity()), as a whole manifest whose max_size is
  /// the buffer's: an importer can follow later growth with export_growth(). A buffer with
  /// nothing mapped gives a manifest with no chunks.
  /// @throws vmm::invalid_argument a chunk's memory cannot be exported (pinned host memory),
  ///         or the requested handle kind is not available (the message says why).
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error the export itself failed
  ///         (ENOMEM and CUDA_ERROR_OUT_OF_MEMORY are vmm::out_of_memory).
  [[nodiscard]] exported_manifest export_buffer(const growable_buffer& buffer, export_options options = {});
  /// The chunks behind [offset, offset + length) of `buffer` (on chunk boundaries), as a
  /// whole manifest of exactly that length; base_offset says where it lies in the buffer.
  /// @throws vmm::invalid_argument as export_buffer, or the range is empty, past the
  ///         capacity or not on chunk boundaries.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error as export_buffer.
  [[nodiscard]] exported_manifest export_range(const growable_buffer& buffer, std::size_t offset,
                                               std::size_t length, export_options options = {});
  /// The chunks a view maps, in its order (an alias, a re-layout, a splice).
  /// @throws vmm::invalid_argument as export_buffer, or the view is empty.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error as export_buffer.
  [[nodiscard]] exported_manifest export_view(const chunk_view& view, export_options options = {});
  /// Any list of chunks of one kind of memory, back to back (a striped buffer's chunks()).
  /// @throws vmm::invalid_argument as export_buffer, or the list is empty, holds a null
  ///         chunk, or mixes kinds of memory.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error as export_buffer.
  [[nodiscard]] exported_manifest export_chunks(std::span<const shared_chunk> chunks,
                                                export_options options = {});
  /// The chunks of `buffer` past last.end, for an importer whose last manifest from this
  /// exporter was `last` (the whole manifest of export_buffer() or a growth manifest since):
  /// a growth manifest of the same generation. An importer that is up to date gets a
  /// manifest with no chunks (carrying the new size).
  /// @throws vmm::invalid_argument `last` is not of a generation this exporter started for
  ///         this buffer, last.end is not a chunk boundary or lies past the capacity, or the
  ///         buffer no longer maps a chunk the generation exported (it shrank and grew
  ///         again: the importer must import it again).
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error exporting a new chunk
  ///         failed, as in export_buffer.
  [[nodiscard]] exported_manifest export_growth(const growable_buffer& buffer, const manifest& last,
                                                export_options options = {});

  /// Drops the entries whose chunks have died, closing their fds, and the generations
  /// whose chunks have all died. Throws nothing but std::system_error from a broken mutex.
  void purge();
  /// What is cached. As purge().
  [[nodiscard]] export_statistics statistics() const;

 private:
  struct cache_entry {
    unique_fd fd;                         // made on the first posix-fd export
    std::optional<fabric_handle> fabric;  // made on the first fabric export
  };
  using chunk_key = std::weak_ptr<const pooled_chunk>;
  // One export generation: every chunk exported in it, in address order from offset 0.
  // Appended to by growth, never rewritten.
  struct generation {
    const void* buffer;  // the buffer's data(): its identity while it lives
    std::vector<chunk_key> chunks;
  };

  exported_manifest export_list(std::span<const shared_chunk> chunks, manifest description,
                                const export_options& options);
  void purge_locked();

  mutable std::mutex mutex_;
  std::map<chunk_key, cache_entry, std::owner_less<>> cache_;
  std::map<std::uint64_t, generation> generations_;  // by buffer_id
  export_statistics statistics_;
};

/// Sends a manifest and its fds over a connected Unix stream socket: the manifest and the
/// first max_fds_per_message fds in one message, the rest in continuation messages.
/// @param timeout how long the whole manifest, every continuation message included, may
///        wait for the peer to read (no_timeout: without end).
/// @throws vmm::invalid_argument `exported` holds another number of fds than its manifest
///         names; nothing was sent.
/// @throws vmm::ipc::timeout_error, vmm::os_error as vmm::ipc::send_message.
void send_manifest(int socket_fd, const exported_manifest& exported,
                   std::chrono::milliseconds timeout = default_timeout);

}  // namespace vmm::ipc
