#pragma once
// De-duplication by content in the vmm-store daemon (docs/store.md, "De-duplication"): the
// chunks of the sealed entries that asked for it, found by the bytes they hold, with the
// entries that map each one.
//
// Rationale. Fine-tunes of one base, or one embedding in two models, hold the same bytes in
// memory of their own. The unit shared is a physical chunk: a mapping starts at a chunk's first
// byte, so two entries can map one chunk only where both have a chunk of exactly those bytes
// (a tensor set laid out per tensor gives each large tensor chunks of its own).
//
// Approach. At a de-duplicating seal, each chunk of the entry is read once and hashed
// (XXH3-128 over its bytes). A chunk whose (location, size, hash) is in the index is compared
// byte for byte with the chunks found there, the first equal one taking its place: the hash
// only finds candidates, and chunks whose bytes differ are never shared, whatever their hashes.
// Reading is piecewise: host memory in place, device memory copied into a host staging buffer
// of at most staging_piece_bytes. The entry's chunks that found no equal enter the index once
// the entry maps its final list (enter()).
//
// Who pays. A chunk that several entries map is stored once, and counted once: to the first of
// them (in the order they entered). When that entry ends while others still map the chunk, the
// next one pays for it from then on (leave() says who, and how much).
//
// The index keeps no memory alive: it holds the chunks as weak references, and forgets a chunk
// when the last entry that maps it leaves. One entry never maps one chunk twice: a chunk of the
// index replaces at most one chunk of each entry, and an entry's own chunks are not compared
// with each other.

#include <vmm/location.hpp>
#include <vmm/provider.hpp>
#include <vmm/shared_chunk.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

namespace vmm::store::detail {

class piece_reader;

// The most bytes read at once from memory the host cannot read in place.
inline constexpr std::size_t staging_piece_bytes = std::size_t{64} << 20;

// A chunk's 128-bit content hash.
struct content_hash {
  std::uint64_t high = 0;
  std::uint64_t low = 0;
  friend auto operator<=>(const content_hash&, const content_hash&) = default;
};

// What deduplicate() found for one entry: its final chunk list and each chunk's hash.
struct deduplicated_chunks {
  location where;
  std::vector<shared_chunk> chunks;
  std::vector<content_hash> hashes;
  std::size_t replaced = 0;  // chunks that are another entry's now
  std::size_t replaced_bytes = 0;
};

class content_index {
 public:
  // `hashes_alike`: every chunk hashes to one value (server_options::test_hash_collisions),
  // so that every lookup finds each chunk of its location and size, and only the comparison
  // of bytes decides.
  explicit content_index(bool hashes_alike = false) : hashes_alike_(hashes_alike) {}

  // The chunks `chunks` (mapped back to back from `base` through `provider`, readable), each
  // replaced by a chunk of the index with equal bytes where there is one. Changes nothing here.
  // Throws vmm::driver_error (copying device memory), vmm::invalid_argument and what mapping a
  // candidate throws (vmm::out_of_memory, vmm::driver_error, vmm::os_error), std::bad_alloc.
  [[nodiscard]] deduplicated_chunks deduplicate(std::span<const shared_chunk> chunks, const std::byte* base,
                                                const std::shared_ptr<memory_provider>& provider) const;
  // `entry` maps found.chunks from now on: the chunks new to the index enter it, paid for by
  // `entry`. Returns the bytes `entry` pays for. Throws std::bad_alloc, and then has entered
  // nothing.
  std::size_t enter(std::uint64_t entry, const deduplicated_chunks& found);

  // `entry`, which mapped `chunks` (what it entered with), ended: it leaves each chunk's record,
  // and the index forgets the chunks nobody maps any more. Calls paid_by(next, bytes) for each
  // chunk it paid for that `next` maps too, and pays for from now on. Allocates nothing.
  template <class PaidBy>
  void leave(std::uint64_t entry, std::span<const shared_chunk> chunks, PaidBy&& paid_by) noexcept {
    for (const shared_chunk& chunk : chunks)
      if (const std::uint64_t next = leave_one(entry, chunk); next != 0) paid_by(next, chunk->size());
  }
  // Bytes of `chunks` (an entry's) that another entry maps too.
  [[nodiscard]] std::size_t shared_bytes(std::span<const shared_chunk> chunks) const noexcept;
  // Chunks the index knows.
  [[nodiscard]] std::size_t size() const noexcept { return records_.size(); }

 private:
  using key = std::tuple<location, std::size_t, content_hash>;
  struct record {
    key found_by;
    std::vector<std::uint64_t> users;  // the entries that map it, in the order they came; the first pays
  };

  // Takes `entry` off `chunk`'s record; returns the entry that pays for it now where `entry`
  // did and another maps it, else 0.
  std::uint64_t leave_one(std::uint64_t entry, const shared_chunk& chunk) noexcept;
  [[nodiscard]] content_hash hash(const std::byte* data, std::size_t bytes, piece_reader& reader) const;

  bool hashes_alike_;
  std::multimap<key, std::weak_ptr<const pooled_chunk>> by_content_;
  std::map<const pooled_chunk*, record> records_;
};

}  // namespace vmm::store::detail
