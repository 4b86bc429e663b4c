#pragma once
// One arena of a memory resource: an address range carved into blocks, with physical pages
// mapped only under the bytes blocks hold. See vmm/memory_resource.hpp for the design; this
// is the bookkeeping. An arena is used under its own mutex; mapping and unmapping pages is
// the page supply's business (page_supply.hpp), done with every arena locked.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "resource/arena_mutex.hpp"
#include "resource/block_table.hpp"
#include "resource/free_index.hpp"
#include "vmm/address_range.hpp"
#include "vmm/mapping.hpp"
#include "vmm/shared_chunk.hpp"
#include "vmm/stream_executor.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm::detail {

// A stream that allocates or frees through a resource: its epochs and recorded points.
// Frees on the stream get the open epoch's number; recording a point closes the epoch; a
// point that has passed makes every block freed in an epoch up to it free for everyone.
struct stream_record {
  explicit stream_record(stream_ref s) : stream(s) {}
  stream_ref stream;
  std::atomic<std::uint64_t> epoch{1};                        // the open epoch
  std::atomic<std::uint64_t> passed{0};                       // every epoch up to this one has passed
  std::atomic<std::uint32_t> frees{0};                        // frees since the last point
  std::atomic<std::size_t> outstanding{0};                    // points recorded and not seen passed
  std::mutex mutex;                                           // guards points and waited_by
  std::deque<std::pair<std::uint64_t, stream_event>> points;  // (epoch it closed, its event)
  std::vector<stream_event> spare_events;                     // of points passed, recorded again
  // Streams ordered after a point of this one, through wait_for(): (stream, epoch).
  std::vector<std::pair<stream_ref, std::uint64_t>> waited_by;

  // Under the mutex: the oldest point has passed; its event is kept for a later point
  // (record_again costs one driver call, a new event three: create, record, destroy).
  void pass_oldest() noexcept {
    passed.store(points.front().first);
    try {
      spare_events.push_back(std::move(points.front().second));
    } catch (...) {  // no memory for the list: the event is destroyed instead
    }
    points.pop_front();
  }
};

// An arena's mapped pages as bits (bit p % 64 of word p / 64: page p is mapped; pages from
// `known` on are not), read 64 pages at a time.
struct page_bits {
  std::span<const std::uint64_t> mapped;
  std::size_t known = 0;

  // Pages of [first, first + count) not mapped, counting no further than `stop`.
  [[nodiscard]] std::size_t unmapped(std::size_t first, std::size_t count, std::size_t stop) const noexcept;
  // The start s in [low, high] of the run of pages [s, s + n) with the fewest not mapped,
  // and that count (the lowest start on a tie; a run with none missing ends the search).
  // Each word of 64 starts costs a step, and one more for each start where the count
  // changes (a run of mapped pages begins or ends under the first or the last page): a few
  // times faster than page by page (docs/design/memory_resource.md, "Placement").
  [[nodiscard]] std::pair<std::size_t, std::size_t> fewest_unmapped(std::size_t low, std::size_t high,
                                                                    std::size_t n) const noexcept;
  // Bit i set: page p + i is not mapped.
  [[nodiscard]] std::uint64_t unmapped_from(std::size_t p) const noexcept;
};

// A mapped page of an arena: its chunk, and the mapping (with no access of its own: the
// resource sets access over runs of pages at once). A page whose chunk was moved elsewhere
// while work queued on a stream may still use it here keeps its old mapping ("retiring")
// until that stream passes the epoch of the free.
struct page {
  shared_chunk chunk;  // null: not mapped
  mapping mapped;
  mapping retiring;
  stream_record* retiring_on = nullptr;
  std::uint64_t retiring_epoch = 0;
};

// An arena's view of one stream: the blocks freed on it that have not passed yet.
struct stream_slot {
  stream_record* record = nullptr;
  std::uint32_t owner = 0;  // what block::owner says of the blocks pending here
  free_index pending;
  block* oldest = nullptr;  // pending blocks in order of epochs
  block* newest = nullptr;
};

class arena {
 public:
  // Allocates `bytes` of addresses through `provider`; pages of `page_size`.
  arena(std::shared_ptr<memory_provider> provider, std::size_t bytes, std::size_t page_size);
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;
  ~arena();

  arena_mutex mutex;
  std::uint64_t allocations_made = 0;  // under the mutex: every allocation ever placed here

  [[nodiscard]] std::uintptr_t base() const noexcept { return range_.address(); }
  [[nodiscard]] std::size_t size() const noexcept { return range_.size(); }
  [[nodiscard]] bool contains(std::uintptr_t address) const noexcept {
    return address >= base() && address - base() < size();
  }
  [[nodiscard]] std::size_t page_size() const noexcept { return page_size_; }

