#include <vmm/store/client.hpp>

#include <vmm/error.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/physical_allocation.hpp>
#include <vmm/unique_fd.hpp>

#include "version_table.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <mutex>
#include <thread>
#include <utility>

namespace vmm::store {
namespace detail {

struct cached_import {
  std::string name;
  std::uint64_t entry = 0;
  ipc::imported_buffer mapped;
  std::size_t size = 0;                  // as of the last reply
  std::uint64_t last_used = 0;           // for eviction
  std::uint32_t slot = no_version_slot;  // the entry's word in the version table
  std::uint64_t version = 0;             // that word as of the last reply
  bool uncached = false;                 // never in the cache: a mapping of one handle's own (get_options)
  bool sealed = false;                   // as of the last reply
  std::uint64_t table_bytes = 0;         // a tensor set's table, last in its size (0: none known)
};

struct client_state {
  client_options options;
  std::mutex mutex;
  unique_fd socket;
  daemon_info daemon;
  version_table versions;  // the daemon's, read-only; empty when it offers none
  std::map<std::pair<std::string, access_mode>, std::shared_ptr<cached_import>> cache;
  // The imports kept out of the cache (own mappings, private overlays): reconnect() must
  // take their holds again or forget their entries too, and never offers them.
  std::vector<std::weak_ptr<cached_import>> uncached;
  std::uint64_t clock = 0;
  // reoffer_after_restart: a byte here whenever connect() made a new socket.
  unique_fd changed_read, changed_write;

  [[noreturn]] void gone(const std::string& what) {
    socket.reset();
    throw store_error(store_error::daemon_gone,
                      fmt::format("vmm-store: the daemon at {} is gone ({})", options.socket_path, what));
  }

  void check_open() {
    if (!socket)
      throw store_error(
          store_error::daemon_gone,
          fmt::format("vmm-store: not connected to the daemon at {} (it went away)", options.socket_path));
  }

  // Sends a request and returns the ok body; throws the daemon's refusal. A daemon that
  // refused the connection has closed it: its reply may still be read after a failed send.
  // The reply's descriptors go to `fds` when given; a reply with any is refused otherwise.
  std::vector<std::byte> exchange(const request& asked, std::vector<unique_fd>* fds = nullptr,
                                  std::span<const int> sent_fds = {}) {
    check_open();
    const std::vector<std::byte> bytes = encode(asked);
    bool sent = true;
    std::string send_failure;
    try {
      ipc::send_message(socket.get(), bytes, sent_fds, options.timeout);
    } catch (const os_error& error) {
      sent = false;
      send_failure = error.what();
    }
    ipc::message got;
    try {
      got = ipc::receive_message(socket.get(), fds != nullptr ? std::nullopt : std::optional<std::size_t>(0),
                                 sent ? options.timeout : std::chrono::milliseconds(0));
    } catch (const ipc::protocol_error&) {
      socket.reset();
      throw;
    } catch (const os_error& error) {
      gone(sent ? error.what() : send_failure);
    }
    reply answer;
    try {
      answer = decode_reply(got.payload);
    } catch (...) {
      socket.reset();
      throw;
    }
    if (answer.code != status::ok) {
      if (answer.code == status::bad_request || answer.code == status::unsupported_version ||
          (answer.code == status::denied && asked.op == operation::hello))
        socket.reset();  // the daemon closes these connections
      throw store_error(static_cast<int>(answer.code), answer.message);
    }
    if (fds != nullptr) *fds = std::move(got.fds);
    return std::move(answer.body);
  }

  // Sends a request that has no reply.
  void tell(const request& asked) {
    try {
      ipc::send_message(socket.get(), encode(asked), {}, options.timeout);
    } catch (const os_error& error) {
      gone(error.what());
    }
  }

