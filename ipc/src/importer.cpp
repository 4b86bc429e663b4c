#include <vmm/ipc/importer.hpp>

#include <vmm/ipc/fd_channel.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <exception>
#include <string>
#include <utility>

#include "deadline.hpp"

namespace vmm::ipc {
namespace {

// Runs a cleanup step that must not throw, reporting a failure instead.
template <class Fn>
void cleanup(const char* what, Fn&& fn) noexcept {
  try {
    std::forward<Fn>(fn)();
  } catch (const std::exception& error) {
    report_cleanup_failure(fmt::format("{}: {}", what, error.what()).c_str());
  } catch (...) {
    report_cleanup_failure(what);
  }
}

std::size_t first_batch(std::size_t fd_count) { return std::min(fd_count, max_fds_per_message); }

// Receives continuation message `index` of a manifest, carrying exactly `count` fds.
std::vector<unique_fd> receive_continuation(int socket_fd, std::uint32_t index, std::size_t count,
                                            const detail::deadline& until) {
  message continuation = detail::receive_message(socket_fd, std::nullopt, until);
  if (continuation.fds.size() != count)
    throw bad_manifest(fmt::format("manifest on socket {}: continuation {} carries {} fds instead of {}",
                                   socket_fd, index, continuation.fds.size(), count));
  const auto& payload = continuation.payload;
  if (payload.size() != 8)
    throw bad_manifest(fmt::format("manifest on socket {}: continuation {} has a payload of {} bytes, not 8",
                                   socket_fd, index, payload.size()));
  std::uint32_t magic = 0;
  std::uint32_t number = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    magic |= std::uint32_t{std::to_integer<std::uint8_t>(payload[i])} << (8 * i);
    number |= std::uint32_t{std::to_integer<std::uint8_t>(payload[4 + i])} << (8 * i);
  }
  if (magic != manifest_continuation_magic)
    throw bad_manifest(fmt::format("manifest on socket {}: continuation {} has bad magic {:#010x} (expected "
                                   "{:#010x})",
                                   socket_fd, index, magic, manifest_continuation_magic));
  if (number != index)
    throw bad_manifest(fmt::format("manifest on socket {}: continuation {} arrived where {} was due",
                                   socket_fd, number, index));
  return std::move(continuation.fds);
}

// The first message of a manifest: parsed, its fd count checked against the manifest's.
received_manifest receive_first(int socket_fd, const detail::deadline& until) {
  message first = detail::receive_message(socket_fd, std::nullopt, until);
  received_manifest result{parse_manifest(first.payload), std::move(first.fds)};
  const std::size_t expected = first_batch(result.description.fd_count());
  if (result.fds.size() != expected)
    throw bad_manifest(fmt::format(
        "manifest on socket {}: its message carries {} fds, but the manifest names {} posix-fd chunks "
        "({} of them travel with it)",
        socket_fd, result.fds.size(), result.description.fd_count(), expected));
  return result;
}

}  // namespace

received_manifest receive_manifest(int socket_fd, std::chrono::milliseconds timeout) {
  const detail::deadline until(timeout);
  received_manifest result = receive_first(socket_fd, until);
  const std::size_t total = result.description.fd_count();
  for (std::uint32_t index = 1; result.fds.size() < total; ++index) {
    std::vector<unique_fd> more =
        receive_continuation(socket_fd, index, std::min(total - result.fds.size(), max_fds_per_message), until);
    std::move(more.begin(), more.end(), std::back_inserter(result.fds));
  }
  return result;
}

// Hands out a manifest's fds one at a time, in chunk order: from a list, or from a socket,
// receiving each continuation message when the previous one is used up. An fd is owned by
// the caller once taken, so it is closed as soon as its handle is imported.
struct imported_buffer::fd_source {
  // Every fd is in `fds`.
  fd_source(std::vector<unique_fd> fds, std::size_t total)
      : fd_source(std::move(fds), total, -1, detail::deadline(no_timeout)) {}
  // The fds past `fds` arrive on `socket_fd`, in continuation messages due before `deadline`.
  fd_source(std::vector<unique_fd> fds, std::size_t total, int socket_fd, const detail::deadline& deadline)
      : batch(std::move(fds)), remaining(total), socket(socket_fd), until(deadline) {}

  unique_fd take() {
    if (remaining == 0) throw invalid_argument("imported_buffer: more posix-fd chunks than fds");
    if (used == batch.size()) {
      if (socket < 0) throw invalid_argument("imported_buffer: more posix-fd chunks than fds");
      batch = receive_continuation(socket, next_index++, std::min(remaining, max_fds_per_message), until);
      used = 0;
    }
    --remaining;
    return std::move(batch[used++]);
  }

  std::vector<unique_fd> batch;
  std::size_t used = 0;
  std::size_t remaining;   // fds still to hand out, this batch's included
  int socket;              // -1: every fd is in `batch`
  detail::deadline until;  // for the whole manifest, from its first message on
  std::uint32_t next_index = 1;
};