  // The slot of `record`, made on first use.
  stream_slot& slot_of(stream_record& record) {
    for (auto& slot : slots_)
      if (slot->record == &record) return *slot;
    return add_slot(record);
  }
  [[nodiscard]] std::vector<std::unique_ptr<stream_slot>>& slots() noexcept { return slots_; }
  [[nodiscard]] free_index& released() noexcept { return released_; }

  // The pages [first, first + count) that [offset, offset + size) touches.
  [[nodiscard]] std::pair<std::size_t, std::size_t> page_span(std::uint64_t offset,
                                                              std::uint64_t size) const noexcept {
    const std::size_t first = static_cast<std::size_t>(offset >> page_shift_);
    const std::size_t last = static_cast<std::size_t>((offset + size - 1) >> page_shift_);
    return {first, last - first + 1};
  }
  // Pages of [offset, offset + size) not mapped, counting no further than `stop`.
  [[nodiscard]] std::size_t unmapped_pages(std::uint64_t offset, std::uint64_t size,
                                           std::size_t stop) const noexcept;
  // The page-aligned start in [begin, end - size] of the run of `size` bytes with the fewest
  // pages not mapped, and that count (the lowest start on a tie); {~0, ~0} where no
  // page-aligned run fits (page_bits::fewest_unmapped).
  [[nodiscard]] std::pair<std::uint64_t, std::size_t> fewest_unmapped(std::uint64_t begin, std::uint64_t end,
                                                                      std::uint64_t size) const noexcept;
  // Whether every page of [offset, offset + size) is mapped.
  [[nodiscard]] bool all_mapped(std::uint64_t offset, std::uint64_t size) const noexcept {
    if (const auto [first, count] = page_span(offset, size); count == 1) return mapped(first);
    return unmapped_pages(offset, size, 1) == 0;
  }
  // Whether no page of [offset, offset + size) is mapped.
  [[nodiscard]] bool none_mapped(std::uint64_t offset, std::uint64_t size) const noexcept {
    const std::size_t count = page_span(offset, size).second;
    return unmapped_pages(offset, size, count) == count;
  }
  // Pages [0, page_count()) have state: they have been held by an allocation at some time.
  // Every later one is not mapped and lies whole in the arena's last block (every other
  // block ends below it), held exactly when that block is pending.
  [[nodiscard]] std::size_t page_count() const noexcept { return held_.size(); }
  [[nodiscard]] page_bits mapped_pages() const noexcept { return {mapped_bits_, held_.size()}; }
  [[nodiscard]] bool mapped(std::size_t p) const noexcept {
    return p < held_.size() && (mapped_bits_[p / 64] >> (p % 64) & 1) != 0;
  }
  // Bytes of allocated or pending blocks on page p (< page_count()).
  [[nodiscard]] std::uint64_t held(std::size_t p) const noexcept { return p < held_.size() ? held_[p] : 0; }
  // The epoch of the last pending free on `record` over page p (< page_count()), or
  // `otherwise` where the last pending free over it was on another stream: a page lent
  // away keeps its old mapping until that free has passed, not the newest free of the
  // block it lies in.
  [[nodiscard]] std::uint64_t freed_epoch(std::size_t p, const stream_record& record,
                                          std::uint64_t otherwise) const noexcept {
    return freed_[p].on == &record ? freed_[p].epoch : otherwise;
  }
  // The chunk mapped at page p (< page_count()), or null.
  [[nodiscard]] const shared_chunk& chunk(std::size_t p) const noexcept { return pages_[p].chunk; }
  // The highest page below `end` that is mapped and idle (no block holds a byte of it),
  // or page_count() when there is none.
  [[nodiscard]] std::size_t idle_page_below(std::size_t end) const noexcept;
  // Maps `chunk` at page p (< page_count(), not mapped), with no access yet.
  void map_page(std::size_t p, shared_chunk chunk);
  // Unmaps page p (mapped) and gives its chunk back; null when the driver refused the unmap
  // (reported): the page stays mapped, and a later allocation uses it.
  shared_chunk unmap_page(std::size_t p) noexcept;
  // Gives page p's chunk (mapped, no retiring mapping) to be mapped elsewhere now, for work
  // ordered after `epoch` of `on`'s stream; its mapping here stays until drop_retiring(p).
  shared_chunk lend_page(std::size_t p, stream_record& on, std::uint64_t epoch) noexcept;
  [[nodiscard]] bool retiring(std::size_t p) const noexcept {
    return p < pages_.size() && pages_[p].retiring_on != nullptr;
  }
  [[nodiscard]] const page& page_at(std::size_t p) const noexcept { return pages_[p]; }
  // Pages of [offset, offset + size) with a retiring mapping.
  [[nodiscard]] std::size_t retiring_pages(std::uint64_t offset, std::uint64_t size) const noexcept;
  // Unmaps p's retiring mapping (its stream has passed); false when the driver refused.
  bool drop_retiring(std::size_t p) noexcept;

