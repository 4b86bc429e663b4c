#include <vmm/ipc/importer.hpp>

#include <vmm/detail/cleanup.hpp>
#include <vmm/error.hpp>
#include <vmm/ipc/fd_channel.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "vmm/ipc/detail/continuation.hpp"
#include "vmm/ipc/detail/fd_channel.hpp"

namespace vmm::ipc {
namespace {

std::size_t first_batch(std::size_t fd_count) {
  return std::min(fd_count, max_fds_per_message);
}

// Receives continuation message `index` of a manifest, carrying exactly `count` fds.
std::vector<unique_fd> receive_continuation(int socket_fd, std::uint32_t index, std::size_t count,
                                            const detail::deadline& until) {
  message continuation = detail::receive_message(socket_fd, std::nullopt, until);
  if (continuation.fds.size() != count)
    throw bad_manifest(fmt::format("manifest on socket {}: continuation {} carries {} fds instead of {}",
                                   socket_fd, index, continuation.fds.size(), count));
  detail::check_continuation(continuation.payload, index);
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
    std::vector<unique_fd> more = receive_continuation(
        socket_fd, index, std::min(total - result.fds.size(), max_fds_per_message), until);
    std::move(more.begin(), more.end(), std::back_inserter(result.fds));
  }
  return result;
}

// Hands out a manifest's fds one at a time, in chunk order: from a list, or from a socket,
// receiving each continuation message when the previous one is used up. An fd is owned by
// the caller once taken, so it is closed as soon as its handle is imported.
struct imported_buffer::fd_source {
  // Every fd is in `fds`: exactly one per posix-fd chunk of `description`.
  static fd_source from_list(std::vector<unique_fd> fds, const manifest& description) {
    if (fds.size() != description.fd_count())
      throw invalid_argument(
          fmt::format("imported_buffer: {} fds for a {} of {} posix-fd chunks", fds.size(),
                      description.kind == manifest_kind::growth ? "growth manifest" : "manifest",
                      description.fd_count()));
    return fd_source(std::move(fds), description.fd_count(), -1, detail::deadline(no_timeout));
  }
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

imported_buffer::imported_buffer() noexcept = default;

imported_buffer::imported_buffer(unmapped, const manifest& description, import_options options)
    : chosen_provider_(std::move(options.provider)),
      where_(description.where),
      buffer_id_(description.buffer_id),
      granularity_(description.granularity),
      base_offset_(description.base_offset),
      max_size_limit_(options.max_size_limit),
      access_(options.access),
      keep_descriptors_(options.keep_descriptors),
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
  fd_source source = fd_source::from_list(std::move(fds), description);
  map_chunks(description, source);
}

imported_buffer imported_buffer::receive(int socket_fd, import_options options) {
  const detail::deadline until(options.timeout);
  received_manifest first = receive_first(socket_fd, until);
  fd_source source(std::move(first.fds), first.description.fd_count(), socket_fd, until);
  imported_buffer result(unmapped{}, first.description, std::move(options));
  result.map_chunks(first.description, source);
  return result;
}

imported_buffer::imported_buffer(imported_buffer&& other) noexcept
    : chosen_provider_(std::move(other.chosen_provider_)),
      run_(std::move(other.run_)),
      where_(other.where_),
      buffer_id_(std::exchange(other.buffer_id_, 0)),
      granularity_(std::exchange(other.granularity_, 0)),
      base_offset_(std::exchange(other.base_offset_, 0)),
      max_size_limit_(std::exchange(other.max_size_limit_, 0)),
      size_(std::exchange(other.size_, 0)),
      access_(std::exchange(other.access_, access_mode::none)),
      keep_descriptors_(std::exchange(other.keep_descriptors_, false)),
      stream_(std::exchange(other.stream_, stream_ref())),
      private_chunks_(std::exchange(other.private_chunks_, {})) {}

imported_buffer& imported_buffer::operator=(imported_buffer&& other) noexcept {
  if (this != &other) {
    imported_buffer old(std::move(*this));  // retired by old's destructor
    chosen_provider_ = std::move(other.chosen_provider_);
    run_ = std::move(other.run_);
    where_ = other.where_;
    buffer_id_ = std::exchange(other.buffer_id_, 0);
    granularity_ = std::exchange(other.granularity_, 0);
    base_offset_ = std::exchange(other.base_offset_, 0);
    max_size_limit_ = std::exchange(other.max_size_limit_, 0);
    size_ = std::exchange(other.size_, 0);
    access_ = std::exchange(other.access_, access_mode::none);
    keep_descriptors_ = std::exchange(other.keep_descriptors_, false);
    stream_ = std::exchange(other.stream_, stream_ref());
    private_chunks_ = std::exchange(other.private_chunks_, {});
  }
  return *this;
}

imported_buffer::~imported_buffer() {
  if (run_.data() == nullptr) return;
  // Work queued on the stream may still use the memory: unmapped once it has passed.
  const stream_use use{&run_.provider()->executor(), stream_};
  std::move(run_).retire_after({&use, 1});
}

std::shared_ptr<memory_provider> imported_buffer::provider_of(const location& where) const {
  std::shared_ptr<memory_provider> provider = chosen_provider_;
  if (provider == nullptr) {
    provider = provider_for(where);
  } else if (provider->capabilities().where != where) {
    throw invalid_argument(
        fmt::format("imported_buffer: the manifest names {} memory, the provider given "
                    "serves {} memory",
                    to_string(where), to_string(provider->capabilities().where)));
  }
  if (provider->capabilities().granularity != granularity_)
    throw invalid_argument(
        fmt::format("imported_buffer: the exporter's granularity is {}, but {} memory "
                    "here has {}",
                    granularity_, to_string(where), provider->capabilities().granularity));
  return provider;
}

void imported_buffer::map_chunks(const manifest& description, fd_source& fds) {
  if (access_ == access_mode::read_write && description.grant == access_mode::read_only)
    throw invalid_argument(
        "imported_buffer: read-write access asked for, but the exporter granted "
        "read-only access");
  // Import every handle first: a bad fd or size fails before anything is reserved or mapped.
  std::vector<shared_chunk> fresh;
  fresh.reserve(description.chunks.size());
  std::vector<access_grant> grants;
  for (const manifest_chunk& chunk : description.chunks) {
    std::shared_ptr<memory_provider> provider = provider_of(chunk.where);
    for (const accessor& who : provider->capabilities().default_accessors)
      if (std::none_of(grants.begin(), grants.end(), [&](const access_grant& g) { return g.who == who; }))
        grants.push_back({who, access_});
    physical_allocation memory;
    if (chunk.handle == handle_kind::posix_fd) {
      unique_fd fd = fds.take();  // kept by the allocation, or closed here once imported
      memory = keep_descriptors_
                   ? physical_allocation::import_fd(std::move(provider), std::move(fd), chunk.size)
                   : physical_allocation::import_fd(std::move(provider), fd.get(), chunk.size);
    } else {
      memory = import_fabric(provider, chunk.fabric, chunk.size);
    }
    fresh.push_back(std::make_shared<const pooled_chunk>(pooled_chunk::own(std::move(memory))));
  }
  if (fds.remaining != 0)
    throw bad_manifest(
        fmt::format("imported_buffer: {} fds left over after the manifest's chunks", fds.remaining));
  if (run_.data() == nullptr) {
    const std::shared_ptr<memory_provider> provider = provider_of(description.where);
    // By default what a buffer of that location reserves by default: its memory size rounded
    // up to the granularity (a GPU's memory size need not be a multiple of it).
    const std::size_t limit = max_size_limit_ != 0 ? max_size_limit_
                                                   : round_up(provider->capabilities().physical_memory_size,
                                                              provider->capabilities().granularity);
    if (description.max_size > limit)
      throw invalid_argument(fmt::format(
          "imported_buffer: the manifest asks to reserve {} bytes of addresses, more than the limit of "
          "{} (import_options::max_size_limit; by default the memory size of {})",
          description.max_size, limit, to_string(description.where)));
    run_ = mapped_range(provider, description.max_size);
  }
  if (!fresh.empty()) {
    const std::size_t old_count = run_.chunks().size();
    try {
      for (shared_chunk& chunk : fresh) run_.push_back(std::move(chunk));
      run_.set_access(description.start, description.end - description.start, grants);
    } catch (...) {
      run_.unmap_from(old_count);  // nothing queued can use them yet
      throw;
    }
  }
  size_ = description.size;
}

void imported_buffer::check_growth(const manifest& tail) const {
  validate(tail);
  if (run_.data() == nullptr) throw invalid_argument("imported_buffer: growth of an empty import");
  if (tail.kind != manifest_kind::growth)
    throw bad_manifest("imported_buffer: a whole manifest cannot extend an import");
  if (tail.buffer_id != buffer_id_ || tail.where != where_ || tail.granularity != granularity_ ||
      tail.max_size != run_.size() || tail.base_offset != base_offset_)
    throw bad_manifest(fmt::format(
        "imported_buffer: the growth manifest is for another buffer (id {:#x}, {}, granularity {}, "
        "max size {}, base offset {}; this import: id {:#x}, {}, {}, {}, {})",
        tail.buffer_id, to_string(tail.where), tail.granularity, tail.max_size, tail.base_offset, buffer_id_,
        to_string(where_), granularity_, run_.size(), base_offset_));
  if (tail.start != run_.mapped())
    throw bad_manifest(
        fmt::format("imported_buffer: the growth manifest starts at {}, but this import "
                    "maps {} bytes",
                    tail.start, run_.mapped()));
}

void imported_buffer::grow(const manifest& tail, std::vector<unique_fd> fds) {
  check_growth(tail);
  fd_source source = fd_source::from_list(std::move(fds), tail);
  map_chunks(tail, source);
}

void imported_buffer::receive_growth(int socket_fd, std::chrono::milliseconds timeout) {
  const detail::deadline until(timeout);
  received_manifest first = receive_first(socket_fd, until);
  fd_source source(std::move(first.fds), first.description.fd_count(), socket_fd, until);
  check_growth(first.description);
  map_chunks(first.description, source);
}

// ---- private overlays: chunks replaced, in this process only, by fresh memory holding a
// copy of their bytes, at the same addresses (the file comment of importer.hpp) ----

template <class Fn>
void imported_buffer::for_chunks_touching(std::size_t offset, std::size_t length, Fn&& fn) const {
  if (offset > capacity() || length > capacity() - offset)
    throw invalid_argument(fmt::format("imported_buffer: the range [{}, +{}) passes the {} bytes mapped",
                                       offset, length, capacity()));
  if (length == 0) return;
  std::size_t position = 0;
  for (std::size_t i = 0; i < run_.chunks().size() && position < offset + length; ++i) {
    const std::size_t size = run_.chunks()[i]->size();
    if (position + size > offset) fn(i, position);
    position += size;
  }
}

bool imported_buffer::is_private(std::size_t offset, std::size_t length) const {
  bool all = true;
  for_chunks_touching(offset, length, [&](std::size_t index, std::size_t) {
    all = all && index < private_chunks_.size() && private_chunks_[index];
  });
  return all;
}

std::size_t imported_buffer::private_bytes() const noexcept {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < private_chunks_.size() && i < run_.chunks().size(); ++i)
    if (private_chunks_[i]) bytes += run_.chunks()[i]->size();
  return bytes;
}

