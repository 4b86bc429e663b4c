#include <vmm/ipc/exporter.hpp>

#include <vmm/ipc/fd_channel.hpp>

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <random>

#include "vmm/ipc/detail/continuation.hpp"
#include "vmm/ipc/detail/fd_channel.hpp"
#include "vmm/detail/system.hpp"

namespace vmm::ipc {
namespace {

std::uint64_t mix(std::uint64_t x) noexcept {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t process_nonce() {
  static const std::uint64_t nonce = [] {
    std::random_device device;
    return (std::uint64_t{device()} << 32) ^ device() ^ static_cast<std::uint64_t>(::getpid());
  }();
  return nonce;
}

// A fresh id for each export: whole buffers start a generation with it; ranges, views
// and chunk lists cannot grow.
std::uint64_t fresh_id() {
  static std::atomic<std::uint64_t> counter{0};
  return mix(process_nonce() + 0x632be59bd9b4e019ull * (counter.fetch_add(1) + 1));
}

unique_fd duplicate(int fd) {
  unique_fd copy(os::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy) throw os_error(errno, fmt::format("exporter: fcntl(F_DUPFD_CLOEXEC) of cached fd {}", fd));
  return copy;
}

bool same_chunk(const std::weak_ptr<const pooled_chunk>& a, const shared_chunk& b) noexcept {
  return !a.owner_before(b) && !b.owner_before(a);
}

std::vector<shared_chunk> all_chunks(const growable_buffer& buffer) {
  if (buffer.capacity() == 0) return {};
  return buffer.chunks(0, buffer.capacity());
}

manifest describe(const memory_provider& provider, std::uint64_t id, std::uint64_t max_size,
                  const export_options& options) {
  manifest description;
  description.grant = options.grant;
  description.where = provider.capabilities().where;
  description.buffer_id = id;
  description.granularity = provider.capabilities().granularity;
  description.max_size = max_size;
  return description;
}

bool all_expired(const std::vector<std::weak_ptr<const pooled_chunk>>& chunks) {
  return std::all_of(chunks.begin(), chunks.end(), [](const auto& c) { return c.expired(); });
}

}  // namespace

exporter::exporter() = default;
exporter::~exporter() = default;

exported_manifest exporter::export_list(std::span<const shared_chunk> chunks, manifest description,
                                        const export_options& options) {
  exported_manifest result;
  std::uint64_t position = description.start;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const shared_chunk& chunk = chunks[i];
    if (chunk == nullptr || !*chunk)
      throw invalid_argument(fmt::format("exporter: chunk {} of {} is empty", i, chunks.size()));
    const std::shared_ptr<memory_provider>& provider = chunk->memory().provider();
    if (provider->capabilities().where.kind != description.where.kind)
      throw invalid_argument(fmt::format("exporter: chunk {} of {} is {} memory, but the buffer is {} memory",
                                         i, chunks.size(), to_string(provider->capabilities().where),
                                         to_string(description.where)));
    const handle_kind kind = options.handle.value_or(provider->capabilities().export_kind);
    if (kind == handle_kind::none)
      throw invalid_argument(
          fmt::format("exporter: chunk {} of {} ({} memory) cannot be exported: "
                      "it has no shareable handle",
                      i, chunks.size(), to_string(provider->capabilities().where)));
    const auto found = cache_.find(chunk);
    cache_entry* entry = found == cache_.end() ? nullptr : &found->second;
    // An entry is made only once an export succeeded.
    const auto entry_for_chunk = [&]() -> cache_entry& {
      if (entry == nullptr) entry = &cache_.emplace(chunk_key(chunk), cache_entry{}).first->second;
      ++statistics_.handles_exported;
      return *entry;
    };
    manifest_chunk described{position, chunk->size(), provider->capabilities().where, kind, {}};
    if (kind == handle_kind::posix_fd) {
      if (entry == nullptr || !entry->fd) {
        unique_fd exported = chunk->memory().export_fd();
        entry_for_chunk().fd = std::move(exported);
      } else {
        ++statistics_.cache_hits;
      }
      result.fds.push_back(duplicate(entry->fd.get()));
    } else {
      if (entry == nullptr || !entry->fabric) {
        const fabric_handle exported = export_fabric(chunk->memory());
        entry_for_chunk().fabric = exported;
      } else {
        ++statistics_.cache_hits;
      }
      described.fabric = *entry->fabric;
    }
    description.chunks.push_back(described);
    position += chunk->size();
  }
  description.end = position;
  result.bytes = serialize(description);
  result.description = std::move(description);
  return result;
}

exported_manifest exporter::export_buffer(const growable_buffer& buffer, export_options options) {
  if (buffer.data() == nullptr) throw invalid_argument("exporter: export of a moved-from buffer");
  const std::vector<shared_chunk> chunks = all_chunks(buffer);
  manifest description = describe(*buffer.provider(), fresh_id(), buffer.max_size(), options);
  description.size = buffer.size();
  std::lock_guard lock(mutex_);
  purge_locked();
  exported_manifest result = export_list(chunks, std::move(description), options);
  generations_[result.description.buffer_id] = generation{buffer.data(), {chunks.begin(), chunks.end()}};
  return result;
}

exported_manifest exporter::export_range(const growable_buffer& buffer, std::size_t offset,
                                         std::size_t length, export_options options) {
  const std::vector<shared_chunk> chunks = buffer.chunks(offset, length);  // checks the range
  manifest description = describe(*buffer.provider(), fresh_id(), length, options);
  description.base_offset = offset;
  description.size = buffer.size() <= offset ? 0 : std::min(length, buffer.size() - offset);
  std::lock_guard lock(mutex_);
  purge_locked();
  return export_list(chunks, std::move(description), options);
}

exported_manifest exporter::export_view(const chunk_view& view, export_options options) {
  if (view.chunk_count() == 0) throw invalid_argument("exporter: export of an empty view");
  return export_chunks(view.chunks(), std::move(options));
}

exported_manifest exporter::export_chunks(std::span<const shared_chunk> chunks, export_options options) {
  if (chunks.empty()) throw invalid_argument("exporter: export of no chunks");
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i] == nullptr || !*chunks[i])
      throw invalid_argument(fmt::format("exporter: chunk {} of {} is empty", i, chunks.size()));
    total += chunks[i]->size();
  }
  manifest description = describe(*chunks.front()->memory().provider(), fresh_id(), total, options);
  description.size = total;
  std::lock_guard lock(mutex_);
  purge_locked();
  return export_list(chunks, std::move(description), options);
}

