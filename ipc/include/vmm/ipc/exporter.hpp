#pragma once
/// @file
/// The exporting side of sharing: buffers become a manifest plus file descriptors.
///
/// Export cost and the cache. The first cuMemExportToShareableHandle of a physical handle
/// costs the driver 570-720 us; a later export of the same handle 15-19 us (GPU-FACTS.md).
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
/// Live growth. An importer that maps [0, n) of a growable buffer follows its growth with
/// export_growth(buffer, n): a manifest of the chunks past n only, at their offsets. The
/// exporter remembers which chunks it exported for each buffer, and refuses a growth
/// manifest when the chunks below n are no longer those (the buffer shrank and grew
/// again): the importer would otherwise keep mapping memory the buffer no longer uses.
///
/// The cache holds one fd per exported chunk: a buffer of thousands of chunks needs as many
/// descriptors (raise RLIMIT_NOFILE, or grow in larger chunks). All functions are
/// thread-safe.

#include <vmm/chunk_view.hpp>
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
  /// export_handle_kind() (fabric where the device and an IMEX channel allow it, else a
  /// POSIX fd).
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
  /// @throws vmm::driver_error, vmm::os_error the export itself failed.
  [[nodiscard]] exported_manifest export_buffer(const growable_buffer& buffer, export_options options = {});
  /// The chunks behind [offset, offset + length) of `buffer` (on chunk boundaries), as a
  /// whole manifest of exactly that length; base_offset says where it lies in the buffer.
  /// @throws vmm::invalid_argument as export_buffer, or the range is empty, past the
  ///         capacity or not on chunk boundaries.
  [[nodiscard]] exported_manifest export_range(const growable_buffer& buffer, std::size_t offset,
                                               std::size_t length, export_options options = {});
  /// The chunks a view maps, in its order (an alias, a re-layout, a splice).
  /// @throws vmm::invalid_argument as export_buffer, or the view is empty.
  [[nodiscard]] exported_manifest export_view(const chunk_view& view, export_options options = {});
  /// Any list of chunks of one kind of memory, back to back (a striped buffer's chunks()).
  /// @throws vmm::invalid_argument as export_buffer, or the list is empty, holds a null
  ///         chunk, or mixes kinds of memory.
  [[nodiscard]] exported_manifest export_chunks(std::span<const shared_chunk> chunks,
                                                export_options options = {});
  /// The chunks of `buffer` past `importer_end`, for an importer that maps [0, importer_end)
  /// from an earlier export_buffer() or export_growth() of this buffer by this exporter.
  /// An importer that is up to date gets a manifest with no chunks (carrying the new size).
  /// @throws vmm::invalid_argument the buffer was not exported whole by this exporter,
  ///         importer_end is not a chunk boundary, or the chunks below it changed since they
  ///         were exported (the buffer shrank: the importer must import it again).
  [[nodiscard]] exported_manifest export_growth(const growable_buffer& buffer, std::size_t importer_end,
                                                export_options options = {});

  /// Drops the entries whose chunks have died, closing their fds.
  void purge();
  [[nodiscard]] export_statistics statistics() const;

 private:
  struct cache_entry {
    unique_fd fd;                          // made on the first posix-fd export
    std::optional<fabric_handle> fabric;   // made on the first fabric export
  };
  using chunk_key = std::weak_ptr<const pooled_chunk>;
  // The chunks last exported for a buffer, in address order from offset 0.
  struct exported_layout {
    std::vector<chunk_key> chunks;
  };

  exported_manifest export_list(std::span<const shared_chunk> chunks, manifest description,
                                const export_options& options);
  void purge_locked();

  mutable std::mutex mutex_;
  std::map<chunk_key, cache_entry, std::owner_less<>> cache_;
  std::map<std::uint64_t, exported_layout> layouts_;  // by buffer_id
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
