#include <vmm/store/server.hpp>

#include <vmm/error.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/provider.hpp>
#include <vmm/stream_executor.hpp>
#include <vmm/store/tensors.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <deque>
#include <new>
#include <random>

#include "content_index.hpp"
#include "daemon_os.hpp"
#include "entry_memory.hpp"
#include "vmm/detail/system.hpp"
#include "vmm/ipc/detail/continuation.hpp"
#include "vmm/ipc/detail/fd_channel.hpp"
#include "version_table.hpp"

namespace vmm::store {
namespace {

// A request the daemon refuses: the reply carries the status and the message; the
// connection goes on.
struct refusal {
  status code;
  std::string message;
};

// One message of a reply on its way out, `sent` bytes of its frame written. Its descriptors
// belong to `keeps`, a manifest of an entry the connection holds (so its chunks live), kept
// alive here until the message is written even if the entry's cache moves on.
struct outgoing_frame {
  std::vector<std::byte> payload;
  std::vector<int> fds;
  std::shared_ptr<const ipc::exported_manifest> keeps;
  std::size_t sent = 0;
};

outgoing_frame make_frame(std::span<const std::byte> payload, std::span<const int> fds = {},
                          std::shared_ptr<const ipc::exported_manifest> keeps = nullptr) {
  return {{payload.begin(), payload.end()}, {fds.begin(), fds.end()}, std::move(keeps)};
}

}  // namespace

struct server::entry {
  std::uint64_t id = 0;
  std::string name;
  bool named = true;
  bool sealed = false;
  std::uint64_t creator = 0;  // the creating connection while it lives and the entry is unsealed
  pid_t creator_pid = 0;
  std::set<pid_t> writers;
  std::uint64_t charged_to = 0;  // the connection whose client cap counts it (0: none)
  std::uint32_t holders = 0;
  std::uint32_t slot = no_version_slot;  // its word in the version table
  std::size_t charged = 0;               // bytes counted in bytes_ (and the charged connection's)
  bool exact_chunks = false;             // one-chunk creations: every create and grow maps one chunk
  detail::entry_memory memory;           // made here, or offered back by a client (entry_memory.hpp)
  // An offered entry: the daemon instance and entry it came from (0: made here).
  std::uint64_t origin = 0;
  std::uint64_t origin_entry = 0;
  // The last whole export per grant, valid for the capacity it was made at.
  std::map<access_mode, std::shared_ptr<const ipc::exported_manifest>> whole;
  // Every generation (manifest buffer_id) exported for this entry, with its grant.
  std::map<std::uint64_t, access_mode> generations;
  // A tensor set's checked table (tensors.hpp), encoded; empty for a plain buffer.
  std::vector<std::byte> table;
  std::uint32_t tensors = 0;
  std::uint64_t named_bytes = 0;
  // A de-duplicated entry: the chunks it entered the content index with (content_index.hpp).
  std::vector<shared_chunk> indexed;

  explicit entry(detail::entry_memory m) : memory(std::move(m)) {}
  [[nodiscard]] bool may_write(pid_t pid) const { return pid == creator_pid || writers.contains(pid); }
  [[nodiscard]] buffer_info info(const detail::content_index& contents) const {
    return {
        name,    id,     memory.where(), memory.size(), memory.capacity(), memory.max_size(),
        holders, sealed, tensors,        named_bytes,   charged,           contents.shared_bytes(indexed)};
  }
};

struct server::connection {
  std::uint64_t id = 0;
  unique_fd socket;
  pid_t pid = 0;
  uid_t uid = 0;
  std::map<std::uint64_t, std::uint32_t> holds;  // entry id -> holds
  std::size_t charged = 0;                       // bytes of its live creations
  // The request being received: its frame header, then its payload.
  std::array<std::byte, sizeof(ipc::frame_header) + max_request_bytes> inbox{};
  std::size_t received = 0;
  // The reply being written. While it is, nothing more is read from this client.
  std::deque<outgoing_frame> outbox;
  // Set while a request is partly received (request_timeout) or a reply partly written
  // (reply_timeout): never both, as no request is read while a reply waits.
  std::optional<ipc::detail::deadline> deadline;
  bool closing = false;  // closed once the outbox is written (at once if it is empty)
  // The descriptors that came with the request being received (offer and offer_more only).
  std::vector<unique_fd> inbox_fds;
  // An offer whose chunks are still coming (offer_more): its first request, every chunk's
  // size and descriptor so far. Its descriptors count in the daemon's offer_fds_ for as long
  // as it lives, however it ends (complete, refused, or its connection closed).
  struct pending_offer {
    explicit pending_offer(std::size_t& daemon_count) : counted_in(daemon_count) {}
    pending_offer(const pending_offer&) = delete;
    pending_offer& operator=(const pending_offer&) = delete;
    ~pending_offer() { counted_in -= counted; }
    void add(std::vector<unique_fd>& more) {
      for (unique_fd& fd : more) fds.push_back(std::move(fd));
      counted_in += more.size();
      counted += more.size();
    }

    request first;
    std::vector<std::uint64_t> sizes;
    std::vector<unique_fd> fds;
    std::size_t& counted_in;
    std::size_t counted = 0;
  };
  std::unique_ptr<pending_offer> offer;