  // Receives what a hold reply announces into the cache entry for (name, access).
  // A whole import made uncached stays out of the cache.
  std::shared_ptr<cached_import> take_delivery(const std::string& name, access_mode access,
                                               const hold_reply& got, std::shared_ptr<cached_import> cached,
                                               bool uncached = false) {
    try {
      if (got.sent == delivery::whole) {
        auto fresh = std::make_shared<cached_import>();
        if (uncached) keep_uncached(fresh);
        fresh->uncached = uncached;
        fresh->name = name;
        fresh->entry = got.entry;
        // What reconnect() may offer keeps its descriptors: the driver cannot export them.
        const bool offerable = options.keep_descriptors && access == access_mode::read_only && !uncached;
        fresh->mapped = ipc::imported_buffer::receive(
            socket.get(), {.access = access, .timeout = options.timeout, .keep_descriptors = offerable});
        cached = std::move(fresh);
      } else {
        if (!cached || cached->entry != got.entry)
          throw ipc::protocol_error(
              fmt::format("vmm-store: the daemon sent growth of entry {}, which this client "
                          "does not map",
                          got.entry));
        if (got.sent == delivery::growth) cached->mapped.receive_growth(socket.get(), options.timeout);
      }
    } catch (const os_error& error) {
      gone(error.what());
    } catch (...) {
      socket.reset();  // the stream may stand inside a manifest
      throw;
    }
    cached->size = got.size;
    cached->sealed = got.sealed;
    cached->slot = got.slot;
    cached->version = got.version;
    cached->last_used = ++clock;
    if (!cached->uncached) cache[{name, access}] = cached;
    evict();
    return cached;
  }

  // Adds `import` to `uncached`, first dropping the entries whose imports are gone.
  void keep_uncached(const std::shared_ptr<cached_import>& import) {
    std::erase_if(this->uncached, [](const std::weak_ptr<cached_import>& i) { return i.expired(); });
    this->uncached.push_back(import);
  }

  // Drops the least recently used imports that no handle holds, beyond options.cached_imports.
  void evict() {
    std::size_t unheld = 0;
    for (const auto& [key, import] : cache) unheld += import.use_count() == 1 ? 1 : 0;
    while (unheld > options.cached_imports) {
      auto oldest = cache.end();
      for (auto it = cache.begin(); it != cache.end(); ++it)
        if (it->second.use_count() == 1 &&
            (oldest == cache.end() || it->second->last_used < oldest->second->last_used))
          oldest = it;
      cache.erase(oldest);
      --unheld;
    }
  }

  void release(const cached_import& import) noexcept {
    std::lock_guard lock(mutex);
    const std::uint64_t entry = import.entry;  // read under the lock: reconnect() changes it
    if (!socket || entry == 0) return;         // the daemon is gone, and the hold with it
    try {
      tell(request{.op = operation::release, .entry = entry});
    } catch (const std::exception&) {
      // The daemon is gone (tell() closed the socket), and the hold with it.
    }
    evict();
  }

  // Connects to the socket and says hello.
  void connect() {
    try {
      socket = ipc::connect_unix(options.socket_path);
    } catch (const os_error& error) {
      throw store_error(store_error::daemon_gone,
                        fmt::format("vmm-store: no daemon at {}: {}", options.socket_path, error.what()));
    }
    std::vector<unique_fd> fds;
    daemon = decode_daemon_info(exchange(request{.op = operation::hello}, &fds));
    if (fds.size() != (daemon.version_slots != 0 ? 1u : 0u))
      throw ipc::protocol_error(
          fmt::format("vmm-store: hello's reply carries {} descriptors for a version table "
                      "of {} slots",
                      fds.size(), daemon.version_slots));
    versions =
        fds.empty() ? version_table() : version_table::open(std::move(fds.front()), daemon.version_slots);
    if (changed_write) {
      const char byte = 1;  // the watcher of reoffer_after_restart watches this socket now
      [[maybe_unused]] const auto ignored = ::write(changed_write.get(), &byte, 1);
    }
  }