std::size_t imported_buffer::make_private(std::span<const byte_span> spans, stream_ref stream) {
  if (run_.data() == nullptr) throw invalid_argument("imported_buffer: make_private of an empty import");
  struct replacement {
    std::size_t index;
    std::size_t at;  // its offset in the import
    shared_chunk fresh;
  };
  std::vector<replacement> plan;  // in chunk order, each chunk once
  for (const byte_span& span : spans)
    for_chunks_touching(span.offset, span.length, [&](std::size_t index, std::size_t at) {
      if (index < private_chunks_.size() && private_chunks_[index]) return;
      const auto place =
          std::lower_bound(plan.begin(), plan.end(), index,
                           [](const replacement& step, std::size_t i) { return step.index < i; });
      if (place == plan.end() || place->index != index) plan.insert(place, {index, at, nullptr});
    });
  if (plan.empty()) return 0;

  // Fresh memory for each chunk, filled through a temporary mapping of its own: until the
  // swap below, nothing of the import has changed.
  std::size_t fresh_bytes = 0;
  {
    std::vector<mapped_range> staging;
    staging.reserve(plan.size());
    const auto retire_staging = [&] {
      for (mapped_range& temporary : staging) {
        const stream_use use{&temporary.provider()->executor(), stream};
        std::move(temporary).retire_after({&use, 1});
      }
    };
    try {
      for (replacement& step : plan) {
        const shared_chunk& shared = run_.chunks()[step.index];
        const std::shared_ptr<memory_provider>& provider = shared->memory().provider();
        step.fresh = std::make_shared<const pooled_chunk>(
            pooled_chunk::own(physical_allocation(provider, shared->size())));
        mapped_range& temporary = staging.emplace_back(provider, shared->size());
        temporary.push_back(step.fresh);
        temporary.set_access(0, shared->size(), access_mode::read_write);
        provider->executor().copy(temporary.data(), static_cast<const std::byte*>(data()) + step.at,
                                  shared->size(), stream);
        fresh_bytes += shared->size();
      }
      for (const mapped_range& temporary : staging) temporary.provider()->executor().synchronize(stream);
    } catch (...) {
      retire_staging();  // after the copies queued so far
      throw;
    }
    retire_staging();  // the copies are done: unmapped at once
  }

  // The swap: each chunk unmapped and its fresh memory mapped read-write in its place. A
  // failure puts the chunks swapped so far back (replace() restores the one that failed).
  private_chunks_.resize(std::max(private_chunks_.size(), run_.chunks().size()), false);
  std::vector<shared_chunk> replaced;
  replaced.reserve(plan.size());
  std::size_t done = 0;
  try {
    for (; done < plan.size(); ++done) {
      const replacement& step = plan[done];
      const provider_capabilities& caps = step.fresh->memory().provider()->capabilities();
      replaced.push_back(
          run_.replace(step.index, step.fresh, caps.grants(access_mode::read_write), caps.grants(access_)));
    }
  } catch (...) {
    while (done-- > 0) {
      const replacement& step = plan[done];
      const provider_capabilities& caps = step.fresh->memory().provider()->capabilities();
      (void)vmm::detail::cleanup("imported_buffer: mapping a shared chunk back", [&] {
        (void)run_.replace(step.index, replaced[done], caps.grants(access_),
                           caps.grants(access_mode::read_write));
      });
    }
    throw;
  }
  for (const replacement& step : plan) private_chunks_[step.index] = true;
  return fresh_bytes;
}

}  // namespace vmm::ipc