  // Whether the turn that ends closes it.
  [[nodiscard]] bool finished() const noexcept {
    return (closing && outbox.empty()) || (deadline && deadline->passed());
  }
  // The peer went away, or broke off: nothing more to read or write.
  void hang_up() noexcept {
    outbox.clear();
    closing = true;
  }
};

server::server(server_options options)
    : options_(std::move(options)),
      versions_(
          std::make_unique<detail::version_table>(detail::version_table::create(options_.version_slots))),
      contents_(std::make_unique<detail::content_index>(options_.test_hash_collisions)) {
  std::random_device random;
  info_.instance = (std::uint64_t{random()} << 32) ^ random() ^ detail::realtime_ns();
  info_.started_ns = detail::realtime_ns();
  info_.pid = static_cast<std::uint32_t>(::getpid());
  info_.version_slots = static_cast<std::uint32_t>(versions_->slots());
  if (options_.allowed_uids.empty()) options_.allowed_uids.push_back(::getuid());
  int pipe_ends[2];
  if (::pipe2(pipe_ends, O_CLOEXEC | O_NONBLOCK) != 0) throw os_error(errno, "vmm-store: pipe2");
  wake_read_ = unique_fd(pipe_ends[0]);
  wake_write_ = unique_fd(pipe_ends[1]);
  if (!options_.socket_path.empty()) {
    detail::clear_stale_socket(options_.socket_path);
    listener_ = ipc::listen_unix(options_.socket_path);
    if (::chmod(options_.socket_path.c_str(), 0600) != 0)
      throw os_error(errno, "vmm-store: chmod of the socket");
    spare_ = unique_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));  // none: accept_pending() does without
  }
}

server::~server() {
  connections_.clear();
  entries_.clear();
  names_.clear();
  if (listener_) ::unlink(options_.socket_path.c_str());
}

void server::stop() noexcept {
  const char byte = 1;
  [[maybe_unused]] const auto ignored = ::write(wake_write_.get(), &byte, 1);
}

void server::run() {
  while (serve_once(ipc::no_timeout)) {}
}

std::shared_ptr<chunk_pool> server::pool_for(const location& where) {
  if (const auto found = pools_.find(where); found != pools_.end()) return found->second;
  // Made before it is entered: a location without a provider here (no GPU) leaves no entry.
  auto pool = chunk_pool::create(provider_for(where), {.cap = options_.cap});
  pools_.emplace(where, pool);
  return pool;
}

void server::add_connection(unique_fd socket, pid_t pid, uid_t uid) {
  // A new socket has room for this short reply: it is sent at once or not at all.
  const auto refuse = [&](const std::string& why) {
    try {
      ipc::send_message(socket.get(), encode_error(status::denied, why), {}, std::chrono::milliseconds(0));
    } catch (const std::exception&) {
      // The client is refused either way.
    }
  };
  if (std::find(options_.allowed_uids.begin(), options_.allowed_uids.end(), uid) ==
      options_.allowed_uids.end())
    return refuse(fmt::format("vmm-store: uid {} may not connect to this daemon (it allows {})", uid,
                              fmt::join(options_.allowed_uids, ", ")));
  if (connections_.size() >= options_.max_connections)
    return refuse(
        fmt::format("vmm-store: {} connections already (the most this daemon takes)", connections_.size()));
  auto client = std::make_unique<connection>();
  client->id = next_connection_++;
  client->socket = std::move(socket);
  client->pid = pid;
  client->uid = uid;
  connections_.emplace(client->id, std::move(client));
}

