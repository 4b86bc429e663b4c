#pragma once
// The page supply of a memory resource: the physical pages it holds and where they come
// from. It owns the spare pages (held, mapped nowhere), the pages lent with their old
// mapping still in place (the unmapping queue), the count of mapped pages of each size,
// the learned headroom and the page counts. Pages for a run are taken spare first, then
// stitched (moved from idle places, or lent by the allocating stream), then made again in
// the other size, then created; idle pages go back to the pool past what may be kept.
// Everything here runs on the slow path: the resource's mutex, then every arena's.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "resource/arena.hpp"
#include "resource/arena_set.hpp"
#include "resource/stream_clock.hpp"
#include "resource/usage.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/location.hpp"
#include "vmm/shared_chunk.hpp"

namespace vmm::detail {

class page_supply {
 public:
  // What the supply may hold (memory_resource_properties) and may wait for.
  struct limits {
    std::size_t max_size = 0;
    double headroom = 0;
    std::size_t release_threshold = 0;
    bool allow_opportunistic = true;  // reuse_policies: what a stream has passed is free for all
  };
  struct counts {
    std::size_t created = 0;
    std::size_t stitched = 0;
    std::size_t released = 0;
  };

  // Pages of `page` bytes (the pool's granularity) and of `large_page` (equal: one size).
  page_supply(std::shared_ptr<chunk_pool> pool, arena_set& arenas, stream_clock& clock, const usage& used,
              std::size_t page, std::size_t large_page, limits limits, std::vector<access_grant> grants);
  page_supply(const page_supply&) = delete;
  page_supply& operator=(const page_supply&) = delete;

  // `pages` spare pages of the granularity from the pool, made now (created).
  void add_spare(std::size_t pages);
  // Maps every page of `a` under [offset, offset + size) that is not mapped and grants the
  // access. Throws out_of_memory when the pages cannot be had and driver_error when the
  // driver refuses: the reserved memory is then what it was.
  void map(arena& a, std::uint64_t offset, std::uint64_t size);
  // Unmaps the old mapping of every lent page whose stream has passed its free (`wait`:
  // waiting for those that have not).
  void unmap_passed_retiring(bool wait);
  // Gives spare, then idle pages back to the pool while more than `bytes_to_keep` is
  // reserved (the lent pages whose stream has passed their free first).
  void give_back(std::size_t bytes_to_keep);
  // For sleep: every page, mapped or spare, back to the pool and the pool's idle memory to
  // the device (waiting for the lent pages' streams). A page the driver would not unmap stays.
  void give_back_all();

  // For wake: a page of `size` bytes from the pool, counting `also_taken` bytes taken
  // already; throws out_of_memory past max_size or when the pool has none.
  [[nodiscard]] shared_chunk fresh_page(std::size_t size, std::size_t also_taken);
  // Maps `chunk` at page p of `a` (granted with grant()).
  void map_fresh(arena& a, std::size_t p, shared_chunk chunk);
  // Grants the access to `count` pages of `a` from page `first`.
  void grant(const arena& a, std::size_t first, std::size_t count);
  // Unmaps page p of `a` again (a wake that failed).
  void unmap_fresh(arena& a, std::size_t p) noexcept;
  // `pages` created by a wake are mapped now.
  void note_created(std::size_t pages);
  // The idle memory of the pool back to the device.
  void trim_pool();

  // The stream the slow path allocates for (null: none), whose pending pages may be lent.
  void set_caller(stream_record* caller) noexcept { caller_ = caller; }
  void set_release_threshold(std::size_t bytes) noexcept { limits_.release_threshold = bytes; }
  // Whether the reserved memory was past the release threshold when last mapped or given back.
  [[nodiscard]] bool over_threshold() const noexcept {
    return over_threshold_.load(std::memory_order_relaxed);
  }
  // Every mapped page granted `next` instead; the grants of pages mapped from now on.
  void set_access(std::vector<access_grant> next);
  [[nodiscard]] const std::vector<access_grant>& grants() const noexcept { return grants_; }