  // Where a request of `size` bytes aligned to `alignment` would start in `b`, or ~0 when it
  // does not fit.
  [[nodiscard]] static std::uint64_t fit(const block* b, std::uint64_t size,
                                         std::uint64_t alignment) noexcept {
    const std::uint64_t start = (b->offset + alignment - 1) & ~(alignment - 1);
    return start + size <= b->end() ? start : ~std::uint64_t{0};
  }
  // Takes [start, start + size) out of free block `b` (of index `from`, owner `b->owner`):
  // what is left on either side stays free with the same owner. Returns the allocated block.
  block* carve(block* b, std::uint64_t start, std::uint64_t size);
  // Frees an allocated block: released (free for everyone) or pending on `slot`.
  void free_released(block* b) noexcept;
  void free_pending(block* b, stream_slot& slot, std::uint64_t epoch) noexcept;
  // Moves the blocks of `slot` freed up to `epoch` to the released blocks. Returns how many.
  std::size_t release_pending(stream_slot& slot, std::uint64_t epoch) noexcept;

  // Quick bins: deferred coalescing, as in the thread caches of malloc implementations. A
  // block freed whole, of a size asked for here and not found, is kept as it is (its bytes
  // still held, its pages mapped) in a bin of blocks of that exact size and owner
  // (released, or pending on one stream), and the next request of that size from a stream
  // that may use it takes it back: no fit search, carving, merging, page bookkeeping or
  // table update. A program that repeats itself asks for the sizes it freed; one whose sizes
  // do not repeat leaves the bins nearly empty, as a bin keeps only the size last asked for
  // there. The bins hold at most a page's worth of bytes in all. What they hold is free for
  // its owner only through them: before anything else looks for free blocks or idle pages
  // (an allocation that the free blocks cannot serve, the slow path, statistics, trim,
  // sleep), flush_quick() frees every cached block as deallocate would have, so the cache
  // never makes the resource map a page it would not have.
  //
  // Takes a cached block of exactly `size` bytes whose start is aligned to `alignment` and
  // that `record`'s stream may use (null: the calls without a stream, which may use
  // released ones only), allocated again; null when there is none.
  block* take_quick(std::uint64_t size, std::uint64_t alignment, const stream_record* record) noexcept {
    quick_bin& bin = quick_bins_[quick_bin_of(size)];
    if (bin.count == 0) {
      bin.size = size;  // asked for: a block of this size freed next is kept for the next ask
      return nullptr;
    }
    if (bin.size != size || (bin.slot != nullptr && bin.slot->record != record)) return nullptr;
    block* b = bin.head;
    if ((b->offset & (alignment - 1)) != 0) return nullptr;
    bin.head = b->next_free;
    --bin.count;
    --cached_count_;
    cached_bytes_ -= b->size;
    b->cached = false;
    return b;
  }
  // Keeps allocated block `b`, freed now (by `slot`'s stream in `epoch`; null: released),
  // in its quick bin; false when it does not go there (free it the ordinary way then).
  bool keep_quick(block* b, stream_slot* slot, std::uint64_t epoch) noexcept {
    quick_bin& bin = quick_bins_[quick_bin_of(b->size)];
    if (bin.size != b->size || bin.count == quick_depth || (bin.count != 0 && bin.slot != slot) ||
        cached_bytes_ + b->size > page_size_)
      return false;
    cached_bytes_ += b->size;
    b->cached = true;
    b->epoch = epoch;
    b->next_free = bin.head;
    bin.head = b;
    bin.slot = slot;
    ++bin.count;
    ++cached_count_;
    return true;
  }
  // Frees every cached block as deallocate would have: released, or pending on its stream
  // (released when `release_passed` and its stream has passed the free).
  void flush_quick(bool release_passed) noexcept {
    if (cached_count_ == 0) return;
    for (quick_bin& bin : quick_bins_)
      if (bin.count != 0) flush_bin(bin, release_passed);
  }
  [[nodiscard]] std::size_t cached_count() const noexcept { return cached_count_; }

