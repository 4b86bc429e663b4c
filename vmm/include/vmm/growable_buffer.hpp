#pragma once
/// @file
/// A buffer that grows in place: its address never changes.
///
/// The buffer reserves an address range for its maximum size once, then maps physical
/// chunks from a chunk_pool at the end of what is mapped as it grows, and unmaps them as it
/// shrinks. data() stays the same for the buffer's life, so pointers held by kernels and
/// captured CUDA graphs stay valid across growth, and growing never copies.
///
/// Costs are per handle (cuMemSetAccess and cuMemUnmap cost tens of microseconds for each
/// handle in the range, whatever its size), so each grow maps one new chunk when it can and
/// sets access once over the whole new range. The chunk-size policy keeps the handle count
/// logarithmic in the size with bounded slack: chunk_policy::geometric() makes a new chunk
/// as large as the growth asked for, but at least 1/8 of the new size (rounded down to a
/// power of two), so that small appends map a chunk only every 1/8 of growth and the
/// mapped-but-unused slack stays under 1/8 of the size. When the device cannot supply a
/// chunk that large, the grow falls back to smaller chunks down to the granularity, so a
/// buffer can take all of the memory there is.
///
/// Guarantees:
///  - a grow either completes or leaves the buffer exactly as it was (strong guarantee):
///    chunks mapped for a failed grow are unmapped and given back to the pool;
///  - nothing is unmapped while work queued on the buffer's stream may still use it:
///    shrinking records an event on the stream and keeps the chunks mapped ("retired")
///    until the event has passed; a later grow takes retired chunks back without any
///    driver call; release_retired() and the destructor wait for the event.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "vmm/address_range.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/mapping.hpp"
#include "vmm/stream_event.hpp"

namespace vmm {

/// How large the chunks a buffer maps are.
class chunk_policy {
 public:
  /// Chunks as large as the growth asks, at least 1/slack_divisor of the new size (a power
  /// of two): O(log size) handles, slack under size/slack_divisor.
  static constexpr chunk_policy geometric(std::size_t slack_divisor = 8) noexcept {
    return chunk_policy(0, slack_divisor);
  }
  /// Every chunk is `chunk_size` bytes (rounded up to the granularity).
  static constexpr chunk_policy fixed(std::size_t chunk_size) noexcept {
    return chunk_policy(chunk_size, 0);
  }
  /// The chunk to map when growing from `mapped` bytes to at least `required` bytes.
  [[nodiscard]] std::size_t next_chunk(std::size_t mapped, std::size_t required,
                                       std::size_t granularity) const;
  [[nodiscard]] bool is_fixed() const noexcept { return fixed_size_ != 0; }

 private:
  constexpr chunk_policy(std::size_t fixed_size, std::size_t divisor) noexcept
      : fixed_size_(fixed_size), slack_divisor_(divisor) {}
  std::size_t fixed_size_;
  std::size_t slack_divisor_;
};

/// Settings of a growable_buffer.
struct growable_buffer_options {
  /// The most the buffer may ever hold (its address range). 0: the location's physical
  /// memory size (the GPU's total memory; the host's RAM), rounded up to the granularity.
  std::size_t max_size = 0;
  chunk_policy policy = chunk_policy::geometric();
  /// The stream work on the buffer is queued on: shrinking and destruction are ordered
  /// after it. nullptr is the default stream.
  stream_handle stream = nullptr;
  /// Who gets access (empty: every pool's default accessors, read-write).
  std::vector<access_grant> access;
  /// Pools to continue on, in order, once the ones before are out of memory: a buffer that
  /// fills one GPU and spills onto the next, one pointer throughout. Their memory must be
  /// of the same kind as the first pool's. With max_size 0 the range holds all of them.
  /// Every accessor must be able to reach every pool's memory (peer access between GPUs).
  std::vector<std::shared_ptr<chunk_pool>> spill_to;
};

/// A physical chunk shared by the buffer that mapped it and every view that maps it too
/// (vmm/chunk_view.hpp): it goes back to its pool when the last of them lets go.
using shared_chunk = std::shared_ptr<const pooled_chunk>;

/// See the file comment. Move-only.
class growable_buffer {
 public:
  /// An empty buffer drawing chunks from `pool`, with an address range of
  /// options.max_size reserved now. Nothing is mapped yet.
  /// @throws vmm::invalid_argument the pool is null or an option is bad.
  /// @throws vmm::out_of_memory no address range of that size is left.
  explicit growable_buffer(std::shared_ptr<chunk_pool> pool, growable_buffer_options options = {});
  /// A buffer on the default pool of `where`.
  explicit growable_buffer(location where, growable_buffer_options options = {});
  growable_buffer(growable_buffer&&) noexcept;
  growable_buffer& operator=(growable_buffer&&) noexcept;
  growable_buffer(const growable_buffer&) = delete;
  growable_buffer& operator=(const growable_buffer&) = delete;
  /// Waits for the stream, then unmaps everything, gives the chunks back and frees the
  /// address range.
  ~growable_buffer();