  // client::reconnect().
  std::vector<std::string> reconnect() {
    std::lock_guard lock(mutex);
    const std::uint64_t origin = daemon.instance;
    socket.reset();
    connect();
    std::vector<std::string> refused;
    if (daemon.instance == origin) {
      // The same daemon: this connection's holds went with the old one; take them again.
      for (const auto& [key, import] : cache)
        for (long i = 1; i < import.use_count(); ++i)
          tell(request{.op = operation::hold, .entry = import->entry});
      for (const std::weak_ptr<cached_import>& weak : this->uncached)
        if (const std::shared_ptr<cached_import> import = weak.lock(); import && import->entry != 0)
          for (long i = 1; i < import.use_count(); ++i)
            tell(request{.op = operation::hold, .entry = import->entry});
      return refused;
    }
    // A new daemon. What is out of the cache is not offered (a private overlay holds this
    // process's own bytes): its handles map it still and release nothing.
    for (const std::weak_ptr<cached_import>& weak : this->uncached)
      if (const std::shared_ptr<cached_import> import = weak.lock()) {
        import->entry = 0;
        import->slot = no_version_slot;
      }
    this->uncached.clear();
    // A new daemon: what was sealed is offered back; the rest is no entry any more.
    for (auto it = cache.begin(); it != cache.end();) {
      detail::cached_import& import = *it->second;
      bool kept = false;
      if (import.sealed && it->first.second == access_mode::read_only) {
        try {
          offer(import, origin);
          kept = true;
          for (long i = 1; i < it->second.use_count(); ++i)
            tell(request{.op = operation::hold, .entry = import.entry});
        } catch (const store_error& error) {
          if (error.code() == store_error::daemon_gone) throw;
          refused.push_back(fmt::format("{}: {}", import.name, error.what()));
        } catch (const driver_error& error) {
          refused.push_back(fmt::format("{}: cannot be offered: {}", import.name, error.what()));
        } catch (const os_error& error) {
          refused.push_back(fmt::format("{}: cannot be offered: {}", import.name, error.what()));
        }
      }
      if (kept) {
        ++it;
        continue;
      }
      import.entry = 0;  // its handles map it still and release nothing
      import.slot = no_version_slot;
      it = cache.erase(it);
    }
    return refused;
  }

