#include "content_index.hpp"

#include <vmm/mapped_range.hpp>
#include <vmm/stream_executor.hpp>

#include <algorithm>
#include <cstring>
#include <set>

// Header-only: nothing links libxxhash (Debian's libxxhash-dev gives the header).
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace vmm::store::detail {

// Host-readable views of mapped memory, one piece at a time: the memory itself where the host
// reads it in place, else a copy in a staging buffer of this reader's (at most
// staging_piece_bytes, made at the first read).
class piece_reader {
 public:
  explicit piece_reader(memory_provider& provider)
      : executor_(&provider.executor()), in_place_(provider.capabilities().host_accessible) {}

  // [source, source + bytes), bytes <= staging_piece_bytes, valid until the next read.
  std::span<const std::byte> read(const std::byte* source, std::size_t bytes) {
    if (in_place_) return {source, bytes};
    if (staging_.size() < bytes) staging_.resize(bytes);
    executor_->copy(staging_.data(), source, bytes, {});
    executor_->synchronize({});
    return {staging_.data(), bytes};
  }

 private:
  stream_executor* executor_;
  bool in_place_;
  std::vector<std::byte> staging_;
};

namespace {

// Whether the `bytes` at `a` and at `b` are equal, each read through its reader.
bool equal_bytes(const std::byte* a, const std::byte* b, std::size_t bytes, piece_reader& first,
                 piece_reader& second) {
  for (std::size_t at = 0; at < bytes; at += staging_piece_bytes) {
    const std::size_t n = std::min(staging_piece_bytes, bytes - at);
    const std::span<const std::byte> x = first.read(a + at, n);
    const std::span<const std::byte> y = second.read(b + at, n);
    if (std::memcmp(x.data(), y.data(), n) != 0) return false;
  }
  return true;
}

}  // namespace

content_hash content_index::hash(const std::byte* data, std::size_t bytes, piece_reader& reader) const {
  if (hashes_alike_) return {};
  struct state_deleter {
    void operator()(XXH3_state_t* state) const noexcept { XXH3_freeState(state); }
  };
  const std::unique_ptr<XXH3_state_t, state_deleter> state(XXH3_createState());
  if (!state) throw std::bad_alloc();
  XXH3_128bits_reset(state.get());
  for (std::size_t at = 0; at < bytes; at += staging_piece_bytes) {
    const std::span<const std::byte> piece =
        reader.read(data + at, std::min(staging_piece_bytes, bytes - at));
    XXH3_128bits_update(state.get(), piece.data(), piece.size());
  }
  const XXH128_hash_t digest = XXH3_128bits_digest(state.get());
  return {digest.high64, digest.low64};
}

deduplicated_chunks content_index::deduplicate(std::span<const shared_chunk> chunks, const std::byte* base,
                                               const std::shared_ptr<memory_provider>& provider) const {
  deduplicated_chunks found;
  found.chunks.assign(chunks.begin(), chunks.end());
  found.hashes.reserve(chunks.size());
  const location where = provider->capabilities().where;
  found.where = where;
  piece_reader reader(*provider);       // this entry's bytes
  piece_reader other(*provider);        // a candidate's
  std::set<const pooled_chunk*> taken;  // a chunk of the index replaces one chunk of this entry at most
  std::size_t offset = 0;
  for (shared_chunk& chunk : found.chunks) {
    const std::byte* mine = base + offset;
    const std::size_t size = chunk->size();
    offset += size;
    found.hashes.push_back(hash(mine, size, reader));
    const auto [first, last] = by_content_.equal_range(key{where, size, found.hashes.back()});
    for (auto it = first; it != last; ++it) {
      shared_chunk candidate = it->second.lock();
      if (!candidate || candidate == chunk || taken.contains(candidate.get())) continue;
      // Mapped here for the comparison alone, read-only.
      mapped_range view(provider, size);
      view.push_back(candidate);
      view.set_access(0, size, access_mode::read_only);
      if (!equal_bytes(mine, static_cast<const std::byte*>(view.data()), size, reader, other)) continue;
      taken.insert(candidate.get());
      chunk = std::move(candidate);
      ++found.replaced;
      found.replaced_bytes += size;
      break;
    }
  }
  return found;
}

std::size_t content_index::enter(std::uint64_t entry, const deduplicated_chunks& found) {
  std::size_t paid = 0;
  std::size_t i = 0;
  try {
    for (; i < found.chunks.size(); ++i) {
      const shared_chunk& chunk = found.chunks[i];
      if (const auto known = records_.find(chunk.get()); known != records_.end()) {
        known->second.users.push_back(entry);
        continue;
      }
      const key found_by{found.where, chunk->size(), found.hashes[i]};
      const auto made = records_.emplace(chunk.get(), record{found_by, {entry}}).first;
      try {
        by_content_.emplace(found_by, chunk);
      } catch (...) {
        records_.erase(made);
        throw;
      }
      paid += chunk->size();
    }
  } catch (...) {
    // All or nothing: the chunks entered so far leave again (leave_one allocates nothing), so
    // that a seal refused here and asked again does not count `entry` twice.
    while (i-- > 0) (void)leave_one(entry, found.chunks[i]);
    throw;
  }
  return paid;
}

std::uint64_t content_index::leave_one(std::uint64_t entry, const shared_chunk& chunk) noexcept {
  const auto known = records_.find(chunk.get());
  if (known == records_.end()) return 0;
  std::vector<std::uint64_t>& users = known->second.users;
  const auto at = std::find(users.begin(), users.end(), entry);
  if (at == users.end()) return 0;
  const std::uint64_t next = at == users.begin() && users.size() > 1 ? users[1] : 0;
  users.erase(at);
  if (!users.empty()) return next;
  const auto [first, last] = by_content_.equal_range(known->second.found_by);
  for (auto it = first; it != last; ++it)
    if (!it->second.owner_before(chunk) && !chunk.owner_before(it->second)) {
      by_content_.erase(it);
      break;
    }
  records_.erase(known);
  return 0;
}

std::size_t content_index::shared_bytes(std::span<const shared_chunk> chunks) const noexcept {
  std::size_t shared = 0;
  for (const shared_chunk& chunk : chunks)
    if (const auto known = records_.find(chunk.get());
        known != records_.end() && known->second.users.size() > 1)
      shared += chunk->size();
  return shared;
}

}  // namespace vmm::store::detail
