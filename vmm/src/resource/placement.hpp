#pragma once
// Placement in a memory resource: which arenas a request lands in, and which free block it
// is carved from. It owns the streams' entries (each stream's record and its home arenas,
// found without a lock) and chooses among the free blocks of the arenas (their free
// indexes, under their mutexes): on the fast path a block whose pages are all mapped, in
// the arena of the request's size class; on the slow path the block that needs the fewest
// pages mapped, across streams and arenas, then a new arena. The pages a block lacks come
// from the page supply.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "resource/arena.hpp"
#include "resource/arena_set.hpp"
#include "resource/page_supply.hpp"
#include "resource/stream_clock.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm::detail {

class placement {
 public:
  // Smaller requests land in small arenas (and wait in quick bins when freed).
  static constexpr std::size_t small_limit = std::size_t{1} << 20;

  // A stream's record and its arenas by kind_of(); the last of each is the home.
  struct stream_entry {
    stream_record* record = nullptr;
    std::array<std::vector<arena*>, 3> arenas;
  };

  // `large_limit`: requests of at least this many bytes get pages of `large_page` (~0: off);
  // `max_size`: what the resource may reserve, which sizes the arenas it makes.
  placement(arena_set& arenas, stream_clock& clock, page_supply& supply, reuse_policies policies,
            std::size_t page, std::size_t large_page, std::uint64_t large_limit,
            std::size_t max_size) noexcept
      : arenas_(arenas),
        clock_(clock),
        supply_(supply),
        policies_(policies),
        page_(page),
        large_page_(large_page),
        large_limit_(large_limit),
        max_size_(max_size) {}
  placement(const placement&) = delete;
  placement& operator=(const placement&) = delete;

  // The entry of `stream` (`sync`: of the calls without a stream), without a lock; null
  // before add_entry() made it.
  [[nodiscard]] stream_entry* find(stream_ref stream, bool sync) const noexcept {
    if (sync) return sync_entry_.load(std::memory_order_acquire);
    const std::size_t start = slot_of(stream);
    for (std::size_t i = 0; i < table_.size(); ++i) {
      stream_entry* e = table_[(start + i) % table_.size()].load(std::memory_order_acquire);
      if (e == nullptr) break;
      if (e->record->stream == stream) return e;
    }
    return nullptr;
  }
  // Under the resource's mutex: the entry of `stream`, made with its home arenas and its
  // record on first use. Throws out_of_memory when no arena can be made.
  stream_entry& add_entry(stream_ref stream, bool sync);

  // Which arenas a request of `size` bytes lands in: 0 small, 1 the rest, 2 large pages.
  [[nodiscard]] std::size_t kind_of(std::uint64_t size) const noexcept {
    return size < small_limit ? 0 : size < large_limit_ ? 1 : 2;
  }
  // The fast path, under `home`'s mutex: a block of `size` in `home` whose pages are all
  // mapped, from the stream's own pending blocks (`record`; null: none) or the released
  // ones, tagged; null when there is none.
  void* try_mapped(arena& home, stream_record* record, std::uint64_t size, std::uint64_t alignment,
                   std::uint32_t tag, std::uint8_t slack);
  // The slow path's placement, under every lock: the free block that needs the fewest pages
  // mapped (the stream's own, the released ones, another stream's it is or may be ordered
  // after), else a new arena; null when nothing could be had, the last out-of-memory in
  // `shortage` (kept from an earlier try). Throws out_of_memory when a run whose pages are
  // all mapped cannot be taken, driver_error when the driver refuses.
  void* place_slow(stream_entry& entry, std::size_t kind, std::uint64_t size, std::uint64_t alignment,
                   bool sync, std::string& shortage);
  // Under every lock: blocks whose stream has passed their free become free for every
  // stream (released), where the reuse policies allow it.
  void release_passed() noexcept;

 private:
  // A free block to carve a request from: the one with the fewest pages to map (then the
  // smallest), among those with fewer than `better_than`.
  struct choice {
    arena* where = nullptr;
    block* b = nullptr;
    std::uint64_t start = 0;
    std::size_t unmapped = std::numeric_limits<std::size_t>::max();
  };
  [[nodiscard]] static std::size_t slot_of(stream_ref stream) noexcept {
    const auto key = reinterpret_cast<std::uintptr_t>(stream.get());
    return static_cast<std::size_t>((key >> 4) * 0x9e3779b97f4a7c15ull >> 58);  // of 64
  }
  choice choose(arena& a, free_index& index, std::uint64_t size, std::uint64_t alignment,
                std::size_t better_than) const;
  // Carves the chosen block and maps what it lacks; throws out_of_memory when the pages
  // cannot be had (nothing changed then).
  void* take(const choice& chosen, std::uint64_t size);
  // choose() then take(); nullptr when nothing fits.
  void* place(arena& a, free_index& index, std::uint64_t size, std::uint64_t alignment);
  // A run with every page mapped, in the stream's own pending blocks (unless `sync`) or the
  // released blocks of its arenas of `kind`; .b is null when there is none.
  choice mapped_run(const stream_entry& entry, std::size_t kind, std::uint64_t size, std::uint64_t alignment,
                    bool sync);
  void* place_with_dependency(stream_entry& entry, std::size_t kind, std::uint64_t size,
                              std::uint64_t alignment, bool wait_allowed);

  arena_set& arenas_;
  stream_clock& clock_;
  page_supply& supply_;
  reuse_policies policies_;
  std::size_t page_;
  std::size_t large_page_;
  std::uint64_t large_limit_;
  std::size_t max_size_;
  std::vector<std::unique_ptr<stream_entry>> entries_;
  std::array<std::atomic<stream_entry*>, 64> table_{};  // lock-free lookup
  std::atomic<stream_entry*> sync_entry_{nullptr};
};

}  // namespace vmm::detail
