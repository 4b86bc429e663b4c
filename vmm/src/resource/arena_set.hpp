#pragma once
// The arenas of one memory resource, in the order they were made: found without a lock (an
// arena once added never moves), added under the resource's mutex.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "resource/arena.hpp"
#include "vmm/provider.hpp"

namespace vmm::detail {

class arena_set {
 public:
  // As memory_resource::max_arenas.
  static constexpr std::size_t max_arenas = 256;

  explicit arena_set(std::shared_ptr<memory_provider> provider) noexcept : provider_(std::move(provider)) {}
  arena_set(const arena_set&) = delete;
  arena_set& operator=(const arena_set&) = delete;

  // A new arena of `bytes` of addresses in pages of `page_size` (under the resource's
  // mutex). Throws out_of_memory when max_arenas are made already or the provider refuses
  // the address range.
  arena& add(std::size_t bytes, std::size_t page_size);

  [[nodiscard]] std::size_t count() const noexcept { return count_.load(); }
  [[nodiscard]] arena& at(std::size_t i) const noexcept { return *arenas_[i].load(); }
  // The index of the arena holding `address`, or max_arenas when none does.
  [[nodiscard]] std::size_t index_containing(std::uintptr_t address) const noexcept;
  [[nodiscard]] arena* containing(std::uintptr_t address) const noexcept;

  // Under every arena's mutex: what each stream slot's stream has passed is free for every
  // stream (released).
  void release_passed() noexcept;
  // The bytes of the largest released block of any arena.
  [[nodiscard]] std::uint64_t largest_released() const noexcept;
  // Every arena, handed over (the resource's destructor retires them in stream order).
  [[nodiscard]] std::vector<std::unique_ptr<arena>> take_all() noexcept { return std::move(storage_); }

 private:
  std::shared_ptr<memory_provider> provider_;
  std::vector<std::unique_ptr<arena>> storage_;
  std::array<std::atomic<arena*>, max_arenas> arenas_{};
  std::atomic<std::size_t> count_{0};
};

}  // namespace vmm::detail