  // Offers `import` (sealed, read-only) to the daemon, which came from daemon instance
  // `origin`; takes a hold for each of its handles. The daemon's answer, or its refusal.
  void offer(cached_import& import, std::uint64_t origin) {
    const std::vector<shared_chunk>& chunks = import.mapped.chunks();
    request first{.op = operation::offer,
                  .name = import.name,
                  .where = import.mapped.provider()->capabilities().where,
                  .size = import.size,
                  .entry = import.entry,
                  .generation = import.mapped.buffer_id(),
                  .table_offset = import.size - import.table_bytes,
                  .table_bytes = import.table_bytes,
                  .tensor_set = import.table_bytes != 0,
                  .origin = origin,
                  .chunk_total = static_cast<std::uint32_t>(chunks.size())};
    // Every descriptor before the first frame: an export that fails sends nothing, so the
    // connection never stands inside an offer. The import kept its descriptors
    // (client_options::keep_descriptors), which export_fd() duplicates: a GPU's driver
    // refuses to export a handle this process imported. Without them such memory cannot be
    // offered, and reconnect() says so.
    std::vector<unique_fd> owned;
    owned.reserve(chunks.size());
    for (const shared_chunk& chunk : chunks) owned.push_back(chunk->memory().export_fd());
    std::vector<std::byte> body;
    for (std::size_t at = 0; at < chunks.size(); at += max_offer_chunks) {
      request frame = at == 0 ? first : request{.op = operation::offer_more};
      std::vector<int> fds;
      for (std::size_t i = at; i < std::min(chunks.size(), at + max_offer_chunks); ++i) {
        frame.chunk_sizes.push_back(chunks[i]->size());
        fds.push_back(owned[i].get());
      }
      body = exchange(frame, nullptr, fds);
      if (!body.empty()) break;  // complete (or offered already by another client)
    }
    const hold_reply got = decode_hold_reply(body);
    import.entry = got.entry;
    import.slot = got.slot;
    import.version = got.version;
  }
};

// The thread of client_options::reoffer_after_restart. It watches a duplicate of the
// client's socket (so that a socket the client closes meanwhile is no other descriptor) for
// the daemon's hang-up, and the client's pipe for a new socket; after a hang-up it watches
// the socket's directory with inotify and reconnects at each socket made there until one
// answers. The daemon sends nothing unasked: only its hang-up wakes the poll (POLLRDHUP).
class restart_watcher {
 public:
  explicit restart_watcher(std::shared_ptr<client_state> state) : state_(std::move(state)) {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC | O_NONBLOCK) != 0) throw os_error(errno, "vmm-store: pipe2 (stop)");
    stop_read_ = unique_fd(ends[0]);
    stop_write_ = unique_fd(ends[1]);
    if (::pipe2(ends, O_CLOEXEC | O_NONBLOCK) != 0)
      throw os_error(errno, "vmm-store: pipe2 (socket changed)");
    state_->changed_read = unique_fd(ends[0]);
    state_->changed_write = unique_fd(ends[1]);
    const std::string& path = state_->options.socket_path;
    const auto slash = path.rfind('/');
    const std::string directory = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    watch_ = unique_fd(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
    if (!watch_ ||
        ::inotify_add_watch(watch_.get(), directory.c_str(), IN_CREATE | IN_MOVED_TO | IN_ATTRIB) < 0)
      throw os_error(errno, fmt::format("vmm-store: inotify on {}", directory));
    thread_ = std::thread([this] { run(); });
  }
  restart_watcher(const restart_watcher&) = delete;
  restart_watcher& operator=(const restart_watcher&) = delete;
  ~restart_watcher() {
    const char byte = 1;
    [[maybe_unused]] const auto ignored = ::write(stop_write_.get(), &byte, 1);
    thread_.join();
    std::lock_guard lock(state_->mutex);
    state_->changed_write.reset();
    state_->changed_read.reset();
  }

 private:
  static void drain(int fd) noexcept {
    char bytes[256];
    while (::read(fd, bytes, sizeof bytes) > 0) {}
  }

  // Waits until the watched socket hangs up (true) or the watcher stops (false).
  bool wait_for_hang_up() {
    for (;;) {
      unique_fd watched;
      {
        std::lock_guard lock(state_->mutex);
        if (!state_->socket) return true;  // a request found the daemon gone already
        watched = unique_fd(::fcntl(state_->socket.get(), F_DUPFD_CLOEXEC, 0));
      }
      if (!watched) return true;
      pollfd polled[] = {{watched.get(), POLLRDHUP, 0},
                         {stop_read_.get(), POLLIN, 0},
                         {state_->changed_read.get(), POLLIN, 0}};
      while (::poll(polled, 3, -1) < 0)
        if (errno != EINTR) return false;
      if (polled[1].revents != 0) return false;
      if (polled[2].revents != 0) {
        drain(state_->changed_read.get());  // a new socket: watch that one
        continue;
      }
      return true;
    }
  }

  void run() noexcept {
    while (wait_for_hang_up()) {
      drain(watch_.get());  // events before the hang-up name no new daemon
      for (;;) {
        try {
          const std::vector<std::string> refused = state_->reconnect();
          if (state_->options.on_reconnect) state_->options.on_reconnect(refused);
          break;
        } catch (const std::exception&) {
          // No daemon answers yet: wait for the next socket file, or its mode, to change.
        }
        pollfd polled[] = {{watch_.get(), POLLIN, 0}, {stop_read_.get(), POLLIN, 0}};
        while (::poll(polled, 2, -1) < 0)
          if (errno != EINTR) return;
        if (polled[1].revents != 0) return;
        drain(watch_.get());
      }
    }
  }

