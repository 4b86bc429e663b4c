#pragma once
/// @file
/// The vmm-store daemon's engine: named growable buffers kept for the clients of a Unix
/// socket. The `vmm-store serve` tool (ipc/tools/vmm_store.cpp) is a thin main around it.
///
///     vmm::store::server daemon({.socket_path = "/run/user/1000/vmm-store/socket",
///                                .cap = 64ull << 30, .client_cap = 16ull << 30});
///     std::jthread loop([&] { daemon.run(); });     // until daemon.stop()
///
/// What it keeps. A buffer ("entry") is a vmm::growable_buffer drawn from the daemon's chunk
/// pool for its location, exported once through one vmm::ipc::exporter (each chunk's fd is
/// made once and cached, so serving it again costs a dup in the kernel), with its name, its
/// creator, the pids granted write access, and whether it is sealed. The daemon keeps the
/// last whole manifest of every entry per grant (read-only, read-write), so a get sends a
/// manifest it already has; growth replaces them.
///
/// The version table. A word per live entry in a sealed memfd that clients map read-only
/// (version_table.hpp): bumped before the reply of every request that removes, seals or
/// grows an entry, and when an entry loses its name or ends. Clients whose cached import is
/// current get it again locally and send a hold request, which has no reply (docs/store.md).
///
/// Lifetimes, per connection. Each connection counts the holds it took on each entry
/// (create, get and hold take one, release drops one). An entry is reachable by its name
/// until it is removed; it is destroyed, its chunks given back to the pool, once it is
/// unnamed and nobody holds it. An entry whose creator's connection closes before it was sealed is an
/// uncommitted creation: it loses its name then. A connection that closes, whatever the
/// reason (exit, crash, SIGKILL), drops every hold it had. The memory a client mapped stays
/// valid in the client whatever the daemon does (the import keeps it alive); what the
/// daemon frees is only its own mapping and its pool's claim.
///
/// Serving. The daemon is one thread over non-blocking sockets: each turn of its loop
/// polls every connection, moves what each one has ready without waiting, and answers only
/// whole requests. A connection's bytes collect in a receive buffer (the frame header first,
/// checked, then its payload) until its frame is complete, so a client that sends half a
/// frame, or a byte at a time, delays nobody; each turn serves at most one request of each
/// connection. A reply that the socket cannot take at once is queued
/// on its connection and written as the client reads; until it is, that connection's next
/// requests are not read (so a connection queues at most one reply), and others are served
/// as before. Two deadlines close a connection, each checked every turn whether or not the
/// connection was ready: a request whose first byte came request_timeout ago and that is
/// still not whole, and a reply not written in full reply_timeout after it was queued.
/// What a request asks for (a create, an export) is done on the thread: a costly request
/// delays the others by its cost, never by how its client sends or reads.
///
/// Order of events. Each turn first closes the connections whose peer hung up (their unread
/// requests are dropped: every request that changes something but release and hold gets a
/// reply, so a client that saw its reply knows it was done), then serves what the others
/// have ready, then closes those past a deadline. So a client that saw another process die (waitpid)
/// and then asks for statistics sees that process's holds gone.
///
/// Trust. Connections are accepted only from the uids allowed (SO_PEERCRED; by default the
/// daemon's own uid); others get a denied reply and are closed. A request is one frame of at
/// most max_request_bytes, checked whole before anything happens (decode_request); a frame
/// whose header claims more or announces more than max_offer_chunks descriptors is refused
/// before its payload is read. The receive has room for that many descriptors and no more
/// (the kernel closes the rest, and the request is refused); they are kept only for offer and
/// offer_more, whose chunks they are, and closed at once with a refusal for any other
/// request. An offer's memory is imported read-only with the importer's checks and its table
/// checked before any entry is made. A request that breaks the protocol gets a bad_request (or
/// unsupported_version) reply, and its connection is closed once that reply is written. One
/// connection's misbehaviour never changes another's state, nor delays another's replies.
///
/// Caps. `cap` bounds the physical memory of every live entry together (removed but held
/// ones included), `client_cap` what one connection's live creations hold; each is checked
/// before any memory is taken, and a refusal names the cap, its value and the need.
///
/// De-duplication. A seal that asks for it (request::deduplicate) compares the entry's chunks
/// with those of the other de-duplicated entries (content_index.hpp): a chunk of equal bytes
/// at the same location takes the place of the entry's own, which goes back to the pool, and
/// the entry's memory becomes that fixed list of chunks mapped read-only here. A chunk that
/// several entries map is counted once, to one of them: the caps and daemon_statistics::bytes
/// count stored bytes, and buffer_info::stored_bytes says what each entry is counted for. When
/// the entry counted for a chunk ends, the next one that maps it is counted for it (which no
/// cap refuses). A writer that still maps the entry from before the seal writes memory that
/// is no longer the entry's, or is shared: de-duplication trusts that nothing writes a sealed
/// entry.

