#include "resource/arena_set.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "vmm/error.hpp"
#include "vmm/memory_resource.hpp"

namespace vmm::detail {

static_assert(arena_set::max_arenas == memory_resource::max_arenas);

arena& arena_set::add(std::size_t bytes, std::size_t page_size) {
  const std::size_t count = count_.load();
  if (count == max_arenas)
    throw out_of_memory(fmt::format("memory_resource: {} address ranges made already", max_arenas));
  storage_.push_back(std::make_unique<arena>(provider_, bytes, page_size));
  arena* made = storage_.back().get();
  arenas_[count].store(made, std::memory_order_release);
  count_.store(count + 1, std::memory_order_release);
  return *made;
}

std::size_t arena_set::index_containing(std::uintptr_t address) const noexcept {
  const std::size_t count = count_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < count; ++i)
    if (arenas_[i].load(std::memory_order_acquire)->contains(address)) return i;
  return max_arenas;
}

arena* arena_set::containing(std::uintptr_t address) const noexcept {
  const std::size_t i = index_containing(address);
  return i == max_arenas ? nullptr : arenas_[i].load(std::memory_order_acquire);
}

void arena_set::release_passed() noexcept {
  for (std::size_t i = 0; i < count(); ++i) {
    arena& a = at(i);
    for (auto& slot : a.slots()) (void)a.release_pending(*slot, slot->record->passed.load());
  }
}

std::uint64_t arena_set::largest_released() const noexcept {
  std::uint64_t largest = 0;
  for (std::size_t i = 0; i < count(); ++i) largest = std::max(largest, at(i).released().largest());
  return largest;
}

}  // namespace vmm::detail