  std::shared_ptr<client_state> state_;
  unique_fd stop_read_, stop_write_, watch_;
  std::thread thread_;
};

}  // namespace detail

std::string default_socket_path() {
  if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime != nullptr && runtime[0] == '/')
    return fmt::format("{}/vmm-store/socket", runtime);
  return fmt::format("/tmp/vmm-store-{}/socket", ::getuid());
}

void prepare_socket_directory(const std::string& socket_path) {
  const auto slash = socket_path.rfind('/');
  if (slash == std::string::npos || slash == 0) return;
  const std::string directory = socket_path.substr(0, slash);
  if (::mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST)
    throw os_error(errno, fmt::format("vmm-store: mkdir {}", directory));
  struct stat status {};
  if (::lstat(directory.c_str(), &status) != 0)
    throw os_error(errno, fmt::format("vmm-store: lstat {}", directory));
  if (!S_ISDIR(status.st_mode) || status.st_uid != ::getuid() || (status.st_mode & 0777) != 0700)
    throw invalid_argument(
        fmt::format("vmm-store: {} must be a directory of uid {} with mode 0700 (it has uid {}, "
                    "mode {:o})",
                    directory, ::getuid(), status.st_uid, status.st_mode & 0777));
}

// ---- buffer ------------------------------------------------------------------------------

buffer::buffer() noexcept = default;
buffer::buffer(buffer&&) noexcept = default;
buffer& buffer::operator=(buffer&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    import_ = std::move(other.import_);
  }
  return *this;
}
buffer::~buffer() {
  release();
}

void buffer::release() noexcept {
  if (!import_) return;
  const std::shared_ptr<detail::cached_import> import = std::move(import_);
  state_->release(*import);
  state_.reset();
}

void* buffer::data() const noexcept {
  return import_ ? import_->mapped.data() : nullptr;
}
std::size_t buffer::size() const noexcept {
  return import_ ? import_->size : 0;
}
std::size_t buffer::capacity() const noexcept {
  return import_ ? import_->mapped.capacity() : 0;
}
std::size_t buffer::max_size() const noexcept {
  return import_ ? import_->mapped.max_size() : 0;
}
access_mode buffer::access() const noexcept {
  return import_ ? import_->mapped.access() : access_mode::none;
}
const std::string& buffer::name() const noexcept {
  static const std::string none;
  return import_ ? import_->name : none;
}
location buffer::where() const noexcept {
  return import_ && import_->mapped.provider() ? import_->mapped.provider()->capabilities().where
                                               : location{};
}
std::uint64_t buffer::entry() const noexcept {
  return import_ ? import_->entry : 0;
}
std::size_t buffer::chunk_count() const noexcept {
  return import_ ? import_->mapped.chunk_count() : 0;
}
std::vector<std::size_t> buffer::chunk_sizes() const {
  std::vector<std::size_t> sizes;
  if (import_)
    for (const shared_chunk& chunk : import_->mapped.chunks()) sizes.push_back(chunk->size());
  return sizes;
}
const std::shared_ptr<memory_provider>& buffer::provider() const noexcept {
  static const std::shared_ptr<memory_provider> none;
  return import_ ? import_->mapped.provider() : none;
}

std::size_t buffer::make_private(std::size_t offset, std::size_t bytes, stream_ref stream) {
  const ipc::byte_span span{offset, bytes};
  return make_private({&span, 1}, stream);
}