  /// The first byte; never changes (nullptr only for a moved-from buffer).
  [[nodiscard]] void* data() const noexcept { return range_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Bytes mapped and accessible (>= size()).
  [[nodiscard]] std::size_t capacity() const noexcept { return mapped_; }
  /// The most the buffer can ever hold.
  [[nodiscard]] std::size_t max_size() const noexcept { return range_.size(); }
  /// Physical chunks mapped (including retired ones).
  [[nodiscard]] std::size_t chunk_count() const noexcept { return chunks_.size(); }
  [[nodiscard]] stream_handle stream() const noexcept { return options_.stream; }
  /// Orders later shrinks after work on `stream` instead.
  void set_stream(stream_handle stream) noexcept { options_.stream = stream; }
  [[nodiscard]] const std::shared_ptr<chunk_pool>& pool() const noexcept { return pool_; }
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept {
    return pool_->provider();
  }

  /// Sets the size to `bytes`, mapping chunks as needed, and on shrinking retires the
  /// chunks wholly past the new size (stream-ordered). Contents up to min(old, new) stay;
  /// new bytes are uninitialized.
  /// @throws vmm::out_of_memory past max_size(), the pool's cap, or the device's memory;
  ///         the buffer is then exactly as it was.
  void resize(std::size_t bytes);
  /// Maps at least `bytes` without changing size(). Same errors and guarantee as resize.
  void reserve(std::size_t bytes);
  /// Retires every chunk wholly past size() (stream-ordered).
  void shrink_to_fit();
  /// Unmaps retired chunks and gives them back to the pool. With wait, blocks until the
  /// stream has passed their retirement; without, releases only those it has passed.
  void release_retired(bool wait = true);

  /// The chunks that back [offset, offset + length), in address order, for mapping the same
  /// physical memory elsewhere (aliases, re-layout). The range must start and end on chunk
  /// boundaries within capacity().
  /// @throws vmm::invalid_argument zero length, past capacity(), or not on chunk boundaries
  ///         (the message names the nearest boundaries).
  [[nodiscard]] std::vector<shared_chunk> chunks(std::size_t offset, std::size_t length) const;

 private:
  struct mapped_chunk {
    shared_chunk memory;
    mapping view;
    std::size_t pool_index;  // 0: pool_, i: options_.spill_to[i - 1]
  };
  struct retirement {
    std::size_t first_chunk;  // chunks_[first_chunk..] retired at `passed`
    stream_event passed;
  };
  void grow_mapping(std::size_t required);
  void retire_beyond(std::size_t bytes);
  void take_back_retired(std::size_t required);
  void release_retired_from(std::size_t retirement_index, bool wait);
  [[nodiscard]] std::size_t active_chunks() const noexcept;
  [[nodiscard]] std::vector<access_grant> grants() const;
  [[nodiscard]] chunk_pool& pool_at(std::size_t index) const;

  std::shared_ptr<chunk_pool> pool_;
  growable_buffer_options options_;
  address_range range_;
  std::vector<mapped_chunk> chunks_;     // in address order from data()
  std::vector<retirement> retirements_;  // ascending first_chunk; the tail of chunks_
  std::size_t mapped_ = 0;               // bytes in active (non-retired) chunks
  std::size_t size_ = 0;
};

}  // namespace vmm
