#pragma once
// The free blocks of an arena that one owner may hand out, indexed by size in the manner of
// TLSF (two-level segregated fit): 16 lists per power of two, a bitmap over the lists, so
// that finding a list that holds a block of at least n bytes is two bit scans, whatever the
// number of free blocks. Blocks are intrusive: the arena owns them, the index only links.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace vmm::detail {

// One block of an arena: the arena is tiled by blocks, free and allocated, in address
// order (previous/next), and a free block is also in one owner's size lists.
struct block {
  std::uint64_t offset = 0;  // from the arena's start
  std::uint64_t size = 0;
  block* previous = nullptr;  // address order
  block* next = nullptr;
  block* previous_free = nullptr;     // the owner's size list, the free pool of blocks, or
  block* next_free = nullptr;         // (next_free only) a quick bin of the arena
  block* previous_pending = nullptr;  // the owner's list in order of epochs (pending only)
  block* next_pending = nullptr;
  std::uint64_t epoch = 0;  // pending or cached: the freeing stream's epoch when it was freed
  std::uint32_t owner = 0;  // free: 0 released, i > 0 pending on stream slot i - 1
  std::uint32_t tag = 0;    // allocated: the caller's tag (sleep and wake act by tag)
  bool free = false;
  bool cached = false;          // freed into a quick bin: allocated still, for the tiling
  std::uint8_t list_first = 0;  // free: the size list it is in (free_index keeps these)
  std::uint8_t list_second = 0;
  std::uint8_t slack = 0;  // allocated: size less the bytes asked for (deallocate checks them)
  [[nodiscard]] std::uint64_t end() const noexcept { return offset + size; }
};

class free_index {
 public:
  static constexpr unsigned unit_shift = 8;  // 256 bytes: the smallest size and alignment
  static constexpr unsigned second_bits = 4;
  static constexpr unsigned second_count = 1u << second_bits;
  static constexpr unsigned first_count = 48;

  void insert(block* b) noexcept {
    link(b);
    ++count_;
    bytes_ += b->size;
  }

  // `b` is in this index, with the size it was inserted with.
  void remove(block* b) noexcept {
    unlink(b);
    --count_;
    bytes_ -= b->size;
  }

  // `b`, in this index, is `old_size` bytes no more: it moves to the list of its size now
  // (a block that grows or shrinks a little mostly stays in its list).
  void resized(block* b, std::uint64_t old_size) noexcept {
    bytes_ += b->size - old_size;
    if (const auto [f, s] = classify(b->size); f == b->list_first && s == b->list_second) return;
    unlink(b);
    link(b);
  }

  // Calls visit(block*) for candidate blocks of at least `size` bytes, smallest lists first:
  // the list `size` falls in (whose blocks may be smaller), then the next non-empty lists,
  // all of whose blocks are large enough. visit returns true to stop.
  template <class Visit>
  void candidates(std::uint64_t size, Visit&& visit) const noexcept {
    auto [f, s] = classify(size);
    for (block* b = lists_[f][s]; b != nullptr; b = b->next_free)
      if (b->size >= size && visit(b)) return;
    // The next non-empty list above (f, s).
    for (;;) {
      std::uint32_t seconds = s + 1 < second_count ? second_bits_[f] & (~0u << (s + 1)) : 0;
      if (seconds == 0) {
        const std::uint64_t firsts = f + 1 < first_count ? first_bits_ & (~std::uint64_t{0} << (f + 1)) : 0;
        if (firsts == 0) return;
        f = static_cast<unsigned>(std::countr_zero(firsts));
        seconds = second_bits_[f];
      }
      s = static_cast<unsigned>(std::countr_zero(seconds));
      for (block* b = lists_[f][s]; b != nullptr; b = b->next_free)
        if (visit(b)) return;
    }
  }

  // The largest free block (0 when empty).
  [[nodiscard]] std::uint64_t largest() const noexcept {
    if (first_bits_ == 0) return 0;
    const unsigned f = 63u - static_cast<unsigned>(std::countl_zero(first_bits_));
    const unsigned s = 31u - static_cast<unsigned>(std::countl_zero(second_bits_[f]));
    std::uint64_t most = 0;
    for (block* b = lists_[f][s]; b != nullptr; b = b->next_free) most = b->size > most ? b->size : most;
    return most;
  }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  void link(block* b) noexcept {
    const auto [f, s] = classify(b->size);
    b->list_first = static_cast<std::uint8_t>(f);
    b->list_second = static_cast<std::uint8_t>(s);
    block*& head = lists_[f][s];
    b->previous_free = nullptr;
    b->next_free = head;
    if (head != nullptr) head->previous_free = b;
    head = b;
    first_bits_ |= std::uint64_t{1} << f;
    second_bits_[f] |= 1u << s;
  }
  void unlink(block* b) noexcept {
    const unsigned f = b->list_first;
    const unsigned s = b->list_second;
    if (b->previous_free != nullptr)
      b->previous_free->next_free = b->next_free;
    else
      lists_[f][s] = b->next_free;
    if (b->next_free != nullptr) b->next_free->previous_free = b->previous_free;
    b->previous_free = b->next_free = nullptr;
    if (lists_[f][s] == nullptr) {
      second_bits_[f] &= ~(1u << s);
      if (second_bits_[f] == 0) first_bits_ &= ~(std::uint64_t{1} << f);
    }
  }

  struct position {
    unsigned first;
    unsigned second;
  };
  static position classify(std::uint64_t size) noexcept {
    constexpr std::uint64_t linear = std::uint64_t{second_count} << unit_shift;
    if (size < linear) return {0, static_cast<unsigned>(size >> unit_shift)};
    const unsigned top = 63u - static_cast<unsigned>(std::countl_zero(size));
    const unsigned second = static_cast<unsigned>((size >> (top - second_bits)) - second_count);
    const unsigned first = top - (unit_shift + second_bits) + 1;
    return {first < first_count ? first : first_count - 1, second};
  }

  std::array<std::array<block*, second_count>, first_count> lists_{};
  std::array<std::uint32_t, first_count> second_bits_{};
  std::uint64_t first_bits_ = 0;
  std::size_t count_ = 0;
  std::uint64_t bytes_ = 0;
};

}  // namespace vmm::detail