class imported_buffer::imported_chunk {
 public:
  imported_chunk(std::shared_ptr<memory_provider> provider, physical_handle handle, std::size_t size) noexcept
      : provider_(std::move(provider)), handle_(handle), size_(size) {}
  imported_chunk(imported_chunk&& other) noexcept
      : provider_(std::move(other.provider_)),
        handle_(std::exchange(other.handle_, 0)),
        size_(std::exchange(other.size_, 0)),
        address_(std::exchange(other.address_, 0)) {}
  imported_chunk& operator=(imported_chunk&& other) noexcept {
    if (this != &other) {
      reset();
      provider_ = std::move(other.provider_);
      handle_ = std::exchange(other.handle_, 0);
      size_ = std::exchange(other.size_, 0);
      address_ = std::exchange(other.address_, 0);
    }
    return *this;
  }
  imported_chunk(const imported_chunk&) = delete;
  imported_chunk& operator=(const imported_chunk&) = delete;
  ~imported_chunk() { reset(); }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  void map(std::uintptr_t address) {
    provider_->map(address, size_, handle_);
    address_ = address;
  }
  void reset() noexcept {
    if (address_ != 0) cleanup("imported_buffer: unmap", [&] { provider_->unmap(address_, size_); });
    if (provider_ != nullptr) cleanup("imported_buffer: release", [&] { provider_->release(handle_); });
    provider_.reset();
    address_ = 0;
  }

 private:
  std::shared_ptr<memory_provider> provider_;
  physical_handle handle_ = 0;
  std::size_t size_ = 0;
  std::uintptr_t address_ = 0;  // 0: not mapped
};

imported_buffer::imported_buffer() noexcept = default;

imported_buffer::imported_buffer(unmapped, const manifest& description, import_options options)
    : chosen_provider_(std::move(options.provider)),
      where_(description.where),
      buffer_id_(description.buffer_id),
      granularity_(description.granularity),
      base_offset_(description.base_offset),
      access_(options.access),
      stream_(options.stream) {
  validate(description);
  if (description.kind != manifest_kind::whole)
    throw bad_manifest("imported_buffer: a growth manifest cannot start an import (it extends one)");
  if (access_ != access_mode::read_only && access_ != access_mode::read_write)
    throw invalid_argument(fmt::format("imported_buffer: access {} asked for; import read-only or read-write",
                                       to_string(access_)));
}

// Once the delegated constructor has run, a throw from map_chunks runs the destructor, and
// the members free whatever was reserved.
imported_buffer::imported_buffer(const manifest& description, std::vector<unique_fd> fds,
                                 import_options options)
    : imported_buffer(unmapped{}, description, std::move(options)) {
  if (fds.size() != description.fd_count())
    throw invalid_argument(fmt::format("imported_buffer: {} fds for a manifest of {} posix-fd chunks",
                                       fds.size(), description.fd_count()));
  fd_source source(std::move(fds), description.fd_count());
  map_chunks(description, source);
  size_ = description.size;
}

imported_buffer imported_buffer::receive(int socket_fd, import_options options) {
  const detail::deadline until(options.timeout);
  received_manifest first = receive_first(socket_fd, until);
  fd_source source(std::move(first.fds), first.description.fd_count(), socket_fd, until);
  imported_buffer result(unmapped{}, first.description, std::move(options));
  result.map_chunks(first.description, source);
  result.size_ = first.description.size;
  return result;
}

