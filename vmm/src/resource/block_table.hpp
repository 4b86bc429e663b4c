#pragma once
// An arena's allocated blocks by offset: open addressing with linear probing over a table of
// a power of two entries, at most a quarter full; an erase shifts the entries after it back
// rather than leaving a tombstone. Unlike a node-based map, an insert allocates nothing
// unless the table grows (reserve_one() does that beforehand), and a lookup is one hash and
// usually one probe: this sits on every allocate and deallocate. A quarter rather than a
// half: the probe and shift loops end at their first step more often, which the processor
// predicts (fewer mispredicted branches a pair when random sizes churn through live blocks).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "resource/free_index.hpp"

namespace vmm::detail {

class block_table {
 public:
  // Makes room for one more insert, so that the insert cannot fail. May throw bad_alloc.
  void reserve_one() {
    if (4 * (count_ + 1) > slots_.size()) rehash(slots_.empty() ? 64 : 2 * slots_.size());
  }

  // `b` must not be in the table; reserve_one() must have been called.
  void insert(block* b) noexcept {
    std::size_t i = home(b->offset);
    while (slots_[i] != nullptr) i = (i + 1) & mask_;
    slots_[i] = b;
    ++count_;
  }

  [[nodiscard]] block* find(std::uint64_t offset) const noexcept {
    if (count_ == 0) return nullptr;
    for (std::size_t i = home(offset); slots_[i] != nullptr; i = (i + 1) & mask_)
      if (slots_[i]->offset == offset) return slots_[i];
    return nullptr;
  }

  void erase(std::uint64_t offset) noexcept {
    if (count_ == 0) return;
    std::size_t hole = home(offset);
    while (slots_[hole] != nullptr && slots_[hole]->offset != offset) hole = (hole + 1) & mask_;
    if (slots_[hole] == nullptr) return;
    // Later entries of the probe run move into the hole when their home does not lie
    // between the hole and where they are (cyclically): a lookup still finds them.
    for (std::size_t next = (hole + 1) & mask_; slots_[next] != nullptr; next = (next + 1) & mask_) {
      const std::size_t wanted = home(slots_[next]->offset);
      if (((next - wanted) & mask_) >= ((next - hole) & mask_)) {
        slots_[hole] = slots_[next];
        hole = next;
      }
    }
    slots_[hole] = nullptr;
    --count_;
  }

  [[nodiscard]] std::size_t size() const noexcept { return count_; }

  template <class Visit>
  void for_each(Visit&& visit) const {
    for (block* b : slots_)
      if (b != nullptr) visit(b);
  }

 private:
  [[nodiscard]] std::size_t home(std::uint64_t offset) const noexcept {
    // Offsets are multiples of the 256-byte unit; Fibonacci hashing spreads them.
    return static_cast<std::size_t>(((offset >> free_index::unit_shift) * 0x9e3779b97f4a7c15ull) >> shift_);
  }

  void rehash(std::size_t capacity) {
    std::vector<block*> old(capacity, nullptr);
    old.swap(slots_);
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
    count_ = 0;
    for (block* b : old)
      if (b != nullptr) insert(b);
  }

  std::vector<block*> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t count_ = 0;
};

}  // namespace vmm::detail