std::size_t buffer::make_private(std::span<const ipc::byte_span> spans, stream_ref stream) {
  if (!import_) throw invalid_argument("vmm::store::buffer::make_private on an empty handle");
  std::lock_guard lock(state_->mutex);
  const access_mode access = import_->mapped.access();
  if (access != access_mode::read_only)
    throw invalid_argument(fmt::format(
        "vmm-store: \"{}\" is held writable here: make_private is for read-only holds", import_->name));
  const auto found = state_->cache.find({import_->name, access});
  const bool cached = found != state_->cache.end() && found->second == import_;
  const long others = import_.use_count() - 1 - (cached ? 1 : 0);
  if (others > 0)
    throw invalid_argument(
        fmt::format("vmm-store: {} other handle(s) of this process map \"{}\" at the same addresses, which a "
                    "private overlay would change for them too: get it with get_options::own_mapping",
                    others, import_->name));
  // Room for it among the uncached imports first: nothing may fail once it is private.
  std::erase_if(state_->uncached, [](const std::weak_ptr<detail::cached_import>& i) { return i.expired(); });
  if (!import_->uncached) state_->uncached.reserve(state_->uncached.size() + 1);
  const std::size_t made = import_->mapped.make_private(spans, stream);
  if (import_->mapped.private_bytes() != 0 && !import_->uncached) {
    // Private now: no later get of this process may find it. Erasing allocates nothing, nor
    // does a push_back into reserved room.
    import_->uncached = true;
    state_->uncached.push_back(import_);
    if (cached) state_->cache.erase(found);
  }
  return made;
}

bool buffer::is_private(std::size_t offset, std::size_t bytes) const {
  if (!import_) throw invalid_argument("vmm::store::buffer::is_private on an empty handle");
  return import_->mapped.is_private(offset, bytes);
}

std::size_t buffer::private_bytes() const noexcept {
  return import_ ? import_->mapped.private_bytes() : 0;
}

void buffer::refresh() {
  if (!import_) throw invalid_argument("vmm::store::buffer::refresh on an empty handle");
  std::lock_guard lock(state_->mutex);
  const hold_reply got = decode_hold_reply(state_->exchange(request{.op = operation::refresh,
                                                                    .entry = import_->entry,
                                                                    .generation = import_->mapped.buffer_id(),
                                                                    .end = import_->mapped.capacity()}));
  if (got.sent == delivery::whole) {
    state_->socket.reset();
    throw ipc::protocol_error("vmm-store: the daemon answered a refresh with a whole manifest");
  }
  state_->take_delivery(import_->name, import_->mapped.access(), got, import_);
}

// ---- client ------------------------------------------------------------------------------

client::client(client_options options) : state_(std::make_shared<detail::client_state>()) {
  state_->options = std::move(options);
  state_->connect();
  if (state_->options.reoffer_after_restart) watcher_ = std::make_unique<detail::restart_watcher>(state_);
}

std::vector<std::string> client::reconnect() {
  return state_->reconnect();
}

client::~client() = default;
client::client(client&&) noexcept = default;
client& client::operator=(client&&) noexcept = default;

const daemon_info& client::daemon() const noexcept {
  return state_->daemon;
}

buffer client::create(std::string_view name, std::size_t size, location where, create_options options) {
  std::lock_guard lock(state_->mutex);
  request asked{.op = operation::create,
                .name = std::string(name),
                .where = where,
                .size = size,
                .max_size = options.max_size,
                .one_chunk = options.one_chunk};
  const hold_reply got = decode_hold_reply(state_->exchange(asked));
  if (got.sent != delivery::whole) {
    state_->socket.reset();
    throw ipc::protocol_error("vmm-store: the daemon answered a create without a whole manifest");
  }
  buffer made;
  made.import_ = state_->take_delivery(asked.name, access_mode::read_write, got, nullptr);
  made.state_ = state_;
  return made;
}

