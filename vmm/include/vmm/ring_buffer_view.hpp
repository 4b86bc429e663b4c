#pragma once
/// @file
/// What a kernel (or a host thread) needs to use a vmm::ring_buffer: a trivially copyable
/// view, passed to kernels by value, with the single-producer / single-consumer protocol as
/// inline functions that compile for the host and, under nvcc, for the device.
///
///     vmm::ring_buffer ring(vmm::location::os_host(), 2 << 20);
///     vmm::ring_buffer_view v = ring.view();   // the same value a kernel takes by value
///     if (std::byte* p = v.reserve(n)) { std::memcpy(p, record, n); v.publish(n); }
///     if (const std::byte* q = v.peek(n)) { handle(q, n); v.consume(n); }
///
/// The protocol. `head` counts the bytes the producer has published, `tail` the bytes the
/// consumer has consumed; both only grow (64 bits: no wrap in practice). The bytes in
/// [tail, head) are readable, the capacity - (head - tail) bytes after head are free. A
/// position p is at data + p % capacity, and because the memory is mapped twice back to
/// back, any length <= capacity from there is contiguous: a record that straddles the
/// wrap point is read and written through a plain pointer, with no modulo per byte.
///
///   producer:  if (std::byte* p = ring.reserve(n)) { write n bytes at p; ring.publish(n); }
///   consumer:  if (const std::byte* p = ring.peek(n)) { read n bytes at p; ring.consume(n); }
///
/// Memory ordering. publish() is a release store of head and peek()/readable() load head
/// with acquire; consume() is a release store of tail and reserve()/free_space() load tail
/// with acquire (system scope on the GPU, so host and device may be the two sides). So:
///  - publish only after the data is written. Within one kernel where several threads write
///    a record, make their writes happen before the publishing thread's publish()
///    (__syncthreads() in a block; a __threadfence() then a flag across blocks);
///  - consume only after the data has been read: the producer may overwrite it at once.
///  - Across kernel launches, stream order suffices: a kernel (or copy) queued after the
///    producer kernel sees its data and its head.
/// The data is written and read through the two aliases of the same memory, so the
/// coherency rule of vmm/chunk_view.hpp applies: on the GPU, a producer and a consumer
/// running at the same time (in one grid or in concurrent grids) are outside it; hand
/// records over across kernel launches, or between the host and kernels in stream order.
/// One producer and one consumer at a time: reserve/publish are not for several producers.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda/atomic>
#endif

#include "vmm/host_device.hpp"

namespace vmm {

namespace detail {

VMM_HOST_DEVICE inline std::uint64_t load_acquire(const std::uint64_t* counter) {
#if defined(__CUDA_ARCH__)
  return cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(*const_cast<std::uint64_t*>(counter))
      .load(cuda::std::memory_order_acquire);
#else
  return __atomic_load_n(counter, __ATOMIC_ACQUIRE);
#endif
}

VMM_HOST_DEVICE inline void store_release(std::uint64_t* counter, std::uint64_t value) {
#if defined(__CUDA_ARCH__)
  cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(*counter).store(value,
                                                                             cuda::std::memory_order_release);
#else
  __atomic_store_n(counter, value, __ATOMIC_RELEASE);
#endif
}

}  // namespace detail

/// Where the control block's counters are, from its start: each on its own 128-byte line,
/// so that the producer's and the consumer's stores do not share a cache line.
inline constexpr std::size_t ring_head_offset = 0;
inline constexpr std::size_t ring_tail_offset = 128;
/// Bytes of the control block that hold the counters.
inline constexpr std::size_t ring_control_bytes = 256;

/// A single-producer / single-consumer ring over doubly mapped memory. See the file comment
/// for the protocol and its memory ordering. Trivially copyable: pass it to kernels by
/// value. Its pointers are valid while the vmm::ring_buffer it came from lives.
struct ring_buffer_view {
  std::byte* data =
      nullptr;  ///< 2 * capacity bytes mapped; [data + capacity, +capacity) aliases [data, +capacity)
  std::uint64_t capacity = 0;     ///< bytes of physical memory behind the ring
  std::uint64_t* head = nullptr;  ///< bytes published so far (written by the producer only)
  std::uint64_t* tail = nullptr;  ///< bytes consumed so far (written by the consumer only)

  /// The address of stream position `position`; the `capacity` bytes from there are
  /// contiguous (one modulo per window, none per byte).
  [[nodiscard]] VMM_HOST_DEVICE std::byte* at(std::uint64_t position) const {
    return data + position % capacity;
  }

  // ---- producer side ------------------------------------------------------------------
  /// Bytes the producer may reserve now.
  [[nodiscard]] VMM_HOST_DEVICE std::uint64_t free_space() const {
    return capacity - (*head - detail::load_acquire(tail));
  }
  /// n contiguous bytes at the head to write, or nullptr when fewer than n are free (or n
  /// is 0 or more than the capacity). Does not move the head: publish(n) does.
  [[nodiscard]] VMM_HOST_DEVICE std::byte* reserve(std::uint64_t n) const {
    if (n == 0 || n > free_space()) return nullptr;
    return at(*head);
  }
  /// Makes the next n reserved bytes readable (release: the data written before is seen by
  /// a consumer that sees the new head). n must not exceed what was reserved.
  VMM_HOST_DEVICE void publish(std::uint64_t n) const { detail::store_release(head, *head + n); }

  // ---- consumer side ------------------------------------------------------------------
  /// Bytes published and not yet consumed.
  [[nodiscard]] VMM_HOST_DEVICE std::uint64_t readable() const { return detail::load_acquire(head) - *tail; }
  /// n contiguous readable bytes at the tail, or nullptr when fewer than n are published (or
  /// n is 0). Does not move the tail: consume(n) does.
  [[nodiscard]] VMM_HOST_DEVICE const std::byte* peek(std::uint64_t n) const {
    if (n == 0 || n > readable()) return nullptr;
    return at(*tail);
  }
  /// Frees the next n bytes for the producer (release: call it only once they are read).
  /// n must not exceed readable().
  VMM_HOST_DEVICE void consume(std::uint64_t n) const { detail::store_release(tail, *tail + n); }
};

static_assert(std::is_trivially_copyable_v<ring_buffer_view>);
static_assert(std::is_standard_layout_v<ring_buffer_view>);

}  // namespace vmm
