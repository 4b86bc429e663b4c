#include "entry_memory.hpp"

#include <vmm/error.hpp>
#include <vmm/ipc/importer.hpp>
#include <vmm/ipc/manifest.hpp>
#include <vmm/provider.hpp>
#include <vmm/stream_executor.hpp>

#include <fmt/format.h>

namespace vmm::store::detail {

entry_memory::entry_memory(const std::shared_ptr<memory_provider>& provider,
                           std::span<const shared_chunk> chunks, std::size_t size)
    : fixed_size_(size) {
  std::size_t total = 0;
  for (const shared_chunk& chunk : chunks) total += chunk ? chunk->size() : 0;
  if (chunks.empty() || total < size)
    throw invalid_argument(
        fmt::format("vmm-store: {} chunks of {} bytes hold no {} bytes in use", chunks.size(), total, size));
  fixed_ = mapped_range(provider, total);
  for (const shared_chunk& chunk : chunks) fixed_.push_back(chunk);
  fixed_.set_access(0, total, access_mode::read_only);
}

entry_memory entry_memory::adopt(location where, std::uint64_t size,
                                 std::span<const std::uint64_t> chunk_sizes, std::vector<unique_fd> fds) {
  ipc::manifest offered;
  offered.kind = ipc::manifest_kind::whole;
  offered.grant = access_mode::read_only;
  offered.where = where;
  offered.buffer_id = 1;  // the daemon's own name of this import: it is never grown
  offered.granularity = provider_for(where)->capabilities().granularity;
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < chunk_sizes.size(); ++i) {
    if (chunk_sizes[i] > UINT64_MAX - end)
      throw ipc::bad_manifest(
          fmt::format("chunk {} of {}: the sizes overflow 64 bits", i, chunk_sizes.size()));
    offered.chunks.push_back({end, chunk_sizes[i], where, handle_kind::posix_fd, {}});
    end += chunk_sizes[i];
  }
  offered.max_size = end;
  offered.end = end;
  offered.size = size;
  ipc::validate(offered);  // sizes of the granularity, size within the chunks, ...
  // The importer checks every descriptor; its chunks then live on in this entry's own
  // mapping, one mechanism for every fixed list of chunks.
  const ipc::imported_buffer imported(
      offered, std::move(fds),
      {.access = access_mode::read_only, .max_size_limit = end, .keep_descriptors = true});
  return entry_memory(imported.provider(), imported.chunks(), size);
}

growable_buffer& entry_memory::buffer() {
  if (!made_) throw invalid_argument("vmm-store: a sealed entry of fixed chunks has no growable buffer");
  return *made_;
}

location entry_memory::where() const {
  return provider()->capabilities().where;
}

std::vector<shared_chunk> entry_memory::chunks() const {
  if (made_)
    return made_->capacity() == 0 ? std::vector<shared_chunk>{} : made_->chunks(0, made_->capacity());
  return fixed_.chunks();
}

std::vector<std::byte> entry_memory::read(std::uint64_t offset, std::uint64_t bytes) const {
  std::vector<std::byte> copy(bytes);
  if (!copy.empty()) {
    stream_executor& executor = provider()->executor();
    executor.copy(copy.data(), data() + offset, copy.size(), {});
    executor.synchronize({});
  }
  return copy;
}

bool entry_memory::describes(const ipc::manifest& sent) const noexcept {
  // A fixed entry's export names every byte it maps in use (export_chunks).
  return sent.end == capacity() && sent.size == (made_ ? size() : capacity());
}

ipc::exported_manifest entry_memory::export_whole(ipc::exporter& out, access_mode grant) const {
  if (made_) return out.export_buffer(*made_, {.grant = grant});
  return out.export_chunks(fixed_.chunks(), {.grant = grant});
}

ipc::exported_manifest entry_memory::export_growth(ipc::exporter& out, const ipc::manifest& last,
                                                   access_mode grant) const {
  if (!made_) throw invalid_argument("vmm-store: a sealed entry of fixed chunks never grows");
  return out.export_growth(*made_, last, {.grant = grant});
}

}  // namespace vmm::store::detail
