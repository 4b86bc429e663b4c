#pragma once
// The lock of one arena: every allocate and every deallocate takes one, so it is a word
// with the uncontended path inline (one compare-exchange to lock, one exchange to unlock)
// instead of a call into pthread_mutex_lock and pthread_mutex_unlock (about 110
// instructions the pair of calls, an eighth of an allocate + deallocate). Contended, it
// sleeps in the kernel through std::atomic::wait (a futex on Linux): the slow path holds
// every arena's lock while the driver maps memory, for milliseconds.
//
// States as in Drepper's "Futexes Are Tricky" (mutex 3): 0 free, 1 locked, 2 locked and
// someone may be asleep on it; unlock wakes one sleeper only from state 2.

#include <sys/single_threaded.h>

#include <atomic>
#include <cstdint>

namespace vmm::detail {

// Whether this process has only ever had one thread (glibc clears the flag at the first
// pthread_create and never sets it again). Then no other thread can look at what a lock
// or a counter guards, and a thread made later is ordered after everything before its
// creation: plain stores do, without the locked instructions (about 20 cycles each) that
// glibc's own mutexes skip too in such a process.
[[nodiscard]] inline bool process_single_threaded() noexcept {
  return __libc_single_threaded != 0;
}

class arena_mutex {
 public:
  arena_mutex() = default;
  arena_mutex(const arena_mutex&) = delete;
  arena_mutex& operator=(const arena_mutex&) = delete;

  void lock() noexcept {
    if (process_single_threaded()) return state_.store(1, std::memory_order_relaxed);
    std::uint32_t expected = 0;
    if (!state_.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed))
      lock_contended();
  }
  [[nodiscard]] bool try_lock() noexcept {
    std::uint32_t expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() noexcept {
    if (process_single_threaded()) return state_.store(0, std::memory_order_relaxed);
    if (state_.exchange(0, std::memory_order_release) == 2) state_.notify_one();
  }

 private:
  void lock_contended() noexcept {
    // Marked 2 before sleeping, so that the holder's unlock wakes a sleeper; whoever takes
    // the lock from here on leaves it at 2 (a wake too many costs a call, never a hang).
    while (state_.exchange(2, std::memory_order_acquire) != 0) state_.wait(2, std::memory_order_relaxed);
  }

  std::atomic<std::uint32_t> state_{0};
};

}  // namespace vmm::detail
