#include "resource/placement.hpp"

#include <algorithm>

#include "vmm/error.hpp"
#include "vmm/provider.hpp"

namespace vmm::detail {
namespace {

constexpr int candidates_weighed = 16;  // free blocks compared per index
// choose(): a page lent away and not passed yet counts as this many pages to map.
constexpr std::size_t retiring_penalty = std::size_t{1} << 16;

}  // namespace

placement::stream_entry& placement::add_entry(stream_ref stream, bool sync) {
  // First use of the stream: its record and its two home arenas. Arenas are made outside
  // the fast path's locks (the resource's mutex only); adding one never moves another.
  if (stream_entry* e = sync_entry_.load(); sync && e != nullptr) return *e;
  for (const auto& e : entries_)
    if (!sync && e.get() != sync_entry_.load() && e->record->stream == stream) return *e;
  auto entry = std::make_unique<stream_entry>();
  // Addresses are cheap: the large arena spans twice the memory the resource may reserve,
  // so that holes left by freed blocks never run it out; small blocks need far less.
  entry->arenas[0].push_back(&arenas_.add(std::max(max_size_ / 8, std::size_t{64} << 20), page_));
  entry->arenas[1].push_back(&arenas_.add(2 * max_size_, page_));
  if (large_limit_ != ~std::uint64_t{0})
    entry->arenas[2].push_back(&arenas_.add(round_up(2 * max_size_, large_page_), large_page_));
  entries_.reserve(entries_.size() + 1);
  entry->record = &clock_.add(stream, sync);
  stream_entry* made = entry.get();
  entries_.push_back(std::move(entry));
  if (sync) {
    sync_entry_.store(made, std::memory_order_release);
  } else {
    const std::size_t start = slot_of(stream);
    for (std::size_t i = 0; i < table_.size(); ++i) {
      auto& slot = table_[(start + i) % table_.size()];
      stream_entry* expected = nullptr;
      if (slot.compare_exchange_strong(expected, made, std::memory_order_acq_rel)) break;
    }
  }
  return *made;
}

void* placement::try_mapped(arena& home, stream_record* record, std::uint64_t size, std::uint64_t alignment,
                            std::uint32_t tag, std::uint8_t slack) {
  std::lock_guard lock(home.mutex);
  if (size < small_limit)  // only small blocks wait in quick bins (deallocate)
    if (block* b = home.take_quick(size, alignment, record)) {
      b->tag = tag;
      b->slack = slack;
      ++home.allocations_made;
      return reinterpret_cast<void*>(home.base() + b->offset);
    }
  const auto search = [&](free_index& index) -> void* {
    block* found = nullptr;
    std::uint64_t start = 0;
    int weighed = 0;
    index.candidates(size, [&](block* b) {
      const std::uint64_t at = arena::fit(b, size, alignment);
      if (at != ~std::uint64_t{0} && home.all_mapped(at, size)) {
        found = b;
        start = at;
        return true;
      }
      return ++weighed >= candidates_weighed;
    });
    if (found == nullptr) return nullptr;
    block* b = home.carve(found, start, size);
    b->tag = tag;
    b->slack = slack;
    ++home.allocations_made;
    return reinterpret_cast<void*>(home.base() + b->offset);
  };
  const auto search_all = [&]() -> void* {
    if (record != nullptr)
      for (auto& slot : home.slots())
        if (slot->record == record)
          if (void* p = search(slot->pending)) return p;
    return search(home.released());
  };
  if (void* p = search_all()) return p;
  // The cached blocks, freed as they would have been, may make the run that fits.
  if (home.cached_count() == 0) return nullptr;
  home.flush_quick(policies_.allow_opportunistic);
  return search_all();
}

placement::choice placement::choose(arena& a, free_index& index, std::uint64_t size, std::uint64_t alignment,
                                    std::size_t better_than) const {
  choice best;
  best.unmapped = better_than;
  int weighed = 0;
  // Pages to map at `at`; pages lent away and not passed yet would make the stream wait:
  // last resort.
  const auto pages_to_map = [&](std::uint64_t at) {
    std::size_t unmapped = a.unmapped_pages(at, size, best.unmapped);
    if (unmapped != 0) unmapped += a.retiring_pages(at, size) * retiring_penalty;
    return unmapped;
  };
  index.candidates(size, [&](block* b) {
    std::uint64_t at = arena::fit(b, size, alignment);
    if (at == ~std::uint64_t{0}) return ++weighed >= candidates_weighed * 4;
    std::size_t unmapped = pages_to_map(at);
    // The block's far end, where its start lacks pages and the far end fewer: what a block
    // freed just below a live one leaves once merged with the free addresses under it, as a
    // tensor grown by x = cat(x, y) does at every step. Its pages are used where they are
    // instead of being moved. A pending block only when no page below the far end is mapped:
    // pages left idle there could be lent only once its stream passes the free.
    if (const std::uint64_t far = (b->end() - size) & ~(alignment - 1);
        unmapped != 0 && far > at && (b->owner == 0 || a.none_mapped(b->offset, far - b->offset)))
      if (const std::size_t there = pages_to_map(far); there < unmapped) {
        at = far;
        unmapped = there;
      }
    // Inside a block larger than the request by a page or more, the run with the fewest
    // pages to map: a large free block (the top of an arena, where the largest blocks of a
    // step come and go) holds the pages of the blocks freed in it where they lay, and a
    // request a little larger or smaller than one of them takes those pages where they are
    // instead of moving them from the block's start (docs/design/memory_resource.md,
    // "Placement"). Linear in the block's pages that have been held, as is mapping one.
    if (unmapped != 0 && b->size >= size + a.page_size())
      if (const auto [start, fewest] = a.fewest_unmapped(b->offset, b->end(), size); fewest < unmapped)
        if (const std::size_t there = pages_to_map(start); there < unmapped) {
          at = start;
          unmapped = there;
        }
    if (unmapped < best.unmapped) best = choice{&a, b, at, unmapped};
    return best.unmapped == 0 || ++weighed >= candidates_weighed;
  });
  return best;
}

void* placement::take(const choice& chosen, std::uint64_t size) {
  arena& a = *chosen.where;
  const std::uint32_t owner = chosen.b->owner;
  const std::uint64_t epoch = chosen.b->epoch;
  block* b = a.carve(chosen.b, chosen.start, size);
  if (chosen.unmapped != 0) {
    try {
      supply_.map(a, b->offset, size);
    } catch (...) {
      // Back where it was. A pending block lacks pages where it took in released
      // neighbours; it stays pending on its stream, whose free has not passed.
      if (owner == 0)
        a.free_released(b);
      else
        a.free_pending(b, *a.slots()[owner - 1], epoch);
      throw;
    }
  }
  return reinterpret_cast<void*>(a.base() + b->offset);
}

placement::choice placement::mapped_run(const stream_entry& entry, std::size_t kind, std::uint64_t size,
                                        std::uint64_t alignment, bool sync) {
  for (arena* a : entry.arenas[kind]) {
    if (!sync)
      for (auto& slot : a->slots())
        if (slot->record == entry.record)
          if (choice c = choose(*a, slot->pending, size, alignment, 1); c.b != nullptr) return c;
    if (choice c = choose(*a, a->released(), size, alignment, 1); c.b != nullptr) return c;
  }
  return {};
}

void* placement::place(arena& a, free_index& index, std::uint64_t size, std::uint64_t alignment) {
  const choice chosen = choose(a, index, size, alignment, std::numeric_limits<std::size_t>::max());
  return chosen.b == nullptr ? nullptr : take(chosen, size);
}

void* placement::place_with_dependency(stream_entry& entry, std::size_t kind, std::uint64_t size,
                                       std::uint64_t alignment, bool wait_allowed) {
  // Blocks freed on other streams, in this size class's arenas: those the allocating
  // stream is already ordered after (follow_event_dependencies), then, when allowed, any
  // (the allocating stream is made to wait for the freeing stream's point).
  stream_record& me = *entry.record;
  for (const auto& other : entries_) {
    if (other.get() == &entry || other.get() == sync_entry_.load()) continue;
    stream_record& record = *other->record;
    std::uint64_t ordered_after = 0;
    {
      std::lock_guard lock(record.mutex);
      for (const auto& [stream, epoch] : record.waited_by)
        if (stream == me.stream) ordered_after = std::max(ordered_after, epoch);
    }
    for (arena* a : other->arenas[kind]) {
      for (auto& slot : a->slots()) {
        if (slot->record != &record) continue;
        block* chosen = nullptr;
        slot->pending.candidates(size, [&](block* b) {
          if (arena::fit(b, size, alignment) == ~std::uint64_t{0}) return false;
          const bool followed = policies_.follow_event_dependencies && b->epoch <= ordered_after;
          if (followed || (wait_allowed && policies_.allow_internal_dependencies)) chosen = b;
          return chosen != nullptr;
        });
        if (chosen == nullptr) continue;
        if (chosen->epoch > ordered_after) {
          // Internal dependency: the allocating stream waits for the freeing stream's point
          // after this block's free. A block of an epoch still open has no such point (and
          // the freeing stream may be gone): it is not taken.
          std::lock_guard lock(record.mutex);
          const auto point = std::find_if(record.points.begin(), record.points.end(),
                                          [&](const auto& p) { return p.first >= chosen->epoch; });
          if (point == record.points.end()) continue;
          point->second.enqueue_wait(me.stream);
        }
        // Carved from that block itself: the bytes around the request stay pending on the
        // freeing stream, since only this stream has been ordered after the free.
        const std::uint64_t start = arena::fit(chosen, size, alignment);
        return take(
            choice{a, chosen, start, a->unmapped_pages(start, size, std::numeric_limits<std::size_t>::max())},
            size);
      }
    }
  }
  return nullptr;
}

void* placement::place_slow(stream_entry& entry, std::size_t kind, std::uint64_t size,
                            std::uint64_t alignment, bool sync, std::string& shortage) {
  // Runs one way of placing the request; an out-of-memory of one way (no pages for it)
  // lets the next be tried.
  const auto attempt_with = [&](auto&& option) -> void* {
    try {
      return option();
    } catch (const out_of_memory& error) {
      shortage = error.what();
      return nullptr;
    }
  };
  // A request of small pages of at least a large page takes a run whose pages are all
  // mapped, in its own arenas or else in those of large pages, before any page is moved
  // or made: the memory that large blocks (activations of changing shapes) free from step
  // to step then serves it where it is, instead of going back to the device in large pages
  // while small ones are made again. Smaller requests would hold large pages for little
  // (docs/design/memory_resource.md, "Two page sizes").
  if (kind == 1 && large_limit_ != ~std::uint64_t{0} && size >= large_page_)
    for (const std::size_t k : {std::size_t{1}, std::size_t{2}})
      if (const choice c = mapped_run(entry, k, size, alignment, sync); c.b != nullptr) return take(c, size);
  arena& home = *entry.arenas[kind].back();
  if (!sync)
    for (auto& slot : home.slots())
      if (slot->record == entry.record)
        if (void* p = attempt_with([&] { return place(home, slot->pending, size, alignment); })) return p;
  // The released blocks of every arena of this size class (other streams' arenas only
  // when their frees may be reused: they have passed): the one that needs the fewest new
  // pages, this stream's own arenas first on a tie.
  choice best;
  for (arena* a : entry.arenas[kind])
    if (choice c = choose(*a, a->released(), size, alignment, best.unmapped); c.b != nullptr) best = c;
  if (policies_.allow_opportunistic)
    for (const auto& other : entries_)
      if (other.get() != &entry)
        for (arena* a : other->arenas[kind])
          if (choice c = choose(*a, a->released(), size, alignment, best.unmapped); c.b != nullptr) best = c;
  if (best.b != nullptr)
    if (void* p = attempt_with([&] { return take(best, size); })) return p;
  if (!sync)
    if (void* p = attempt_with([&] { return place_with_dependency(entry, kind, size, alignment, true); }))
      return p;
  if (shortage.empty()) {
    // No address run fits anywhere: a new arena for this stream.
    const std::size_t page_size = kind == 2 ? large_page_ : page_;
    arena* added = nullptr;
    try {  // an address range the provider refuses is this request's shortage too
      added = &arenas_.add(round_up(std::max<std::size_t>(2 * max_size_, size), page_size), page_size);
    } catch (const out_of_memory& error) {
      shortage = error.what();
    }
    if (added != nullptr) {
      std::unique_lock<arena_mutex> hold(added->mutex);
      entry.arenas[kind].push_back(added);
      if (void* p = attempt_with([&] { return place(*added, added->released(), size, alignment); })) return p;
    }
  }
  return nullptr;
}

void placement::release_passed() noexcept {
  if (policies_.allow_opportunistic) arenas_.release_passed();
}

}  // namespace vmm::detail
