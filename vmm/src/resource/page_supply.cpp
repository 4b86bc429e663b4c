#include "resource/page_supply.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "vmm/error.hpp"

namespace vmm::detail {
namespace {

constexpr auto no_skip = [](const arena&, std::size_t) { return false; };

}  // namespace

page_supply::page_supply(std::shared_ptr<chunk_pool> pool, arena_set& arenas, stream_clock& clock,
                         const usage& used, std::size_t page, std::size_t large_page, limits limits,
                         std::vector<access_grant> grants)
    : pool_(std::move(pool)),
      arenas_(arenas),
      clock_(clock),
      usage_(used),
      page_(page),
      large_page_(large_page),
      limits_(limits),
      grants_(std::move(grants)) {}

void page_supply::add_spare(std::size_t pages) {
  for (std::size_t i = 0; i < pages; ++i) {
    spare_[0].push_back(std::make_shared<const pooled_chunk>(pool_->acquire(page_)));
    ++counts_.created;
  }
  reserved_high_ = reserved_bytes();
}

std::uint64_t page_supply::stitch_limit() const noexcept {
  // The reserved memory past which a page is stitched rather than created: the most ever
  // in use, and 1/256 more for the pages shared at the edges of runs of blocks, a large
  // page (large_page_room), and the headroom learned (up to
  // memory_resource_properties::headroom of the most in use: by default 1/8; 1/128 when the
  // blocks whose layout moves most, the large ones, have large pages, which move for 1/16 of
  // the cost). The edges get a fixed 1/256 rather than more: it holds the replays of
  // bench/data closer to their peak for a few more pages moved or made
  // (docs/design/memory_resource.md, "Headroom").
  const std::uint64_t high = usage_.most_in_use();
  const auto most_headroom = static_cast<std::uint64_t>(static_cast<long double>(high) * limits_.headroom);
  return high + high / 256 + 2 * page_ + large_page_room(high) + std::min(learned_headroom_, most_headroom);
}

std::uint64_t page_supply::large_page_room(std::uint64_t high) const noexcept {
  // With two page sizes, memory moves between them a large page at a time: where the room
  // past the most in use is less than a large page, the small pages that one request makes
  // cost the large pages a large page, which the next large request makes again from idle
  // small pages, every step. One large page more of room, where it is at most 1/128 of the
  // most in use, ends that (docs/design/memory_resource.md, "Two page sizes").
  return large_page_ != page_ && large_page_ <= high / 128 ? large_page_ : 0;
}

std::uint64_t page_supply::wait_limit() const noexcept {
  // 1/128 past the most in use, about where the stitch limit is without learned headroom,
  // weighed on every page a request makes (take_pages): a wider limit lets pending pages of
  // the other size be made again beside themselves; a narrower one waits more often for
  // little memory (docs/design/memory_resource.md, "Waits").
  const std::uint64_t high = usage_.most_in_use();
  return high + high / 128;
}

template <class SizeFits, class Skip, class More, class Take>
void page_supply::unmap_idle_pages(SizeFits size_fits, Skip skip, More more, Take take) {
  for (std::size_t i = arenas_.count(); i-- > 0 && more();) {
    arena& a = arenas_.at(i);
    if (!size_fits(a.page_size())) continue;
    for (std::size_t p = a.idle_page_below(a.page_count()); p < a.page_count() && more();
         p = a.idle_page_below(p)) {
      if (skip(a, p)) continue;
      shared_chunk chunk = a.unmap_page(p);
      if (chunk == nullptr) continue;
      --mapped_pages_[page_class(a)];
      take(a, std::move(chunk));
    }
  }
}

std::vector<shared_chunk> page_supply::steal_idle_pages(const arena& target, std::size_t first,
                                                        std::size_t count, std::size_t wanted) {
  // Idle pages go from the top of each arena down, the newest arena first. The pages
  // highest up are where a request lands only when nothing lower fits, so moving them
  // unsettles the least; taking the pages of the smallest free blocks first stitches more
  // and reserves more (docs/design/memory_resource.md, "Stitching"). Only pages of the
  // target's size fit it. Moving a large page costs the driver about what a small one does,
  // so only small pages teach the resource headroom.
  std::vector<shared_chunk> stolen;
  const std::size_t size = target.page_size();
  const auto skip = [&](const arena& a, std::size_t p) {
    return &a == &target && p >= first && p < first + count;
  };
  const auto took = [&] {
    ++counts_.stitched;
    if (size == page_) learned_headroom_ += page_;
  };
  unmap_idle_pages([&](std::size_t s) { return s == size; }, skip, [&] { return stolen.size() < wanted; },
                   [&](const arena&, shared_chunk chunk) {
                     took();
                     stolen.push_back(std::move(chunk));
                   });
  // Then pages that only blocks freed on the allocating stream hold, whose free that
  // stream's queued work may not have passed yet: work queued on it from now on comes
  // after the free, so the memory may serve this request at once (as a block freed on a
  // stream is reused by that stream at once). The page is mapped here too and its old
  // mapping stays until the stream passes the free (retiring_), since unmapping is not
  // stream-ordered. Without this, a program running ahead of its GPU reserves anew what it
  // has just freed. Whole pages inside one pending block only: no other block holds them.
  if (caller_ == nullptr || clock_.synchronous() || stolen.size() >= wanted) return stolen;
  stream_record& record = *caller_;
  std::lock_guard record_lock(record.mutex);
  for (std::size_t i = arenas_.count(); i-- > 0 && stolen.size() < wanted;) {
    arena& a = arenas_.at(i);
    if (a.page_size() != size) continue;
    for (auto& slot : a.slots()) {
      if (slot->record != &record) continue;
      for (block* b = slot->oldest; b != nullptr && stolen.size() < wanted; b = b->next_pending) {
        // Whole pages of the block, from its end farthest from the target: the stream's
        // next requests land next to this one (the rest of a block it was carved from, or
        // the run a growing tensor leaves below), where a page lent away would make them
        // wait for the stream or move pages again (docs/design/memory_resource.md,
        // "Lending").
        const std::size_t low = (b->offset + size - 1) / size;
        const std::size_t high = b->end() / size;
        const bool below = &a == &target && high <= first;
        for (std::size_t i = 0; i < (high > low ? high - low : 0) && stolen.size() < wanted; ++i) {
          const std::size_t p = below ? low + i : high - 1 - i;
          if (!a.mapped(p) || a.held(p) != size || a.retiring(p) || skip(a, p)) continue;
          // The last free over the page, not the block's newest, must be behind a recorded
          // point, for the old mapping to wait for: a block freed just now takes in the
          // blocks freed before it, and a request that needs the lent page's address again
          // waits only for the work before its own free, not for the whole block's.
          const std::uint64_t epoch = a.freed_epoch(p, record, b->epoch);
          if (!clock_.point_after(record, epoch)) return stolen;
          took();
          --mapped_pages_[page_class(a)];
          stolen.push_back(a.lend_page(p, record, epoch));
          retiring_.emplace_back(&a, p);
        }
      }
    }
  }
  return stolen;
}

void page_supply::give_back_idle_pages_of_other_sizes(std::size_t size, std::size_t bytes) {
  // Idle pages of the other size go back to the device (unmapped, released from the
  // pool), so that the memory is made again in pages of `size`: what one size frees, the
  // other can take, at the cost of a release and a create instead of a stitch.
  std::size_t freed = 0;
  unmap_idle_pages([&](std::size_t s) { return s != size; }, no_skip, [&] { return freed < bytes; },
                   [&](const arena& a, shared_chunk) {  // back to the pool as it goes
                     ++counts_.released;
                     freed += a.page_size();
                     if (a.page_size() == page_) learned_headroom_ += page_;
                   });
  if (freed == 0) return;
  const std::size_t pool_reserved = pool_->statistics().reserved_current;
  pool_->trim_to(pool_reserved > freed ? pool_reserved - freed : 0);
}

void page_supply::pass_pending_of_other_sizes(std::size_t size, std::size_t bytes) {
  // What has passed becomes free for everyone only where the reuse policies allow it:
  // otherwise the pages stay held, and waiting would free nothing.
  if (!limits_.allow_opportunistic) return;
  // The allocating stream's pending blocks in arenas of the other size, with the bytes of
  // the whole pages each has mapped, oldest free first: the host waits for the last one needed.
  stream_record& record = *caller_;
  std::vector<std::pair<std::uint64_t, std::size_t>> frees;  // (epoch, bytes)
  for (std::size_t i = 0; i < arenas_.count(); ++i) {
    arena& a = arenas_.at(i);
    if (a.page_size() == size) continue;
    for (const auto& slot : a.slots()) {
      if (slot->record != &record) continue;
      for (const block* b = slot->oldest; b != nullptr; b = b->next_pending) {
        const std::uint64_t first = (b->offset + a.page_size() - 1) / a.page_size() * a.page_size();
        const std::uint64_t end = b->end() / a.page_size() * a.page_size();
        if (end <= first) continue;
        const std::size_t count = (end - first) / a.page_size();
        if (const std::size_t mapped = count - a.unmapped_pages(first, end - first, count); mapped != 0)
          frees.emplace_back(b->epoch, mapped * a.page_size());
      }
    }
  }
  if (frees.empty()) return;
  std::sort(frees.begin(), frees.end());
  std::uint64_t epoch = 0;
  std::size_t found = 0;
  for (auto it = frees.begin(); it != frees.end() && found < bytes; ++it) {
    epoch = it->first;
    found += it->second;
  }
  {
    // The free must be behind a recorded point, for the host to wait for.
    std::lock_guard record_lock(record.mutex);
    if (!clock_.point_after(record, epoch)) return;
  }
  clock_.wait_past(record, epoch);  // point_after may have waited already
  arenas_.release_passed();
}

std::vector<std::pair<shared_chunk, bool>> page_supply::take_pages(const arena& target, std::size_t first,
                                                                   std::size_t count, std::size_t wanted) {
  // Spare pages first, then pages stitched from idle places (once the resource holds as
  // much as it ever needed, or at its maximum), then idle pages of the other size given
  // back, then fresh ones from the pool; a full device lets idle pages be stitched after all.
  std::vector<std::pair<shared_chunk, bool>> taken;  // (page, created for this request)
  const std::size_t size = target.page_size();
  std::vector<shared_chunk>& spare = spare_[page_class(target)];
  while (taken.size() < wanted && !spare.empty()) {
    taken.emplace_back(std::move(spare.back()), false);
    spare.pop_back();
  }
  const auto reserved = [&] { return reserved_bytes() + taken.size() * size; };
  const auto steal = [&](std::size_t n) {
    for (shared_chunk& chunk : steal_idle_pages(target, first, count, n))
      taken.emplace_back(std::move(chunk), false);
  };
  // Pages short of `wanted` that would take the reserved memory past what it may grow to.
  const auto beyond_room = [&]() -> std::size_t {
    const std::size_t limit = std::min<std::size_t>(stitch_limit(), limits_.max_size);
    const std::size_t room = limit > reserved() ? (limit - reserved()) / size : 0;
    return wanted - taken.size() > room ? wanted - taken.size() - room : 0;
  };
  // A failure anywhere gives the pages taken so far (none created) back as spare.
  try {
    if (const std::size_t beyond = beyond_room(); beyond != 0) steal(beyond);
    if (large_page_ != page_) {
      if (const std::size_t beyond = beyond_room(); beyond != 0)
        give_back_idle_pages_of_other_sizes(size, beyond * size);
      // Pages of the other size that blocks freed on the allocating stream hold cannot be
      // lent (the sizes differ) and cannot go back to the device before the stream passes
      // the free; without them, a program running ahead of its GPU reserves again what it
      // has just freed in the other size. Where making every page still missing would take
      // the reserved memory past wait_limit(), the host waits for the stream instead, and
      // the pages are made again in this size.
      if (const std::size_t beyond = beyond_room();
          beyond != 0 && caller_ != nullptr && !clock_.synchronous())
        if (const std::size_t after = reserved() + (wanted - taken.size()) * size; after > wait_limit()) {
          pass_pending_of_other_sizes(size, after - wait_limit());
          give_back_idle_pages_of_other_sizes(size, beyond * size);
        }
    }
    while (taken.size() < wanted) {
      if (reserved() + size > limits_.max_size)
        throw out_of_memory(fmt::format("memory_resource: max_size of {} bytes reached", limits_.max_size));
      try {
        taken.emplace_back(std::make_shared<const pooled_chunk>(pool_->acquire(size)), true);
      } catch (const out_of_memory&) {
        const std::size_t before = taken.size();
        steal(wanted - taken.size());  // the device is full: idle pages of ours instead
        if (taken.size() == before) throw;
      }
    }
  } catch (...) {
    for (auto& [chunk, fresh] : taken)
      if (!fresh) spare.push_back(std::move(chunk));
    throw;
  }
  return taken;
}

bool page_supply::unmap_retiring(arena& a, std::size_t p, bool wait) {
  const page& lent = a.page_at(p);
  if (lent.retiring_on->passed.load() < lent.retiring_epoch) {
    if (!wait) return false;
    clock_.wait_past(*lent.retiring_on, lent.retiring_epoch);
  }
  return a.drop_retiring(p);
}

void page_supply::unmap_passed_retiring(bool wait) {
  std::erase_if(retiring_, [&](const std::pair<arena*, std::size_t>& entry) {
    return unmap_retiring(*entry.first, entry.second, wait);
  });
}
void page_supply::map(arena& a, std::uint64_t offset, std::uint64_t size) {
  const auto [first, count] = a.page_span(offset, size);
  // Pages taken for this run, and whether each was created for it: a failure gives the
  // created ones back to the pool and keeps the others spare, so that the reserved memory
  // is what it was.
  std::vector<std::size_t> mapped_now;
  std::vector<std::size_t> missing;
  for (std::size_t p = first; p < first + count; ++p)
    if (!a.mapped(p)) missing.push_back(p);
  // A page lent away with its old mapping still here: its stream must pass the free
  // before the address is mapped again (choose() avoids this where it can).
  for (std::size_t p : missing)
    if (a.retiring(p)) {
      if (!unmap_retiring(a, p, true))
        throw driver_error(0, "memory_resource: an address lent away could not be unmapped");
      std::erase(retiring_, std::pair{&a, p});
    }
  std::vector<std::pair<shared_chunk, bool>> taken = take_pages(a, first, count, missing.size());
  try {
    for (std::size_t i = 0; i < missing.size(); ++i) {
      const std::size_t p = missing[i];
      a.map_page(p, taken[i].first);
      ++mapped_pages_[page_class(a)];
      mapped_now.push_back(p);
    }
    // One access call per run of pages mapped now: the driver's cost is per call and handle.
    for (std::size_t i = 0; i < mapped_now.size();) {
      std::size_t j = i + 1;
      while (j < mapped_now.size() && mapped_now[j] == mapped_now[j - 1] + 1) ++j;
      pool_->provider()->set_access(a.base() + mapped_now[i] * a.page_size(), (j - i) * a.page_size(),
                                    grants_);
      i = j;
    }
  } catch (...) {
    for (std::size_t p : mapped_now) {
      if (a.unmap_page(p) == nullptr) {  // stays mapped: a later allocation uses it
        std::erase_if(taken, [&](const auto& t) { return t.first == a.chunk(p); });
        continue;
      }
      --mapped_pages_[page_class(a)];
    }
    for (auto& [chunk, fresh] : taken)  // the fresh ones go back to the pool
      if (!fresh) spare_[page_class(a)].push_back(std::move(chunk));
    throw;
  }
  for (const auto& t : taken) counts_.created += t.second ? 1 : 0;
  const std::size_t reserved = reserved_bytes();
  reserved_high_ = std::max(reserved_high_, reserved);
  over_threshold_.store(reserved > limits_.release_threshold, std::memory_order_relaxed);
}

void page_supply::give_back(std::size_t bytes_to_keep) {
  unmap_passed_retiring(false);
  for (std::vector<shared_chunk>& spare : spare_)
    while (!spare.empty() && reserved_bytes() > bytes_to_keep) {
      spare.pop_back();  // back to the chunk pool
      ++counts_.released;
    }
  unmap_idle_pages([](std::size_t) { return true; }, no_skip,
                   [&] { return reserved_bytes() > bytes_to_keep; },
                   [&](const arena&, shared_chunk) { ++counts_.released; });  // back to the pool
  over_threshold_.store(reserved_bytes() > limits_.release_threshold, std::memory_order_relaxed);
}

void page_supply::give_back_all() {
  unmap_passed_retiring(true);  // the old mappings of lent pages too
  // Every page goes: the physical memory back to the pool, and the pool's idle memory back
  // to the device.
  for (std::size_t i = 0; i < arenas_.count(); ++i) {
    arena& a = arenas_.at(i);
    for (std::size_t p = 0; p < a.page_count(); ++p) {
      if (!a.mapped(p) || a.unmap_page(p) == nullptr) continue;  // a page that cannot be unmapped stays
      --mapped_pages_[page_class(a)];
      ++counts_.released;
    }
  }
  for (std::vector<shared_chunk>& spare : spare_) {
    counts_.released += spare.size();
    spare.clear();
  }
  pool_->trim_to(0);
}

shared_chunk page_supply::fresh_page(std::size_t size, std::size_t also_taken) {
  if (limits_.max_size < reserved_bytes() + also_taken + size)
    throw out_of_memory(fmt::format("max_size of {} bytes reached", limits_.max_size));
  return std::make_shared<const pooled_chunk>(pool_->acquire(size));
}

void page_supply::map_fresh(arena& a, std::size_t p, shared_chunk chunk) {
  a.map_page(p, std::move(chunk));
  ++mapped_pages_[page_class(a)];
}

void page_supply::grant(const arena& a, std::size_t first, std::size_t count) {
  pool_->provider()->set_access(a.base() + first * a.page_size(), count * a.page_size(), grants_);
}

void page_supply::unmap_fresh(arena& a, std::size_t p) noexcept {
  if (a.unmap_page(p) != nullptr) --mapped_pages_[page_class(a)];
}

void page_supply::note_created(std::size_t pages) {
  counts_.created += pages;
  reserved_high_ = std::max(reserved_high_, reserved_bytes());
}

void page_supply::trim_pool() {
  pool_->trim_to(0);
}

void page_supply::set_access(std::vector<access_grant> next) {
  for (std::size_t i = 0; i < arenas_.count(); ++i) {
    arena& a = arenas_.at(i);
    for (std::size_t p = 0; p < a.page_count();) {
      if (!a.mapped(p)) {
        ++p;
        continue;
      }
      std::size_t q = p + 1;
      while (a.mapped(q)) ++q;
      pool_->provider()->set_access(a.base() + p * a.page_size(), (q - p) * a.page_size(), next);
      p = q;
    }
  }
  grants_ = std::move(next);
}

}  // namespace vmm::detail