imported_buffer::imported_buffer(imported_buffer&& other) noexcept
    : chosen_provider_(std::move(other.chosen_provider_)),
      range_(std::move(other.range_)),
      chunks_(std::move(other.chunks_)),
      where_(other.where_),
      buffer_id_(std::exchange(other.buffer_id_, 0)),
      granularity_(std::exchange(other.granularity_, 0)),
      base_offset_(std::exchange(other.base_offset_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      size_(std::exchange(other.size_, 0)),
      access_(std::exchange(other.access_, access_mode::none)),
      stream_(std::exchange(other.stream_, nullptr)) {}

imported_buffer& imported_buffer::operator=(imported_buffer&& other) noexcept {
  if (this != &other) {
    imported_buffer old(std::move(*this));  // torn down by old's destructor
    chosen_provider_ = std::move(other.chosen_provider_);
    range_ = std::move(other.range_);
    chunks_ = std::move(other.chunks_);
    where_ = other.where_;
    buffer_id_ = std::exchange(other.buffer_id_, 0);
    granularity_ = std::exchange(other.granularity_, 0);
    base_offset_ = std::exchange(other.base_offset_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    size_ = std::exchange(other.size_, 0);
    access_ = std::exchange(other.access_, access_mode::none);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

imported_buffer::~imported_buffer() {
  if (chunks_.empty()) return;
  // cuMemUnmap does not wait for kernels that still use the range.
  cleanup("imported_buffer: wait for the stream before unmapping",
          [&] { range_.provider()->synchronize(stream_); });
}

std::size_t imported_buffer::chunk_count() const noexcept { return chunks_.size(); }

std::shared_ptr<memory_provider> imported_buffer::provider_of(const location& where) const {
  std::shared_ptr<memory_provider> provider = chosen_provider_;
  if (provider == nullptr) {
    provider = provider_for(where);
  } else if (provider->where() != where) {
    throw invalid_argument(fmt::format("imported_buffer: the manifest names {} memory, the provider given "
                                       "serves {} memory",
                                       to_string(where), to_string(provider->where())));
  }
  if (provider->granularity() != granularity_)
    throw invalid_argument(fmt::format("imported_buffer: the exporter's granularity is {}, but {} memory "
                                       "here has {}",
                                       granularity_, to_string(where), provider->granularity()));
  return provider;
}

void imported_buffer::map_chunks(const manifest& description, fd_source& fds) {
  if (access_ == access_mode::read_write && description.grant == access_mode::read_only)
    throw invalid_argument("imported_buffer: read-write access asked for, but the exporter granted "
                           "read-only access");
  // Import every handle first: a bad fd or size fails before anything is reserved or mapped.
  std::vector<imported_chunk> fresh;
  fresh.reserve(description.chunks.size());
  std::vector<access_grant> grants;
  for (const manifest_chunk& chunk : description.chunks) {
    std::shared_ptr<memory_provider> provider = provider_of(chunk.where);
    physical_handle handle = 0;
    if (chunk.handle == handle_kind::posix_fd) {
      const unique_fd fd = fds.take();  // closed once imported
      handle = provider->import_fd(fd.get(), chunk.size);
    } else {
      handle = provider->import_fabric(chunk.fabric, chunk.size);
    }
    for (const location& accessor : provider->default_accessors())
      if (std::none_of(grants.begin(), grants.end(), [&](const access_grant& g) { return g.accessor == accessor; }))
        grants.push_back({accessor, access_});
    fresh.emplace_back(std::move(provider), handle, chunk.size);
  }
  if (fds.remaining != 0)
    throw invalid_argument(fmt::format("imported_buffer: {} fds left over after the manifest's chunks",
                                       fds.remaining));
  if (!range_.provider()) range_ = address_range(provider_of(description.where), description.max_size);
  if (fresh.empty()) return;
  for (std::size_t i = 0; i < fresh.size(); ++i)
    fresh[i].map(range_.get() + description.chunks[i].offset);
  const std::size_t added = description.end - description.start;
  range_.provider()->set_access(range_.get() + description.start, added, grants);
  chunks_.reserve(chunks_.size() + fresh.size());
  for (imported_chunk& chunk : fresh) chunks_.push_back(std::move(chunk));
  mapped_ = description.end;
}

void imported_buffer::check_growth(const manifest& tail) const {
  validate(tail);
  if (!range_.provider()) throw invalid_argument("imported_buffer: growth of an empty import");
  if (tail.kind != manifest_kind::growth)
    throw bad_manifest("imported_buffer: a whole manifest cannot extend an import");
  if (tail.buffer_id != buffer_id_ || tail.where != where_ || tail.granularity != granularity_ ||
      tail.max_size != range_.size() || tail.base_offset != base_offset_)
    throw bad_manifest(fmt::format(
        "imported_buffer: the growth manifest is for another buffer (id {:#x}, {}, granularity {}, "
        "max size {}, base offset {}; this import: id {:#x}, {}, {}, {}, {})",
        tail.buffer_id, to_string(tail.where), tail.granularity, tail.max_size, tail.base_offset,
        buffer_id_, to_string(where_), granularity_, range_.size(), base_offset_));
  if (tail.start != mapped_)
    throw bad_manifest(fmt::format("imported_buffer: the growth manifest starts at {}, but this import "
                                   "maps {} bytes",
                                   tail.start, mapped_));
}

void imported_buffer::grow(const manifest& tail, std::vector<unique_fd> fds) {
  check_growth(tail);
  if (fds.size() != tail.fd_count())
    throw invalid_argument(fmt::format("imported_buffer: {} fds for a growth manifest of {} posix-fd chunks",
                                       fds.size(), tail.fd_count()));
  fd_source source(std::move(fds), tail.fd_count());
  map_chunks(tail, source);
  size_ = tail.size;
}

void imported_buffer::receive_growth(int socket_fd, std::chrono::milliseconds timeout) {
  const detail::deadline until(timeout);
  received_manifest first = receive_first(socket_fd, until);
  fd_source source(std::move(first.fds), first.description.fd_count(), socket_fd, until);
  check_growth(first.description);
  map_chunks(first.description, source);
  size_ = first.description.size;
}

}  // namespace vmm::ipc
