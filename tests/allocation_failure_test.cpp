// What the library does when operator new fails where it must not lose track of memory.
// A program of its own: it replaces the global operator new with one that fails on
// request, which the sanitizers' own allocators would not allow.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "vmm/chunk_pool.hpp"
#include "vmm/provider.hpp"

namespace {

std::atomic<int> fail_countdown{0};  // 0: never; n: the nth allocation from now fails

void* allocate(std::size_t size) {
  if (int left = fail_countdown.load(); left > 0 && fail_countdown.fetch_sub(1) == 1) throw std::bad_alloc();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t size) {
  return allocate(size);
}
void* operator new[](std::size_t size) {
  return allocate(size);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}

namespace vmm {
namespace {

// 11. The idle chunk's map node could not be allocated inside give_back: the memory was
// released, but reserved_current was never decremented, and with a cap the pool refused
// every later acquire.
TEST(allocation_failure, a_give_back_that_cannot_allocate_keeps_the_books_right) {
  constexpr std::size_t g = std::size_t{2} << 20;
  auto pool =
      chunk_pool::create(make_os_host_provider({.granularity = g, .commit_budget = 16 * g}), {.cap = 2 * g});
  {
    pooled_chunk chunk = pool->acquire(g);
    fail_countdown = 1;  // the give-back's node
  }
  fail_countdown = 0;
  const pool_statistics after = pool->statistics();
  EXPECT_EQ(after.reserved_current, 0u);
  EXPECT_EQ(after.used_current, 0u);
  EXPECT_EQ(after.chunks_released, 1u);
  // The cap holds two chunks again.
  pooled_chunk a = pool->acquire(g);
  pooled_chunk b = pool->acquire(g);
  EXPECT_EQ(pool->statistics().reserved_current, 2 * g);
}

}  // namespace
}  // namespace vmm
