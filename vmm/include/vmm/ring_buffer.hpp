#pragma once
/// @file
/// A ring buffer whose memory is mapped twice back to back, so that windows across the
/// wrap point are contiguous.
///
///     vmm::ring_buffer ring(vmm::location::device(0), 64 << 20, {.stream = stream});
///     producer<<<1, 256, 0, stream.get()>>>(ring.view());   // records straddle the wrap
///     consumer<<<1, 256, 0, stream.get()>>>(ring.view());   // read through plain pointers
///
/// Capacity C is backed by C bytes of physical memory (one chunk from a chunk_pool), mapped
/// at [p, p + C) and again at [p + C, p + 2C) by one vmm::chunk_view whose chunk list names
/// the chunk twice. Any window of length <= C that starts in [0, C) is then contiguous
/// memory: a kernel reads a record across the wrap through a plain pointer, with no modulo
/// per access, and writes through [p + C, ...) land at the start of the ring. (The same
/// trick is known on the host as the "magic ring buffer"; here it works on every provider.)
///
/// A small control block follows the two copies, in one more granularity-sized chunk of the
/// same provider in the same view: the head and tail counters of the single-producer /
/// single-consumer protocol in vmm/ring_buffer_view.hpp, zeroed at construction. The whole
/// range gets its access in one call. Layout, from data():
///   [0, C)        the ring's memory
///   [C, 2C)       the same memory again
///   [2C, 2C + g)  the control block: head at +ring_head_offset, tail at +ring_tail_offset
///
/// The coherency rule of vmm/chunk_view.hpp applies: on the GPU, hand records from producer
/// to consumer across kernel launches (stream order), not within one grid.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "vmm/chunk_pool.hpp"
#include "vmm/chunk_view.hpp"
#include "vmm/ring_buffer_view.hpp"

namespace vmm {

/// Settings of a ring_buffer.
struct ring_buffer_options {
  /// Who gets access to the ring and its counters (empty: the provider's default
  /// accessors, read-write).
  std::vector<access_grant> access;
  /// The stream work on the ring is queued on: construction zeroes the counters on it (and
  /// waits for that), destruction is ordered after it. The legacy default stream when not
  /// given.
  stream_ref stream;
};

/// See the file comment. Move-only.
class ring_buffer {
 public:
  /// A ring of `capacity` bytes from `pool`, empty (head == tail == 0).
  /// @throws vmm::invalid_argument the pool is null, capacity is 0 or "capacity N is not a
  ///         multiple of the granularity G", or an access grant is not grantable.
  /// @throws vmm::out_of_memory the pool's cap or the memory is exhausted.
  /// @throws vmm::driver_error, vmm::os_error creating, mapping or setting access to the
  ///         memory, or zeroing the counters, failed; nothing is left mapped.
  ring_buffer(std::shared_ptr<chunk_pool> pool, std::size_t capacity, ring_buffer_options options = {});
  /// A ring on the default pool of `where`.
  /// @throws vmm::driver_unavailable GPU or pinned memory asked for and no usable driver.
  /// @throws as the constructor above (a location that does not exist: invalid_argument).
  ring_buffer(location where, std::size_t capacity, ring_buffer_options options = {});
  ring_buffer(ring_buffer&& other) noexcept;
  ring_buffer& operator=(ring_buffer&& other) noexcept;
  ring_buffer(const ring_buffer&) = delete;
  ring_buffer& operator=(const ring_buffer&) = delete;
  /// Retires the ring after its stream (never blocks), then its chunks go back to the pool.
  ~ring_buffer() = default;

  /// The first byte of the ring; [data(), data() + 2 * capacity()) is mapped, its second
  /// half aliasing the first. nullptr for a moved-from ring.
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(view_.data()); }
  /// Bytes of memory behind the ring: the longest contiguous window.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// The view to pass to kernels (or use on the host, where the memory is host-accessible).
  [[nodiscard]] ring_buffer_view view() const noexcept;
  /// The producer's counter, read back through the provider (works for device memory too):
  /// waits for the ring's stream first.
  /// @throws vmm::invalid_argument the ring is moved-from.
  [[nodiscard]] std::uint64_t head() const;
  /// The consumer's counter, read back as head() is.
  [[nodiscard]] std::uint64_t tail() const;
  /// Sets both counters to 0 (empties the ring), in order on the ring's stream.
  /// @throws vmm::invalid_argument the ring is moved-from.
  void reset();
  /// The doubly mapped memory and the control block, as one view.
  [[nodiscard]] const chunk_view& memory() const noexcept { return view_; }
  [[nodiscard]] stream_ref stream() const noexcept { return view_.stream(); }

 private:
  [[nodiscard]] std::uint64_t read_counter(std::size_t offset) const;

  chunk_view view_;
  std::size_t capacity_ = 0;
};

}  // namespace vmm