  // Physical bytes mapped or spare in pages of the granularity (0) or large pages (1).
  [[nodiscard]] std::size_t reserved_bytes(std::size_t which) const noexcept {
    return (mapped_pages_[which] + spare_[which].size()) * (which == 0 ? page_ : large_page_);
  }
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved_bytes(0) + reserved_bytes(1); }
  [[nodiscard]] std::size_t reserved_high() const noexcept { return reserved_high_; }
  void reset_reserved_high() noexcept { reserved_high_ = reserved_bytes(); }
  // Pages held, mapped or spare.
  [[nodiscard]] std::size_t handles() const noexcept {
    return mapped_pages_[0] + mapped_pages_[1] + spare_[0].size() + spare_[1].size();
  }
  [[nodiscard]] const counts& page_counts() const noexcept { return counts_; }
  // The spare pages, handed over (the resource's destructor retires them in stream order).
  [[nodiscard]] std::array<std::vector<shared_chunk>, 2> take_spare() noexcept { return std::move(spare_); }

 private:
  // Pages of the granularity (0) or large pages (1).
  [[nodiscard]] std::size_t page_class(const arena& a) const noexcept {
    return a.page_size() == page_ ? 0 : 1;
  }
  // `wanted` pages for `target`'s pages [first, first + count): spare, stitched or created
  // (each with whether it was created for this request). Nothing changes if it throws.
  std::vector<std::pair<shared_chunk, bool>> take_pages(const arena& target, std::size_t first,
                                                        std::size_t count, std::size_t wanted);
  // Unmaps idle pages (mapped, no block holds a byte of them) of the arenas whose page size
  // `size_fits` accepts, the newest arena first and each from its top down, passing over
  // pages `skip(arena, p)` names, while `more()`; gives each unmapped chunk to
  // `take(arena, chunk)` (mapped_pages_ counts it out already). A page the driver would
  // not unmap stays mapped (reported).
  template <class SizeFits, class Skip, class More, class Take>
  void unmap_idle_pages(SizeFits size_fits, Skip skip, More more, Take take);
  // Up to `wanted` idle pages, unmapped from where they are (not `target`'s pages [first,
  // first + count)), from the top of each arena down.
  std::vector<shared_chunk> steal_idle_pages(const arena& target, std::size_t first, std::size_t count,
                                             std::size_t wanted);
  // Unmaps idle pages of sizes other than `size`, up to `bytes`, and releases as much from
  // the pool.
  void give_back_idle_pages_of_other_sizes(std::size_t size, std::size_t bytes);
  // Waits for the allocating stream to pass the frees of its pending blocks of sizes other
  // than `size`, the oldest first, until their whole mapped pages make `bytes` (or all of
  // them do), and makes what has passed free for everyone: those pages are then idle.
  void pass_pending_of_other_sizes(std::size_t size, std::size_t bytes);
  // Unmaps the old mapping of lent page p once its stream has passed the free (`wait`:
  // waiting for it); false when it has not (or the driver refused). Keeps retiring_ as is.
  bool unmap_retiring(arena& a, std::size_t p, bool wait);
  // The reserved memory past which a page is stitched rather than created.
  [[nodiscard]] std::uint64_t stitch_limit() const noexcept;
  [[nodiscard]] std::uint64_t large_page_room(std::uint64_t high) const noexcept;
  // The reserved memory past which the host waits for the allocating stream's pending
  // pages of the other size rather than creating more (take_pages).
  [[nodiscard]] std::uint64_t wait_limit() const noexcept;

  std::shared_ptr<chunk_pool> pool_;
  arena_set& arenas_;
  stream_clock& clock_;
  const usage& usage_;
  std::size_t page_;
  std::size_t large_page_;
  limits limits_;
  std::vector<access_grant> grants_;
  std::array<std::vector<shared_chunk>, 2> spare_;        // by page_class()
  std::array<std::size_t, 2> mapped_pages_{};             // by page_class()
  std::vector<std::pair<arena*, std::size_t>> retiring_;  // pages lent with their old mapping
  stream_record* caller_ = nullptr;
  std::size_t reserved_high_ = 0;
  counts counts_;
  // Every page stitched lets the resource hold one page more before it stitches again (up
  // to memory_resource_properties::headroom of the most ever in use): a workload whose
  // layout keeps moving pages learns the room it needs, one that never moves any keeps to
  // the most it used and 1/256.
  std::uint64_t learned_headroom_ = 0;
  std::atomic<bool> over_threshold_{false};
};

}  // namespace vmm::detail