void server::accept_pending() {
  unique_fd socket(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!socket && (errno == EMFILE || errno == ENFILE) && spare_) {
    // No descriptor left for the client. Left in the backlog it would wait for a reply that
    // never comes, and keep the listener ready, so that every turn returned at once: the
    // spare descriptor makes room to take it and tell it why, and is opened again after.
    const int error = errno;
    spare_.reset();
    if (const unique_fd refused(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        refused) {
      try {
        // Written without fmt: no descriptor is free here, and a sanitizer's check of a
        // virtual call (fmt's buffers make some) needs one.
        std::string why = "vmm-store: the daemon has no file descriptor left for another connection: ";
        why += std::strerror(error);
        if (rlimit files{}; ::getrlimit(RLIMIT_NOFILE, &files) == 0)
          why += " (RLIMIT_NOFILE " + std::to_string(files.rlim_cur) + ")";
        ipc::send_message(refused.get(), encode_error(status::unavailable, why), {},
                          std::chrono::milliseconds(0));
      } catch (const std::exception&) {
        // The client is refused either way: the connection closes.
      }
    }
    spare_ = unique_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    return;
  }
  if (!socket) return;  // the client gave up already, or a signal came: the next turn tries again
  ucred credentials{};
  socklen_t length = sizeof credentials;
  if (::getsockopt(socket.get(), SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return;
  add_connection(std::move(socket), credentials.pid, credentials.uid);
}

bool server::serve_once(std::chrono::milliseconds timeout) {
  try {
    return turn(timeout);
  } catch (const std::bad_alloc&) {
    // No memory for the turn's own lists (a connection's requests fail apart, in turn()):
    // nothing was served, and the next turn tries again.
    return !stopped_;
  }
}

bool server::turn(std::chrono::milliseconds timeout) {
  if (stopped_) return false;
  std::vector<pollfd> polled;
  std::vector<std::uint64_t> ids;
  polled.push_back({wake_read_.get(), POLLIN, 0});
  if (listener_) polled.push_back({listener_.get(), POLLIN, 0});
  const std::size_t first_client = polled.size();
  // Wait no longer than the first deadline of a connection.
  int wait_ms = timeout == ipc::no_timeout
                    ? -1
                    : static_cast<int>(std::clamp<std::int64_t>(timeout.count(), 0, INT_MAX));
  for (const auto& [id, client] : connections_) {
    polled.push_back(
        {client->socket.get(), static_cast<short>(client->outbox.empty() ? POLLIN : POLLOUT), 0});
    ids.push_back(id);
    const int left = client->deadline ? client->deadline->poll_timeout() : -1;
    if (left >= 0 && (wait_ms < 0 || left < wait_ms)) wait_ms = left;
  }
  const int ready = os::poll(polled.data(), polled.size(), wait_ms);
  if (ready < 0) {
    if (errno == EINTR) return true;
    throw os_error(errno, "vmm-store: poll");
  }
  if (polled[0].revents != 0) {
    stopped_ = true;
    return false;
  }
  // Hang-ups first: see the file comment.
  for (std::size_t i = 0; i < ids.size(); ++i)
    if ((polled[first_client + i].revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) close_connection(ids[i]);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto found = connections_.find(ids[i]);
    if (found == connections_.end()) continue;
    try {
      if ((polled[first_client + i].revents & POLLOUT) != 0) flush(*found->second);
      if ((polled[first_client + i].revents & POLLIN) != 0) receive(*found->second);
    } catch (const std::exception&) {
      // No memory for this client's request or reply (serve() answers every other failure):
      // its connection closes, which drops its holds, and the daemon serves on.
      close_connection(ids[i]);
    }
  }
  // Then what is done: refused clients whose reply is written, and every connection whose
  // request or reply is past its deadline, whether or not it was ready in this turn.
  ids.clear();
  for (const auto& [id, client] : connections_)
    if (client->finished()) ids.push_back(id);
  for (const std::uint64_t id : ids) close_connection(id);
  if (listener_ && (polled[1].revents & POLLIN) != 0) accept_pending();
  return true;
}

void server::drop_hold(connection& client, std::uint64_t entry_id) noexcept {
  const auto held = client.holds.find(entry_id);
  if (held == client.holds.end()) return;
  if (--held->second == 0) client.holds.erase(held);
  if (const auto found = entries_.find(entry_id); found != entries_.end()) {
    --found->second->holders;
    destroy_if_unused(entry_id);
  }
}

void server::destroy_if_unused(std::uint64_t entry_id) noexcept {
  const auto found = entries_.find(entry_id);
  if (found == entries_.end()) return;
  entry& e = *found->second;
  if (e.named || e.holders != 0) return;
  versions_->give_back(e.slot);
  bytes_ -= e.charged;
  if (e.charged_to != 0)
    if (const auto owner = connections_.find(e.charged_to); owner != connections_.end())
      owner->second->charged -= e.charged;
  // Its shared chunks that it was counted for: the next entry that maps each is, from now on.
  contents_->leave(e.id, e.indexed, [&](std::uint64_t next, std::size_t bytes) {
    entry& payer = *entries_.at(next);
    payer.charged += bytes;
    bytes_ += bytes;
    if (payer.charged_to != 0)
      if (const auto owner = connections_.find(payer.charged_to); owner != connections_.end())
        owner->second->charged += bytes;
  });
  entries_.erase(found);  // gives the chunks back to the pool; closes the cached manifests' fds
  exporter_.purge();      // closes the exporter's fds of those chunks
}

void server::close_connection(std::uint64_t id) noexcept {
  // Nothing here allocates: a daemon out of memory still closes connections.
  const auto found = connections_.find(id);
  if (found == connections_.end()) return;
  connection& client = *found->second;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const std::uint64_t entry_id = it->first;
    entry& e = *(it++)->second;  // the next one first: this one may be destroyed below
    if (e.charged_to == id) e.charged_to = 0;
    if (e.creator != id) continue;
    e.creator = 0;
    if (!e.sealed && e.named) {  // an uncommitted creation: its name goes with its creator
      names_.erase(e.name);
      e.named = false;
      versions_->bump(e.slot);
      destroy_if_unused(entry_id);
    }
  }
  for (const auto& [entry_id, holds] : client.holds) {
    if (const auto e = entries_.find(entry_id); e != entries_.end()) e->second->holders -= holds;
    destroy_if_unused(entry_id);
  }
  connections_.erase(found);
}

// The request handlers. Each returns the reply body, and may set `manifest` to a manifest
// that follows the reply; a refusal is thrown as `refusal`.
class server::dispatch {
 public:
  dispatch(server& daemon, connection& client) : d_(daemon), c_(client) {}

  std::shared_ptr<const ipc::exported_manifest> manifest;
  int table_fd = -1;           // hello: the version table's descriptor goes with the reply
  std::vector<unique_fd> fds;  // offer, offer_more: the frame's descriptors

  std::vector<std::byte> run(const request& r) {
    switch (r.op) {
      case operation::hello:
        if (d_.versions_->slots() != 0) table_fd = d_.versions_->fd();
        return encode(d_.info_);
      case operation::create:
        return create(r);
      case operation::seal:
        return seal(r);
      case operation::get:
        return get(r);
      case operation::refresh:
        return refresh(r);
      case operation::grow:
        return grow(r);
      case operation::grant:
        return grant(r);
      case operation::list: {
        std::vector<buffer_info> infos;
        for (const auto& [name, id] : d_.names_) infos.push_back(d_.entries_.at(id)->info(*d_.contents_));
        return encode(infos);
      }
      case operation::stat:
        return encode(named(r.name).info(*d_.contents_));
      case operation::remove: {
        entry& e = named(r.name);
        d_.names_.erase(e.name);
        e.named = false;
        d_.versions_->bump(e.slot);
        d_.destroy_if_unused(e.id);
        return {};
      }
      case operation::statistics:
        return encode(d_.statistics());
      case operation::seal_set:
        return seal_set(r);
      case operation::tensors:
        return tensors(r);
      case operation::offer:
      case operation::offer_more:
        try {
          return offer(r);
        } catch (...) {
          c_.offer.reset();  // a refused frame ends its offer; the descriptors close
          throw;
        }
      case operation::release:
      case operation::hold:
        break;
    }
    throw refusal{status::bad_request, "vmm-store: no reply to this operation"};
  }

 private:
  entry& named(const std::string& name) {
    const auto found = d_.names_.find(name);
    if (found == d_.names_.end())
      throw refusal{status::not_found, fmt::format("vmm-store: no buffer named \"{}\"", name)};
    return *d_.entries_.at(found->second);
  }

  void check_writer(const entry& e, const char* what) const {
    if (e.sealed)
      throw refusal{status::sealed, fmt::format("vmm-store: \"{}\" is sealed: no {} any more", e.name, what)};
    if (!e.may_write(c_.pid))
      throw refusal{status::denied,
                    fmt::format("vmm-store: pid {} may not {} \"{}\": only its creator (pid {}) and "
                                "the pids it granted may",
                                c_.pid, what, e.name, e.creator_pid)};
  }

  // Refuses growth of the capacity charged to `e` (or a new entry) from `from` to `to`.
  void check_caps(const std::string& name, std::size_t from, std::size_t to, bool charged_here) const {
    const std::size_t more = to - from;
    if (d_.bytes_ + more > d_.options_.cap || d_.bytes_ + more < d_.bytes_)
      throw refusal{
          status::cap_exceeded,
          fmt::format("vmm-store: \"{}\" needs {} more bytes, past the daemon's cap (--cap {} bytes; its "
                      "buffers hold {})",
                      name, more, d_.options_.cap, d_.bytes_)};
    if (charged_here && c_.charged + more > d_.options_.client_cap)
      throw refusal{
          status::cap_exceeded,
          fmt::format("vmm-store: \"{}\" needs {} more bytes, past the per-client cap (--client-cap {} "
                      "bytes; this client's buffers hold {})",
                      name, more, d_.options_.client_cap, c_.charged)};
  }

  // Counts `bytes` to `e` from now on, fewer or more than before.
  void recharge(entry& e, std::size_t bytes) {
    connection* owner = nullptr;
    if (e.charged_to != 0)
      if (const auto found = d_.connections_.find(e.charged_to); found != d_.connections_.end())
        owner = found->second.get();
    d_.bytes_ = d_.bytes_ - e.charged + bytes;
    if (owner != nullptr) owner->charged = owner->charged - e.charged + bytes;
    e.charged = bytes;
  }

  void charge(entry& e, std::size_t capacity) {
    const std::size_t more = capacity - e.charged;
    e.charged = capacity;
    d_.bytes_ += more;
    if (e.charged_to != 0)
      if (const auto owner = d_.connections_.find(e.charged_to); owner != d_.connections_.end())
        owner->second->charged += more;
  }

  void hold(entry& e) {
    ++c_.holds[e.id];
    ++e.holders;
  }

  // `reply` with the version-table slot of `e` and its word now, where a client may get `e`
  // again without asking: where every change to `e` is a request's, which the daemon
  // answers after it bumped the word. That is true of a sealed entry, and of an unsealed one
  // for its creator; but an unsealed entry also loses its name when its creator goes, which
  // no request of another client is ordered after.
  hold_reply versioned(hold_reply reply, const entry& e) const {
    if (e.sealed || e.creator == c_.id) {
      reply.slot = e.slot;
      reply.version = d_.versions_->read(e.slot);
    }
    return reply;
  }

  // The whole manifest of `e` for `grant`, made now if the cached one is stale.
  std::shared_ptr<const ipc::exported_manifest> whole(entry& e, access_mode grant) {
    auto found = e.whole.find(grant);
    if (found == e.whole.end() || !e.memory.describes(found->second->description)) {
      auto made = std::make_shared<const ipc::exported_manifest>(e.memory.export_whole(d_.exporter_, grant));
      e.generations[made->description.buffer_id] = grant;
      found = e.whole.insert_or_assign(grant, std::move(made)).first;
    }
    return found->second;
  }

  // What a client that maps [0, end) of generation `generation` gets: nothing, a growth
  // manifest, or (generation unknown: another entry, another grant) a whole one.
  hold_reply deliver(entry& e, std::uint64_t generation, std::uint64_t end, access_mode grant) {
    hold_reply reply = versioned(hold_reply{e.id, e.memory.size(), delivery::whole, e.sealed}, e);
    const auto known = e.generations.find(generation);
    if (generation != 0 && known != e.generations.end() && known->second == grant &&
        end <= e.memory.capacity()) {
      if (end == e.memory.capacity()) {
        reply.sent = delivery::current;
        return reply;
      }
      ipc::manifest last;
      last.buffer_id = generation;
      last.end = end;
      try {
        manifest =
            std::make_shared<const ipc::exported_manifest>(e.memory.export_growth(d_.exporter_, last, grant));
        reply.sent = delivery::growth;
        return reply;
      } catch (const invalid_argument&) {
        // `end` is no chunk boundary of this generation: the client imports it whole.
      }
    }
    manifest = whole(e, grant);
    return reply;
  }

  std::vector<std::byte> create(const request& r) {
    if (d_.names_.contains(r.name))
      throw refusal{status::exists, fmt::format("vmm-store: the name \"{}\" is taken", r.name)};
    if (r.where.kind == memory_kind::pinned_host)
      throw refusal{status::unavailable,
                    "vmm-store: pinned host memory cannot be exported; use os_host or a device"};
    std::shared_ptr<chunk_pool> pool;
    try {
      pool = d_.pool_for(r.where);
    } catch (const std::exception& error) {
      throw refusal{status::unavailable,
                    fmt::format("vmm-store: no {} here: {}", to_string(r.where), error.what())};
    }
    const std::size_t g = pool->provider()->capabilities().granularity;
    const std::size_t largest = pool->provider()->capabilities().physical_memory_size / g * g;
    // By default a buffer may grow to half its location's memory, or to a cap if lower:
    // every holder reserves that much address space, and an importer refuses more than
    // its location's memory size (measured in its own process, so a little differently).
    const std::size_t default_max = std::max(
        std::min({largest / 2, d_.options_.cap, d_.options_.client_cap}) / g * g, (r.size + g - 1) / g * g);
    std::size_t max = r.max_size != 0 ? r.max_size : default_max;
    if (r.max_size != 0 && (max > largest || max % g != 0))
      throw refusal{status::invalid,
                    fmt::format("vmm-store: max size {} is not a multiple of the granularity {} "
                                "up to the location's {} bytes",
                                r.max_size, g, largest)};
    if (r.size > max)
      throw refusal{status::invalid, fmt::format("vmm-store: size {} is past the max size {}", r.size, max)};
    // One chunk: the size is one physical handle to import, and each grow maps exactly its
    // growth as one more (a fixed policy of the whole range, mapped exactly: no fallback to
    // smaller chunks either).
    const std::size_t capacity = r.one_chunk ? std::min(round_up(r.size, g), max)
                                             : chunk_policy::geometric().capacity_after(0, r.size, g, max);
    check_caps(r.name, 0, capacity, true);
    growable_buffer buffer(
        pool,
        {.max_size = max, .policy = r.one_chunk ? chunk_policy::fixed(max) : chunk_policy::geometric()});
    if (r.one_chunk) buffer.reserve_exact(r.size, buffer.stream());
    buffer.resize(r.size);
    auto made = std::make_unique<entry>(detail::entry_memory(std::move(buffer)));
    entry& e = *made;
    e.id = d_.next_entry_++;
    e.name = r.name;
    e.creator = c_.id;
    e.creator_pid = c_.pid;
    e.charged_to = c_.id;
    e.exact_chunks = r.one_chunk;
    std::shared_ptr<const ipc::exported_manifest> sent = whole(e, access_mode::read_write);
    d_.entries_.emplace(e.id, std::move(made));
    d_.names_.emplace(e.name, e.id);
    charge(e, e.memory.capacity());
    hold(e);
    manifest = std::move(sent);
    e.slot = d_.versions_->take();
    return encode(versioned(hold_reply{e.id, e.memory.size(), delivery::whole, false}, e));
  }

  std::vector<std::byte> seal(const request& r) {
    entry& e = named(r.name);
    check_writer(e, "seal");
    if (r.deduplicate) deduplicate(e);
    e.sealed = true;
    d_.versions_->bump(e.slot);
    e.whole.erase(access_mode::read_write);
    return {};
  }

  // Shares `e`'s chunks with those of equal bytes of other de-duplicated entries, and enters
  // the rest into the index (server.hpp, "De-duplication"). A failure leaves `e` as it was.
  void deduplicate(entry& e) {
    const std::vector<shared_chunk> own = e.memory.chunks();
    if (own.empty()) return;
    detail::deduplicated_chunks found = d_.contents_->deduplicate(own, e.memory.data(), e.memory.provider());
    std::optional<detail::entry_memory> composed;
    if (found.replaced != 0) composed.emplace(e.memory.provider(), found.chunks, e.memory.size());
    std::vector<shared_chunk> indexed = found.chunks;
    const std::size_t paid = d_.contents_->enter(e.id, found);  // the last step that may fail
    e.indexed = std::move(indexed);
    if (composed) {
      // Its own chunks that were replaced go back to the pool once nothing holds them: the
      // cached manifests (and the exporter's descriptors) of the old memory go too, so that no
      // later get describes it.
      e.memory = std::move(*composed);
      e.whole.clear();
      e.generations.clear();
      d_.exporter_.purge();
    }
    recharge(e, paid);
  }

  // Seals a tensor set: its table is copied out of the buffer (the creator may still write
  // there; the daemon keeps its own checked copy) and checked against the bytes before it.
  std::vector<std::byte> seal_set(const request& r) {
    entry& e = named(r.name);
    check_writer(e, "seal");
    take_table(e, e.name, r.table_offset, r.table_bytes);
    return seal(r);
  }

  // Copies the table at [offset, offset + bytes) of `e`'s memory out, checks it against
  // the bytes before it and keeps it; a refusal changes nothing.
  static void take_table(entry& e, const std::string& name, std::uint64_t offset, std::uint64_t bytes) {
    const std::uint64_t size = e.memory.size();
    if (offset > size || bytes > size - offset)
      throw refusal{status::invalid,
                    fmt::format("vmm-store: the table of \"{}\" ([{}, +{})) is past its {} bytes", name,
                                offset, bytes, size)};
    std::vector<std::byte> copy = e.memory.read(offset, bytes);
    std::vector<tensor_info> table;
    try {
      table = decode_tensor_table(copy, offset);
    } catch (const ipc::protocol_error& error) {
      throw refusal{status::invalid,
                    fmt::format("vmm-store: \"{}\" is no valid tensor set: {}", name, error.what())};
    }
    std::uint64_t named_bytes = 0;
    for (const tensor_info& t : table) named_bytes += t.bytes;
    e.table = std::move(copy);
    e.tensors = static_cast<std::uint32_t>(table.size());
    e.named_bytes = named_bytes;
  }

  std::vector<std::byte> tensors(const request& r) {
    if (!c_.holds.contains(r.entry))
      throw refusal{status::not_found,
                    fmt::format("vmm-store: tensors of entry {}, which this client does not hold", r.entry)};
    const entry& e = *d_.entries_.at(r.entry);
    if (e.table.empty())
      throw refusal{status::invalid,
                    fmt::format("vmm-store: \"{}\" is a plain buffer, no tensor set", e.name)};
    return e.table;
  }

  // A client offers sealed memory it maps back to a restarted daemon (docs/store.md, "What
  // survives a SIGKILL"). The first offer of a name wins; a later one of the same origin
  // (the same entry of the same dead daemon) is answered with the entry made of the first.
  std::vector<std::byte> offer(const request& r) {
    if (r.op == operation::offer) {
      if (c_.offer)
        throw refusal{status::invalid,
                      fmt::format("vmm-store: an offer of \"{}\" while one of \"{}\" is under way", r.name,
                                  c_.offer->first.name)};
      if (const auto taken = d_.names_.find(r.name); taken != d_.names_.end()) {
        entry& e = *d_.entries_.at(taken->second);
        if (e.origin == 0 || e.origin != r.origin || e.origin_entry != r.entry)
          throw refusal{
              status::exists,
              fmt::format("vmm-store: the name \"{}\" is taken (by entry {}, not entry {} of daemon "
                          "instance {:#x}): the first offer of a name wins",
                          r.name, e.id, r.entry, r.origin)};
        // The same memory (the same entry of the daemon that died) offered again.
        if (r.tensor_set && e.table.empty()) take_table(e, e.name, r.table_offset, r.table_bytes);
        if (r.generation != 0) e.generations.emplace(r.generation, access_mode::read_only);
        return encode(versioned(hold_reply{e.id, e.memory.size(), delivery::current, true}, e));
      }
      if (r.chunk_sizes.size() > r.chunk_total)
        throw refusal{status::invalid,
                      fmt::format("vmm-store: an offer of {} chunks sends {} in its first frame",
                                  r.chunk_total, r.chunk_sizes.size())};
      c_.offer = std::make_unique<connection::pending_offer>(d_.offer_fds_);
      c_.offer->first = r;
    } else if (!c_.offer) {
      throw refusal{status::invalid, "vmm-store: offer_more without an offer under way"};
    } else if (r.chunk_sizes.size() > c_.offer->first.chunk_total - c_.offer->sizes.size()) {
      throw refusal{status::invalid,
                    fmt::format("vmm-store: the offer of \"{}\" has {} chunks; {} more came after {}",
                                c_.offer->first.name, c_.offer->first.chunk_total, r.chunk_sizes.size(),
                                c_.offer->sizes.size())};
    }
    connection::pending_offer& pending = *c_.offer;
    if (const std::size_t bound = offer_descriptor_bound(); d_.offer_fds_ + fds.size() > bound)
      throw refusal{status::unavailable,
                    fmt::format("vmm-store: the offer of \"{}\" is refused: with its {} more descriptors the "
                                "offers under way would hold {}, past the daemon's bound of {} "
                                "(max_offer_descriptors{}); offer it again once they are done",
                                pending.first.name, fds.size(), d_.offer_fds_ + fds.size(), bound,
                                d_.options_.max_offer_descriptors == 0 ? ": half of RLIMIT_NOFILE" : "")};
    pending.sizes.insert(pending.sizes.end(), r.chunk_sizes.begin(), r.chunk_sizes.end());
    pending.add(fds);
    if (pending.sizes.size() < pending.first.chunk_total) return {};  // more to come
    const std::unique_ptr<connection::pending_offer> whole = std::move(c_.offer);
    return adopt(whole->first, whole->sizes, std::move(whole->fds));
  }

  // options_.max_offer_descriptors, or half the soft descriptor limit where it is 0.
  [[nodiscard]] std::size_t offer_descriptor_bound() const {
    if (d_.options_.max_offer_descriptors != 0) return d_.options_.max_offer_descriptors;
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY)
      return std::numeric_limits<std::size_t>::max();
    return static_cast<std::size_t>(files.rlim_cur / 2);
  }

  // Makes an entry of a complete offer: imported read-only, its table checked, sealed.
  std::vector<std::byte> adopt(const request& r, std::span<const std::uint64_t> sizes,
                               std::vector<unique_fd> offered) {
    std::uint64_t total = 0;
    for (const std::uint64_t size : sizes) total = size > UINT64_MAX - total ? UINT64_MAX : total + size;
    check_caps(r.name, 0, total, false);
    detail::entry_memory memory = [&] {
      try {
        return detail::entry_memory::adopt(r.where, r.size, sizes, std::move(offered));
      } catch (const ipc::protocol_error& error) {
        throw refusal{status::invalid,
                      fmt::format("vmm-store: the offer of \"{}\" is refused: {}", r.name, error.what())};
      } catch (const invalid_argument& error) {
        throw refusal{status::invalid,
                      fmt::format("vmm-store: the offer of \"{}\" is refused: {}", r.name, error.what())};
      }
    }();
    auto made = std::make_unique<entry>(std::move(memory));
    entry& e = *made;
    e.name = r.name;
    e.sealed = true;
    e.origin = r.origin;
    e.origin_entry = r.entry;
    if (r.tensor_set) take_table(e, r.name, r.table_offset, r.table_bytes);
    if (r.generation != 0) e.generations.emplace(r.generation, access_mode::read_only);
    e.id = d_.next_entry_++;
    d_.entries_.emplace(e.id, std::move(made));
    d_.names_.emplace(e.name, e.id);
    charge(e, e.memory.capacity());
    e.slot = d_.versions_->take();
    return encode(versioned(hold_reply{e.id, e.memory.size(), delivery::current, true}, e));
  }

  std::vector<std::byte> grant(const request& r) {
    entry& e = named(r.name);
    if (c_.pid != e.creator_pid)
      throw refusal{status::denied,
                    fmt::format("vmm-store: only the creator of \"{}\" (pid {}) grants write access", e.name,
                                e.creator_pid)};
    e.writers.insert(static_cast<pid_t>(r.pid));
    return {};
  }

  std::vector<std::byte> get(const request& r) {
    entry& e = named(r.name);
    if (r.access == access_mode::read_write) check_writer(e, "write");
    const hold_reply reply = deliver(e, r.entry == e.id ? r.generation : 0, r.end, r.access);
    hold(e);
    return encode(reply);
  }

  std::vector<std::byte> refresh(const request& r) {
    const auto held = c_.holds.find(r.entry);
    if (held == c_.holds.end())
      throw refusal{status::not_found,
                    fmt::format("vmm-store: refresh of entry {}, which this client does not hold", r.entry)};
    entry& e = *d_.entries_.at(r.entry);
    const auto known = e.generations.find(r.generation);
    if (known == e.generations.end())
      throw refusal{
          status::invalid,
          fmt::format("vmm-store: refresh of generation {:#x}, not one of entry {}", r.generation, r.entry)};
    return encode(deliver(e, r.generation, r.end, known->second));
  }

  std::vector<std::byte> grow(const request& r) {
    entry& e = named(r.name);
    check_writer(e, "grow");
    if (r.size < e.memory.size())
      throw refusal{status::invalid,
                    fmt::format("vmm-store: \"{}\" holds {} bytes; buffers do not shrink (asked {})", e.name,
                                e.memory.size(), r.size)};
    if (r.size > e.memory.max_size())
      throw refusal{status::invalid, fmt::format("vmm-store: \"{}\" grows to {} bytes at most, not {}",
                                                 e.name, e.memory.max_size(), r.size)};
    growable_buffer& buffer = e.memory.buffer();  // sealed: an offered entry never gets here
    const std::size_t g = buffer.provider()->capabilities().granularity;
    const std::size_t mapped = e.memory.capacity();
    const std::size_t capacity =
        e.exact_chunks ? std::max(mapped, round_up(r.size, g))
                       : chunk_policy::geometric().capacity_after(mapped, r.size, g, e.memory.max_size());
    check_caps(e.name, e.memory.capacity(), std::max(capacity, e.memory.capacity()), e.charged_to == c_.id);
    if (e.exact_chunks) buffer.reserve_exact(r.size, buffer.stream());
    buffer.resize(r.size);
    d_.versions_->bump(e.slot);
    charge(e, std::max(e.charged, e.memory.capacity()));
    return encode(e.info(*d_.contents_));
  }

  server& d_;
  connection& c_;
};

void server::receive(connection& client) {
  constexpr std::size_t header_bytes = sizeof(ipc::frame_header);
  const auto header = [&] {
    ipc::frame_header read{};
    std::memcpy(&read, client.inbox.data(), header_bytes);
    return read;
  };
  // The header first, alone: a frame too large for any request is refused before its
  // payload is read.
  std::size_t wanted = client.received < header_bytes ? header_bytes : header_bytes + header().payload_size;
  while (client.received < wanted) {
    iovec io{client.inbox.data() + client.received, wanted - client.received};
    // Room for the descriptors of one offer frame and no more: the kernel closes any past
    // that and sets MSG_CTRUNC. Which requests may carry them is checked once decoded.
    alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * max_offer_chunks)> control{};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    const ssize_t got = os::recvmsg(client.socket.get(), &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;  // the rest later
    detail::take_descriptors(message, client.inbox_fds);
    if (got <= 0) return client.hang_up();  // closed or broken off, mid-frame or not: nothing to tell
    if ((message.msg_flags & MSG_CTRUNC) != 0 || client.inbox_fds.size() > max_offer_chunks)
      return refuse(client, status::bad_request,
                    fmt::format("vmm-store: a request came with more than {} descriptors", max_offer_chunks));
    if (client.received == 0) client.deadline.emplace(options_.request_timeout);
    client.received += static_cast<std::size_t>(got);
    if (client.received != header_bytes) continue;
    const ipc::frame_header h = header();
    if (h.magic != ipc::frame_magic || h.payload_size > max_request_bytes || h.fd_count > max_offer_chunks)
      return refuse(
          client, status::bad_request,
          fmt::format("vmm-store: a request frame of {} bytes with {} descriptors (magic {:#010x}); requests "
                      "are at most {} bytes, with at most {} descriptors",
                      h.payload_size, h.fd_count, h.magic, max_request_bytes, max_offer_chunks));
    wanted += h.payload_size;
  }
  client.received = 0;
  client.deadline.reset();
  std::vector<unique_fd> fds = std::move(client.inbox_fds);
  client.inbox_fds.clear();
  if (fds.size() != header().fd_count)
    return refuse(client, status::bad_request,
                  fmt::format("vmm-store: a request frame says {} descriptors and came with {}",
                              header().fd_count, fds.size()));
  serve(client, std::span(client.inbox).subspan(header_bytes, wanted - header_bytes), std::move(fds));
}

void server::serve(connection& client, std::span<const std::byte> payload, std::vector<unique_fd> fds) {
  request asked;
  try {
    asked = decode_request(payload);
  } catch (const unsupported_version_error& error) {
    return refuse(client, status::unsupported_version, error.what());
  } catch (const ipc::protocol_error& error) {
    return refuse(client, status::bad_request, error.what());
  }
  const bool offers = asked.op == operation::offer || asked.op == operation::offer_more;
  if (!fds.empty() && !offers)
    return refuse(
        client, status::bad_request,
        fmt::format("vmm-store: a {} request came with {} descriptors; only offer and offer_more carry any",
                    static_cast<unsigned>(asked.op), fds.size()));
  if (offers && fds.size() != asked.chunk_sizes.size())
    return refuse(client, status::bad_request,
                  fmt::format("vmm-store: an offer frame of {} chunks came with {} descriptors",
                              asked.chunk_sizes.size(), fds.size()));

  // Hold and release have no reply. An entry that existed and has ended is no error for
  // either: a client's local get (the version table said its entry was unchanged) can come
  // just before the entry's end, and its hold arrive after it. Then nothing is held, and
  // the release that follows finds nothing to drop.
  if (asked.op == operation::hold || asked.op == operation::release) {
    const bool held = client.holds.contains(asked.entry);
    const auto found = entries_.find(asked.entry);
    if (asked.op == operation::hold && found != entries_.end()) {
      ++client.holds[asked.entry];
      ++found->second->holders;
    } else if (asked.op == operation::release && held) {
      drop_hold(client, asked.entry);
    } else if (asked.entry == 0 || asked.entry >= next_entry_ || found != entries_.end()) {
      return refuse(
          client, status::bad_request,
          asked.op == operation::hold
              ? fmt::format("vmm-store: hold of entry {}, which never existed", asked.entry)
              : fmt::format("vmm-store: release of entry {}, which this client does not hold", asked.entry));
    }
    return;
  }

  std::vector<std::byte> reply;
  dispatch handler(*this, client);
  handler.fds = std::move(fds);
  bool ran = false;  // the request took effect
  try {
    const std::vector<std::byte> body = handler.run(asked);
    ran = true;
    reply = encode_ok(body);
  } catch (const refusal& refused) {
    reply = encode_error(refused.code, refused.message);
    handler.manifest = nullptr;
  } catch (const out_of_memory& error) {
    reply = encode_error(status::out_of_memory, error.what());
    handler.manifest = nullptr;
  } catch (const driver_unavailable& error) {
    reply = encode_error(status::unavailable, error.what());
    handler.manifest = nullptr;
  } catch (const invalid_argument& error) {
    reply = encode_error(status::invalid, error.what());
    handler.manifest = nullptr;
  } catch (const std::bad_alloc&) {
    // A request that took effect is never answered as refused: without memory for its reply,
    // its connection closes instead (turn()), and the client finds out what happened anew.
    if (ran) throw;
    reply =
        encode_error(status::out_of_memory, "vmm-store: the daemon ran out of host memory for this request");
    handler.manifest = nullptr;
  } catch (const std::exception& error) {
    reply = encode_error(status::internal, error.what());
    handler.manifest = nullptr;
  }
  const std::array<int, 1> table{handler.table_fd};
  send(client, reply, std::move(handler.manifest),
       handler.table_fd >= 0 ? std::span<const int>(table) : std::span<const int>());
}

void server::refuse(connection& client, status code, const std::string& why) {
  send(client, encode_error(code, why));
  client.closing = true;
}

void server::send(connection& client, std::span<const std::byte> reply,
                  std::shared_ptr<const ipc::exported_manifest> manifest, std::span<const int> reply_fds) {
  client.outbox.push_back(make_frame(reply, reply_fds));
  if (manifest) {
    std::vector<int> fds;
    for (const unique_fd& fd : manifest->fds) fds.push_back(fd.get());
    ipc::detail::for_each_manifest_message(manifest->bytes, fds, [&](auto payload, auto batch) {
      client.outbox.push_back(make_frame(payload, batch, manifest));
    });
  }
  client.deadline.emplace(options_.reply_timeout);
  flush(client);
}

void server::flush(connection& client) {
  while (!client.outbox.empty()) {
    outgoing_frame& frame = client.outbox.front();
    try {
      // The rest, when the socket would block, once the client reads (POLLOUT), before the deadline.
      if (!ipc::detail::send_some(client.socket.get(), frame.payload, frame.fds, frame.sent)) return;
    } catch (const os_error&) {
      return client.hang_up();
    }
    client.outbox.pop_front();
  }
  client.deadline.reset();
}

daemon_statistics server::statistics() const {
  daemon_statistics s;
  s.connections = connections_.size();
  s.entries = entries_.size();
  s.named_entries = names_.size();
  for (const auto& [id, client] : connections_)
    for (const auto& [entry_id, holds] : client->holds) s.holds += holds;
  s.bytes = bytes_;
  for (const auto& [id, e] : entries_) s.capacity += e->memory.capacity();
  for (const auto& [where, pool] : pools_) {
    const pool_statistics p = pool->statistics();
    s.pool_used += p.used_current;
    s.pool_reserved += p.reserved_current;
  }
  s.cached_exports = exporter_.statistics().cached_chunks;
  s.open_fds = detail::open_fd_count();
  return s;
}

}  // namespace vmm::store