buffer client::get(std::string_view name, access_mode access, get_options options) {
  std::lock_guard lock(state_->mutex);
  request asked{.op = operation::get, .name = std::string(name), .access = access};
  std::shared_ptr<detail::cached_import> cached;
  const auto found = state_->cache.find({asked.name, access});
  // Held by a handle (besides the cache): not a mapping of its own; a whole import instead.
  const bool shared = options.own_mapping && found != state_->cache.end() && found->second.use_count() > 1;
  if (found != state_->cache.end() && !shared) {
    cached = found->second;
    if (cached->slot != no_version_slot && state_->versions.read(cached->slot) == cached->version) {
      // Unchanged since the daemon last said: the same entry under this name, the same
      // size, still writable if it was. Take the hold without waiting for a reply.
      state_->check_open();
      state_->tell(request{.op = operation::hold, .entry = cached->entry});
      cached->last_used = ++state_->clock;
      buffer made;
      made.import_ = std::move(cached);
      made.state_ = state_;
      return made;
    }
    asked.entry = cached->entry;
    asked.generation = cached->mapped.buffer_id();
    asked.end = cached->mapped.capacity();
  }
  std::vector<std::byte> body;
  try {
    body = state_->exchange(asked);
  } catch (const store_error& error) {
    if (error.is(status::not_found)) state_->cache.erase({asked.name, access});
    throw;
  }
  const hold_reply got = decode_hold_reply(body);
  buffer made;
  made.import_ =
      state_->take_delivery(asked.name, access, got, got.sent == delivery::whole ? nullptr : cached, shared);
  made.state_ = state_;
  return made;
}

buffer_info client::grow(std::string_view name, std::size_t size) {
  std::lock_guard lock(state_->mutex);
  return decode_buffer_info(
      state_->exchange(request{.op = operation::grow, .name = std::string(name), .size = size}));
}

void client::seal(std::string_view name, seal_options options) {
  std::lock_guard lock(state_->mutex);
  (void)state_->exchange(
      request{.op = operation::seal, .name = std::string(name), .deduplicate = options.deduplicate});
  state_->cache.erase({std::string(name), access_mode::read_write});
}

void client::seal_set(std::string_view name, std::uint64_t table_offset, std::uint64_t table_bytes,
                      seal_options options) {
  std::lock_guard lock(state_->mutex);
  (void)state_->exchange(request{.op = operation::seal_set,
                                 .name = std::string(name),
                                 .table_offset = table_offset,
                                 .table_bytes = table_bytes,
                                 .deduplicate = options.deduplicate});
  state_->cache.erase({std::string(name), access_mode::read_write});
}

std::vector<tensor_info> client::tensors(const buffer& held) {
  if (held.data() == nullptr) throw invalid_argument("vmm::store::client::tensors of an empty handle");
  std::lock_guard lock(state_->mutex);
  const std::vector<std::byte> table =
      state_->exchange(request{.op = operation::tensors, .entry = held.entry()});
  std::vector<tensor_info> decoded = decode_tensor_table(table, held.size());
  held.import_->table_bytes = table.size();  // what an offer after a restart names
  return decoded;
}

void client::grant(std::string_view name, pid_t pid) {
  std::lock_guard lock(state_->mutex);
  (void)state_->exchange(
      request{.op = operation::grant, .name = std::string(name), .pid = static_cast<std::uint32_t>(pid)});
}

std::vector<buffer_info> client::list() {
  std::lock_guard lock(state_->mutex);
  return decode_buffer_infos(state_->exchange(request{.op = operation::list}));
}

buffer_info client::stat(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  return decode_buffer_info(state_->exchange(request{.op = operation::stat, .name = std::string(name)}));
}

void client::remove(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  (void)state_->exchange(request{.op = operation::remove, .name = std::string(name)});
  state_->cache.erase({std::string(name), access_mode::read_only});
  state_->cache.erase({std::string(name), access_mode::read_write});
}

daemon_statistics client::statistics() {
  std::lock_guard lock(state_->mutex);
  return decode_daemon_statistics(state_->exchange(request{.op = operation::statistics}));
}

void client::drop_cache() {
  std::lock_guard lock(state_->mutex);
  std::erase_if(state_->cache, [](const auto& entry) { return entry.second.use_count() == 1; });
}

}  // namespace vmm::store
