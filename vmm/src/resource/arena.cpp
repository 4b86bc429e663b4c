#include "resource/arena.hpp"

#include <algorithm>
#include <bit>

namespace vmm::detail {

arena::arena(std::shared_ptr<memory_provider> provider, std::size_t bytes, std::size_t page_size)
    : page_size_(page_size),
      page_shift_(static_cast<unsigned>(std::countr_zero(page_size))),
      range_(std::move(provider), bytes) {
  block* all = new_block();
  all->offset = 0;
  all->size = range_.size();
  all->free = true;
  released_.insert(all);
}

arena::~arena() = default;

void arena::add_spare_blocks() {
  constexpr std::size_t batch = 256;
  block_storage_.push_back(std::make_unique<block[]>(batch));
  block* fresh = block_storage_.back().get();
  for (std::size_t i = 0; i < batch; ++i) {
    fresh[i].next_free = spare_blocks_;
    spare_blocks_ = &fresh[i];
  }
}

stream_slot& arena::add_slot(stream_record& record) {
  slots_.push_back(std::make_unique<stream_slot>());
  slots_.back()->record = &record;
  slots_.back()->owner = static_cast<std::uint32_t>(slots_.size());
  return *slots_.back();
}

std::size_t page_bits::unmapped(std::size_t first, std::size_t count, std::size_t stop) const noexcept {
  const std::size_t end = std::clamp(known, first, first + count);
  std::size_t missing = first + count - end;  // pages never held are not mapped
  for (std::size_t p = first; p < end && missing < stop;) {
    const std::size_t bit = p % 64;
    const std::size_t n = std::min<std::size_t>(64 - bit, end - p);
    const std::uint64_t span = n < 64 ? (std::uint64_t{1} << n) - 1 : ~std::uint64_t{0};
    // Counted only where a page is missing: without -mpopcnt, std::popcount is a call.
    if (const std::uint64_t bits = ~(mapped[p / 64] >> bit) & span; bits != 0)
      missing += static_cast<std::size_t>(std::popcount(bits));
    p += n;
  }
  return std::min(missing, stop);
}

std::uint64_t page_bits::unmapped_from(std::size_t p) const noexcept {
  const auto word = [&](std::size_t w) -> std::uint64_t {
    if (w >= mapped.size() || w * 64 >= known) return 0;
    const std::size_t valid = known - w * 64;
    return valid >= 64 ? mapped[w] : mapped[w] & ((std::uint64_t{1} << valid) - 1);
  };
  const std::size_t w = p / 64;
  const auto bit = static_cast<unsigned>(p % 64);
  std::uint64_t bits = word(w) >> bit;
  if (bit != 0) bits |= word(w + 1) << (64 - bit);
  return ~bits;
}

std::pair<std::size_t, std::size_t> page_bits::fewest_unmapped(std::size_t low, std::size_t high,
                                                               std::size_t n) const noexcept {
  std::size_t missing = unmapped(low, n, n);
  std::size_t best = missing;
  std::size_t best_start = low;
  // From start s - 1 to s, page s - 1 leaves the run and page s + n - 1 enters it: 64
  // starts at a time, the count changes only where exactly one of the two is mapped.
  for (std::size_t first = low + 1; first <= high && best != 0; first += 64) {
    const std::size_t starts = std::min<std::size_t>(64, high - first + 1);
    const std::uint64_t in_word = starts < 64 ? (std::uint64_t{1} << starts) - 1 : ~std::uint64_t{0};
    const std::uint64_t leaving = unmapped_from(first - 1) & in_word;
    const std::uint64_t entering = unmapped_from(first + n - 1) & in_word;
    for (std::uint64_t changes = leaving ^ entering; changes != 0; changes &= changes - 1) {
      const auto i = static_cast<unsigned>(std::countr_zero(changes));
      if ((leaving >> i & 1) == 0) {
        ++missing;
      } else if (--missing < best) {
        best = missing;
        best_start = first + i;
        if (best == 0) break;
      }
    }
  }
  return {best_start, best};
}

std::size_t arena::unmapped_pages(std::uint64_t offset, std::uint64_t size, std::size_t stop) const noexcept {
  const auto [first, count] = page_span(offset, size);
  return mapped_pages().unmapped(first, count, stop);
}

std::pair<std::uint64_t, std::size_t> arena::fewest_unmapped(std::uint64_t begin, std::uint64_t end,
                                                             std::uint64_t size) const noexcept {
  const std::uint64_t first_start = (begin + page_size_ - 1) & ~std::uint64_t{page_size_ - 1};
  if (size == 0 || first_start > end || end - first_start < size) return {~std::uint64_t{0}, ~std::size_t{0}};
  const std::size_t n = static_cast<std::size_t>((size + page_size_ - 1) >> page_shift_);
  const std::size_t low = static_cast<std::size_t>(first_start >> page_shift_);
  // A start past page_count() has no page mapped: the starts up to it are all that differ.
  const std::size_t high = std::min<std::size_t>(static_cast<std::size_t>((end - size) >> page_shift_),
                                                 std::max(low, page_count()));
  const auto [start, fewest] = mapped_pages().fewest_unmapped(low, high, n);
  return {std::uint64_t{start} << page_shift_, fewest};
}

std::size_t arena::idle_page_below(std::size_t end) const noexcept {
  for (std::size_t p = std::min(end, held_.size()); p > 0;) {
    const std::size_t word = (p - 1) / 64;
    const unsigned last = static_cast<unsigned>((p - 1) % 64);
    std::uint64_t bits =
        mapped_bits_[word] & (last == 63 ? ~std::uint64_t{0} : (std::uint64_t{2} << last) - 1);
    while (bits != 0) {
      const unsigned bit = 63u - static_cast<unsigned>(std::countl_zero(bits));
      if (held_[word * 64 + bit] == 0) return word * 64 + bit;
      bits &= ~(std::uint64_t{1} << bit);
    }
    p = word * 64;
  }
  return held_.size();
}

void arena::map_page(std::size_t p, shared_chunk chunk) {
  page& target = pages_[p];
  target.mapped =
      mapping(chunk->memory(), base() + (std::uint64_t{p} << page_shift_), std::span<const access_grant>{});
  target.chunk = std::move(chunk);
  mapped_bits_[p / 64] |= std::uint64_t{1} << (p % 64);
}

shared_chunk arena::unmap_page(std::size_t p) noexcept {
  page& target = pages_[p];
  if (!target.mapped.reset()) return nullptr;
  mapped_bits_[p / 64] &= ~(std::uint64_t{1} << (p % 64));
  return std::move(target.chunk);
}

shared_chunk arena::lend_page(std::size_t p, stream_record& on, std::uint64_t epoch) noexcept {
  page& target = pages_[p];
  target.retiring = std::move(target.mapped);
  target.retiring_on = &on;
  target.retiring_epoch = epoch;
  ++retiring_count_;
  mapped_bits_[p / 64] &= ~(std::uint64_t{1} << (p % 64));
  return std::move(target.chunk);
}

std::size_t arena::retiring_pages(std::uint64_t offset, std::uint64_t size) const noexcept {
  if (retiring_count_ == 0) return 0;
  const auto [first, count] = page_span(offset, size);
  std::size_t n = 0;
  for (std::size_t p = first; p < first + count && p < pages_.size(); ++p) n += retiring(p) ? 1 : 0;
  return n;
}

bool arena::drop_retiring(std::size_t p) noexcept {
  page& target = pages_[p];
  if (!target.retiring.reset()) return false;
  target.retiring_on = nullptr;
  --retiring_count_;
  return true;
}

void arena::add_pages(std::size_t count, bool in_pending) {
  const std::size_t known = held_.size();
  // Room for twice the pages known, at least: an arena's pages get state one run at a
  // time, and room for exactly the next run would move every page's state at each step.
  // Each may throw: then nothing has grown but capacity.
  const auto make_room = [](auto& state, std::size_t n) {
    if (n > state.capacity()) state.reserve(std::max(n, 2 * state.capacity()));
  };
  make_room(held_, count);
  make_room(mapped_bits_, (count + 63) / 64);
  make_room(freed_, count);
  make_room(pages_, count);
  held_.resize(count);
  mapped_bits_.resize((count + 63) / 64);
  freed_.resize(count);
  pages_.resize(count);
  // Every page past the known ones lies whole in the arena's last block (every other block
  // ends below them): held by it whole when it is pending.
  if (in_pending) std::fill(held_.begin() + static_cast<std::ptrdiff_t>(known), held_.end(), page_size_);
}

void arena::hold(std::uint64_t offset, std::uint64_t size, bool add) noexcept {
  // Pages past page_count() have no state: they lie whole in the arena's last block, held
  // by it exactly when it is pending, and cover_pages() writes that when it reaches them.
  // So a pending block that takes in the arena's released tail (most of its addresses)
  // costs a step per page it has used, not per page of the arena.
  const auto [first, count] = page_span(offset, size);
  const std::size_t known = held_.size();
  std::uint64_t* held = held_.data();
  const auto change = [&](std::size_t p, std::uint64_t bytes) {
    if (p >= known) return;
    if (add)
      held[p] += bytes;
    else
      held[p] -= bytes;
  };
  if (count == 1) return change(first, size);
  // The first and the last page may be held in part, every page between them whole (a
  // loop of its own for each direction: no test in the body, which the compiler unrolls).
  const std::size_t last = first + count - 1;
  change(first, ((std::uint64_t{first} + 1) << page_shift_) - offset);
  const std::size_t whole_end = std::min(last, known);
  if (add)
    for (std::size_t p = first + 1; p < whole_end; ++p) held[p] += page_size_;
  else
    for (std::size_t p = first + 1; p < whole_end; ++p) held[p] -= page_size_;
  change(last, offset + size - (std::uint64_t{last} << page_shift_));
}

void arena::unlink_pending(stream_slot& slot, block* b) noexcept {
  if (b->previous_pending != nullptr)
    b->previous_pending->next_pending = b->next_pending;
  else
    slot.oldest = b->next_pending;
  if (b->next_pending != nullptr)
    b->next_pending->previous_pending = b->previous_pending;
  else
    slot.newest = b->previous_pending;
  b->previous_pending = b->next_pending = nullptr;
}

void arena::insert_pending(stream_slot& slot, block* b) noexcept {
  // A free's epoch is the newest but for a block a quick bin kept: from the newest back.
  block* before = slot.newest;
  while (before != nullptr && before->epoch > b->epoch) before = before->previous_pending;
  b->previous_pending = before;
  b->next_pending = before != nullptr ? before->next_pending : slot.oldest;
  if (b->next_pending != nullptr)
    b->next_pending->previous_pending = b;
  else
    slot.newest = b;
  if (before != nullptr)
    before->next_pending = b;
  else
    slot.oldest = b;
}

void arena::insert_pending_before(stream_slot& slot, block* at, block* b) noexcept {
  b->next_pending = at;
  b->previous_pending = at->previous_pending;
  if (at->previous_pending != nullptr)
    at->previous_pending->next_pending = b;
  else
    slot.oldest = b;
  at->previous_pending = b;
}

block* arena::merge_free(block* b) noexcept {
  // A block pending on a stream also takes in released neighbours: that stream may use
  // them at once, and one run serves a later request better than two pieces of different
  // owners (others get the whole run once the stream's point passes). The bytes taken in
  // count as held from then on, as pending bytes do (hold(): on the pages that have state).
  const auto mergeable = [&](const block* n) {
    return n != nullptr && n->free && (n->owner == b->owner || (b->owner != 0 && n->owner == 0));
  };
  block* left = mergeable(b->previous) ? b->previous : nullptr;
  block* right = mergeable(b->next) ? b->next : nullptr;
  free_index& index = index_of(b);
  stream_slot* slot = b->owner != 0 ? slots_[b->owner - 1].get() : nullptr;
  // What survives: a neighbour already in b's index keeps its place there (most frees
  // leave it in the same size list), else b goes in.
  block* keep = left != nullptr && left->owner == b->owner     ? left
                : right != nullptr && right->owner == b->owner ? right
                                                               : b;
  const std::uint64_t kept_size = keep->size;
  // Merged pending blocks go by the newest epoch among them (released ones are free for
  // every stream already: theirs does not count).
  std::uint64_t epoch = b->epoch;
  for (block* n : {left, right}) {
    if (n == nullptr) continue;
    if (n->owner != 0) {
      epoch = std::max(epoch, n->epoch);
      unlink_pending(*slots_[n->owner - 1], n);  // keep too: it goes back in by the epoch
    } else if (b->owner != 0) {
      hold(n->offset, n->size, true);
    }
    if (n != keep) index_of(n).remove(n);
  }
  block* first = left != nullptr ? left : b;
  block* last = right != nullptr ? right : b;
  const std::uint64_t offset = first->offset;
  const std::uint64_t end = last->end();
  block* before = first->previous;
  block* after = last->next;
  for (block* n : {left, b, right})
    if (n != nullptr && n != keep) delete_block(n);
  keep->offset = offset;
  keep->size = end - offset;
  keep->epoch = epoch;
  keep->free = true;
  keep->previous = before;
  keep->next = after;
  if (before != nullptr) before->next = keep;
  if (after != nullptr) after->previous = keep;
  if (keep == b)
    index.insert(keep);
  else
    index.resized(keep, kept_size);
  if (slot != nullptr) insert_pending(*slot, keep);
  return keep;
}

block* arena::carve(block* b, std::uint64_t start, std::uint64_t size) {
  // The allocation gets a block of its own unless it takes `b` whole: `b` stays free as
  // what is left (the tail, else the head), where it is in its index and in its stream's
  // pending list. Only when both a head and a tail are left does the head need a block.
  // Every piece is made first: nothing below can fail once the books start to change.
  const std::uint64_t end = b->end();
  const bool head_left = start > b->offset;
  const bool tail_left = start + size < end;
  block* taken = head_left || tail_left ? new_block() : b;
  block* head = head_left && tail_left ? new_block() : nullptr;
  allocated_.reserve_one();
  cover_pages(start, size, b->owner != 0);
  free_index& index = index_of(b);
  const bool was_released = b->owner == 0;
  if (taken == b) {
    index.remove(b);
    if (!was_released) unlink_pending(*slots_[b->owner - 1], b);
  } else {
    const std::uint64_t old_size = b->size;
    if (head != nullptr) {  // head, taken, b
      head->offset = b->offset;
      head->size = start - b->offset;
      head->free = true;
      head->owner = b->owner;
      head->epoch = b->epoch;
      head->previous = b->previous;
      if (b->previous != nullptr) b->previous->next = head;
      head->next = taken;
      taken->previous = head;
      taken->next = b;
      b->previous = taken;
      index.insert(head);
      if (!was_released) insert_pending_before(*slots_[b->owner - 1], b, head);
    } else if (tail_left) {  // taken, b
      taken->previous = b->previous;
      if (b->previous != nullptr) b->previous->next = taken;
      taken->next = b;
      b->previous = taken;
    } else {  // b, taken
      taken->next = b->next;
      if (b->next != nullptr) b->next->previous = taken;
      taken->previous = b;
      b->next = taken;
    }
    if (tail_left) {
      b->offset = start + size;
      b->size = end - (start + size);
    } else {
      b->size = start - b->offset;
    }
    index.resized(b, old_size);
  }
  taken->offset = start;
  taken->size = size;
  taken->free = false;
  taken->owner = 0;
  taken->epoch = 0;
  if (was_released) hold(start, size, true);  // pending bytes were held already
  allocated_.insert(taken);
  return taken;
}

void arena::free_released(block* b) noexcept {
  allocated_.erase(b->offset);
  hold(b->offset, b->size, false);
  b->free = true;
  b->owner = 0;
  (void)merge_free(b);
}

void arena::free_pending(block* b, stream_slot& slot, std::uint64_t epoch) noexcept {
  const auto [first, count] = page_span(b->offset, b->size);
  for (std::size_t p = first; p < first + count && p < freed_.size(); ++p)
    if (freed_[p].on != slot.record || freed_[p].epoch < epoch) freed_[p] = {slot.record, epoch};
  allocated_.erase(b->offset);
  b->free = true;
  b->owner = slot.owner;
  b->epoch = epoch;
  (void)merge_free(b);
}

void arena::flush_bin(quick_bin& bin, bool release_passed) noexcept {
  while (bin.head != nullptr) {
    block* b = bin.head;
    bin.head = b->next_free;
    b->cached = false;
    --cached_count_;
    cached_bytes_ -= b->size;
    stream_slot* slot = bin.slot;
    if (slot == nullptr ||
        (release_passed && b->epoch <= slot->record->passed.load(std::memory_order_relaxed)))
      free_released(b);
    else
      free_pending(b, *slot, b->epoch);
  }
  bin.count = 0;
}

block* arena::release_one(stream_slot& slot, block* b) noexcept {
  slot.pending.remove(b);
  unlink_pending(slot, b);
  hold(b->offset, b->size, false);
  b->owner = 0;
  return merge_free(b);
}

std::size_t arena::release_pending(stream_slot& slot, std::uint64_t epoch) noexcept {
  std::size_t moved = 0;
  while (slot.oldest != nullptr && slot.oldest->epoch <= epoch) {
    (void)release_one(slot, slot.oldest);
    ++moved;
  }
  return moved;
}

}  // namespace vmm::detail