#include <vmm/chunk_pool.hpp>
#include <vmm/growable_buffer.hpp>
#include <vmm/ipc/exporter.hpp>
#include <vmm/store/protocol.hpp>
#include <vmm/unique_fd.hpp>

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace vmm::store {

namespace detail {
class version_table;
class content_index;
}  // namespace detail

/// How a server runs.
struct server_options {
  /// Where to listen; empty: no listening socket (connections come only through
  /// add_connection, for tests and fuzzing). A stale socket file there (nothing listening)
  /// is replaced; a live one is an error.
  std::string socket_path;
  /// The most bytes (capacity) every buffer together may hold.
  std::size_t cap = std::numeric_limits<std::size_t>::max();
  /// The most bytes one connection's live creations may hold.
  std::size_t client_cap = std::numeric_limits<std::size_t>::max();
  /// The uids that may connect; empty: only the daemon's own.
  std::vector<uid_t> allowed_uids;
  /// How long a request frame may take to arrive once its first byte has; a connection
  /// still mid-frame then is closed.
  std::chrono::milliseconds request_timeout{1000};
  /// How long a reply (with the manifest that follows it) may wait, queued, for the client
  /// to read it; a connection whose reply is not written in full by then is closed.
  std::chrono::milliseconds reply_timeout{5000};
  /// Connections beyond this are refused.
  std::size_t max_connections = 4096;
  /// The most descriptors the offers under way (every connection's together, between an
  /// offer's first frame and its last) may hold; an offer frame that would pass it is refused
  /// (status unavailable) and its offer ends, so that no client's unfinished offer takes the
  /// descriptors others need. 0: half the soft RLIMIT_NOFILE, read at each offer frame.
  std::size_t max_offer_descriptors = 0;
  /// Words of the version table (8 bytes each, in a memfd that holds only the pages
  /// written): entries beyond this many live at once get none, and their holders go to the
  /// daemon at every get. 0: no table.
  std::size_t version_slots = std::size_t{1} << 16;
  /// For tests: every chunk hashes alike, so that each de-duplicating lookup finds every
  /// chunk of its location and size, and only the comparison of bytes decides what is shared.
  bool test_hash_collisions = false;
};

/// The daemon. See the file comment. Not thread-safe, except stop().
class server {
 public:
  /// Makes the listening socket (mode 0600) when socket_path is set.
  /// @throws vmm::invalid_argument the path is too long, or a live daemon listens there.
  /// @throws vmm::os_error socket, bind or listen failed.
  explicit server(server_options options);
  server(const server&) = delete;
  server& operator=(const server&) = delete;
  /// Closes every connection, destroys every buffer and removes the socket file.
  ~server();

  /// Serves until stop(). @throws vmm::os_error poll failed.
  void run();
  /// Serves what is ready within `timeout` (one turn of run()'s loop). False once stopped.
  /// Running out of memory ends the turn, or closes the connection whose request or reply
  /// could not be made (dropping its holds); the daemon serves on.
  /// @throws vmm::os_error poll failed.
  bool serve_once(std::chrono::milliseconds timeout);
  /// Makes run() return; callable from another thread or a signal handler.
  void stop() noexcept;

  /// Adopts a connected socket as a client with these credentials (checked as accept's).
  /// For tests and the fuzzer; the daemon's own connections come from accept. A uid not
  /// allowed, or a connection past max_connections, is refused on the socket (status
  /// denied) and closed; so is one the daemon has no descriptor for at accept (status
  /// unavailable, naming RLIMIT_NOFILE). Throws nothing but std::bad_alloc.
  void add_connection(unique_fd socket, pid_t pid, uid_t uid);

  /// The daemon's counters. Throws nothing but std::bad_alloc.
  [[nodiscard]] daemon_statistics statistics() const;
  [[nodiscard]] const daemon_info& info() const noexcept { return info_; }
  [[nodiscard]] const server_options& options() const noexcept { return options_; }

 private:
  struct entry;
  struct connection;
  class dispatch;

  bool turn(std::chrono::milliseconds timeout);  // serve_once, but for running out of memory
  void accept_pending();
  void close_connection(std::uint64_t id) noexcept;
  // Reads what has arrived of `client`'s next request, and serves it once it is whole.
  void receive(connection& client);
  // Answers one whole request.
  void serve(connection& client, std::span<const std::byte> payload, std::vector<unique_fd> fds);
  // Sends an error reply, then closes the connection.
  void refuse(connection& client, status code, const std::string& why);
  // Queues a reply (with `reply_fds`, descriptors the server keeps open, and the manifest
  // that follows it) and writes what fits now.
  void send(connection& client, std::span<const std::byte> reply,
            std::shared_ptr<const ipc::exported_manifest> manifest = nullptr,
            std::span<const int> reply_fds = {});
  // Writes what fits now of the queued reply.
  void flush(connection& client);
  void drop_hold(connection& client, std::uint64_t entry_id) noexcept;
  void destroy_if_unused(std::uint64_t entry_id) noexcept;
  std::shared_ptr<chunk_pool> pool_for(const location& where);

  server_options options_;
  std::unique_ptr<detail::version_table> versions_;  // version_table.hpp
  std::unique_ptr<detail::content_index> contents_;  // content_index.hpp: de-duplicated chunks
  daemon_info info_;
  unique_fd listener_;
  unique_fd spare_;  // /dev/null, given up for a moment to refuse a client when no descriptor is left
  unique_fd wake_read_, wake_write_;  // stop(): a byte on this pipe ends poll
  bool stopped_ = false;
  std::map<location, std::shared_ptr<chunk_pool>> pools_;
  ipc::exporter exporter_;
  std::map<std::uint64_t, std::unique_ptr<entry>> entries_;  // by entry id
  std::map<std::string, std::uint64_t, std::less<>> names_;  // name -> entry id
  // Descriptors the offers under way hold (max_offer_descriptors); before connections_,
  // whose pending offers count themselves out of it as they go.
  std::size_t offer_fds_ = 0;
  std::map<std::uint64_t, std::unique_ptr<connection>> connections_;
  std::uint64_t next_entry_ = 1;
  std::uint64_t next_connection_ = 1;
  std::size_t bytes_ = 0;  // physical memory of every live entry, each chunk once: what `cap` counts
};

}  // namespace vmm::store