  // Allocated blocks by their offset (cached ones too: block::cached tells them apart).
  [[nodiscard]] block* allocated_at(std::uint64_t offset) const noexcept { return allocated_.find(offset); }
  [[nodiscard]] const block_table& allocated() const noexcept { return allocated_; }
  // Live allocations: allocated blocks not cached.
  [[nodiscard]] std::size_t allocated_count() const noexcept { return allocated_.size() - cached_count_; }

  // The index of free blocks a block of this owner is in.
  free_index& index_of(const block* b) noexcept {
    return b->owner == 0 ? released_ : slots_[b->owner - 1]->pending;
  }

 private:
  // A block from the spare ones (made 256 at a time), every field as a new block's (set
  // one by one: `*b = block{}` is a call to memset, whose branches on the size the
  // processor mispredicts here about once a call).
  block* new_block() {
    if (spare_blocks_ == nullptr) add_spare_blocks();
    block* b = spare_blocks_;
    spare_blocks_ = b->next_free;
    b->offset = b->size = 0;
    b->previous = b->next = b->previous_free = b->next_free = b->previous_pending = b->next_pending = nullptr;
    b->epoch = 0;
    b->owner = b->tag = 0;
    b->free = b->cached = false;
    b->list_first = b->list_second = 0;
    return b;
  }
  void add_spare_blocks();
  struct quick_bin {
    std::uint64_t size = 0;       // of the blocks kept; while none is, the size last asked for
    stream_slot* slot = nullptr;  // whose frees they are (null: released)
    block* head = nullptr;        // linked through next_free
    std::uint32_t count = 0;
  };
  static constexpr std::size_t quick_bin_count = 64;
  static constexpr std::uint32_t quick_depth = 16;
  [[nodiscard]] static std::size_t quick_bin_of(std::uint64_t size) noexcept {
    return static_cast<std::size_t>(((size >> free_index::unit_shift) * 0x9e3779b97f4a7c15ull) >>
                                    58);  // of 64
  }
  void flush_bin(quick_bin& bin, bool release_passed) noexcept;
  void delete_block(block* b) noexcept {
    b->next_free = spare_blocks_;
    spare_blocks_ = b;
  }
  // Page state for every page [offset, offset + size) touches (may allocate; nothing
  // changes when it throws), those of an allocation about to be carved from a block that
  // is pending (`in_pending`) or released. hold() changes only pages that have state.
  void cover_pages(std::uint64_t offset, std::uint64_t size, bool in_pending) {
    if (const auto [first, count] = page_span(offset, size); first + count > held_.size())
      add_pages(first + count, in_pending);
  }
  void add_pages(std::size_t count, bool in_pending);  // state for pages up to `count`
  stream_slot& add_slot(stream_record& record);
  void hold(std::uint64_t offset, std::uint64_t size, bool add) noexcept;
  // Moves one pending block of `slot` (its free has passed) to the released blocks.
  block* release_one(stream_slot& slot, block* b) noexcept;
  void unlink_pending(stream_slot& slot, block* b) noexcept;
  void insert_pending_before(stream_slot& slot, block* at, block* b) noexcept;  // b: at's epoch
  void insert_pending(stream_slot& slot, block* b) noexcept;                    // in order of epochs
  // Merges `b`, just made free (its owner and epoch set, in no index or list), with its
  // free neighbours of the same owner (and, when pending, released ones); the merged block
  // is in its owner's index and, when pending, in its stream's pending list by its epoch
  // (the newest of the merged pending blocks').
  block* merge_free(block* b) noexcept;

  std::size_t page_size_;
  unsigned page_shift_;  // the page size is a power of two
  address_range range_;
  // Per page. What the hot path reads over runs of pages is dense: a word of held bytes and
  // a bit of "mapped" each; the chunks and mappings sit apart.
  std::vector<std::uint64_t> held_;
  std::vector<std::uint64_t> mapped_bits_;
  struct free_mark {
    const stream_record* on = nullptr;  // the stream of the last pending free over the page
    std::uint64_t epoch = 0;            // and its epoch
  };
  std::vector<free_mark> freed_;  // written by free_pending(), read when a page is lent
  std::vector<page> pages_;       // declared after range_: the mappings go first
  std::size_t retiring_count_ = 0;
  free_index released_;
  std::vector<std::unique_ptr<stream_slot>> slots_;
  block_table allocated_;
  std::vector<std::unique_ptr<block[]>> block_storage_;
  block* spare_blocks_ = nullptr;
  std::array<quick_bin, quick_bin_count> quick_bins_{};
  std::size_t cached_count_ = 0;
  std::uint64_t cached_bytes_ = 0;
};

}  // namespace vmm::detail