exported_manifest exporter::export_growth(const growable_buffer& buffer, const manifest& last,
                                          export_options options) {
  if (buffer.data() == nullptr) throw invalid_argument("exporter: export of a moved-from buffer");
  const std::vector<shared_chunk> chunks = all_chunks(buffer);
  const std::size_t importer_end = last.end;
  std::lock_guard lock(mutex_);
  purge_locked();
  // The generation is looked up after the purge, and nothing below erases it.
  const auto found = generations_.find(last.buffer_id);
  if (found == generations_.end() || found->second.buffer != buffer.data())
    throw invalid_argument(
        fmt::format("export_growth: manifest {:#x} is not of an export of this buffer by this exporter "
                    "(export_buffer first)",
                    last.buffer_id));
  generation& exported = found->second;
  if (importer_end > buffer.capacity())
    throw invalid_argument(
        fmt::format("export_growth: the importer maps {} bytes, but the buffer maps "
                    "only {} now: it shrank, so it must be imported again",
                    importer_end, buffer.capacity()));
  std::size_t below = 0;  // chunks that lie below importer_end
  std::size_t position = 0;
  while (position < importer_end) position += chunks[below++]->size();
  if (position != importer_end)
    throw invalid_argument(
        fmt::format("export_growth: {} is not a chunk boundary of the buffer "
                    "(the chunk there ends at {})",
                    importer_end, position));
  // Every chunk the generation ever exported must still be mapped where it was: some
  // importer of the generation may map it.
  for (std::size_t i = 0; i < exported.chunks.size() && i < chunks.size(); ++i)
    if (!same_chunk(exported.chunks[i], chunks[i]))
      throw invalid_argument(
          fmt::format("export_growth: the buffer no longer maps chunk {} that manifest {:#x} exported (it "
                      "shrank and grew again): the importer must import it again",
                      i, last.buffer_id));

  manifest description = describe(*buffer.provider(), last.buffer_id, buffer.max_size(), options);
  description.kind = manifest_kind::growth;
  description.start = importer_end;
  description.size = buffer.size();
  exported_manifest result = export_list(std::span(chunks).subspan(below), std::move(description), options);
  for (std::size_t i = exported.chunks.size(); i < chunks.size(); ++i) exported.chunks.push_back(chunks[i]);
  return result;
}

void exporter::purge_locked() {
  for (auto it = cache_.begin(); it != cache_.end();) {
    if (it->first.expired()) {
      it = cache_.erase(it);  // closes the fd
      ++statistics_.entries_dropped;
    } else {
      ++it;
    }
  }
  std::erase_if(generations_, [](const auto& entry) {
    return !entry.second.chunks.empty() && all_expired(entry.second.chunks);
  });
}

void exporter::purge() {
  std::lock_guard lock(mutex_);
  purge_locked();
}

export_statistics exporter::statistics() const {
  std::lock_guard lock(mutex_);
  export_statistics result = statistics_;
  result.cached_chunks = cache_.size();
  return result;
}

void send_manifest(int socket_fd, const exported_manifest& exported, std::chrono::milliseconds timeout) {
  if (exported.fds.size() != exported.description.fd_count())
    throw invalid_argument(fmt::format("send_manifest: {} fds for a manifest of {} posix-fd chunks",
                                       exported.fds.size(), exported.description.fd_count()));
  std::vector<int> fds;
  fds.reserve(exported.fds.size());
  for (const unique_fd& fd : exported.fds) fds.push_back(fd.get());
  const detail::deadline until(timeout);
  detail::for_each_manifest_message(exported.bytes, fds, [&](auto payload, auto batch) {
    detail::send_message(socket_fd, payload, batch, until);
  });
}

}  // namespace vmm::ipc
