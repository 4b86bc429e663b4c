#pragma once
/// @file
/// A buffer that grows in place: its address never changes.
///
///     vmm::growable_buffer buffer(vmm::location::device(0));   // reserves addresses only
///     void* p = buffer.data();
///     buffer.resize(1 << 30, stream);      // maps memory; p stays valid, nothing copied
///     buffer.resize(64 << 20);             // on the buffer's default stream
///     assert(buffer.data() == p);
///
/// The buffer allocates an address range for its maximum size once, then maps physical
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
/// buffer can take all of the memory there is (docs/design/growable_buffer.md, "Chunks").
///
/// Streams. Every operation that queues work takes a stream (stream_ref); without one it
/// uses the buffer's default stream (options.stream, set_stream()). Shrinking records a
/// point on the stream given and keeps the chunks past the new size mapped ("retired")
/// until the stream has passed it; a later grow takes retired chunks back without any
/// driver call (ordering the growing stream after that point). Destruction never blocks: it
/// retires everything after the default stream (vmm/retirement.hpp); work queued on other
/// streams must be done, or ordered before the default stream, by then.
///
/// Guarantees:
///  - a grow or a shrink either completes or leaves the buffer exactly as it was (strong
///    guarantee): chunks mapped for a failed grow are unmapped and given back to the pool,
///    and retired chunks are taken back only once the grow has succeeded;
///  - nothing is unmapped while work queued on the stream of the shrink may still use it;
///  - a chunk that the driver or the OS refuses to unmap stays mapped and retired: the
///    buffer takes it back at its next grow, and its pool never lends it to anyone else.
///
/// Growth ahead (growable_buffer_options::growth_ahead). A grow that finds no idle chunk
/// creates one on the caller's thread. A buffer told how far ahead to keep memory ready
/// (bytes, or learned from its last grows) asks a background thread, after each resize or
/// reserve, for the chunks that its next grows will need: the thread takes them from the
/// pool, creating them there, and the next grow maps them first, so it costs what a grow
/// from a warm pool costs. One thread serves the process and is joined with the last buffer
/// that uses it; it never touches a buffer (it fills a per-buffer slot of ready chunks under
/// the slot's mutex, and only the buffer maps them, in its own resize or reserve), so the
/// buffer stays single-threaded. Its failures are dropped (the request was a guess); the
/// buffer's own grow reports errors with the strong guarantee. Ready chunks count as used in
/// their pool; shrink_to_fit() and destruction give them back at once. Creating memory costs
/// the GPU too, so a loop bound by GPU work still runs slower into fresh memory than into
/// recycled chunks, ahead or not. The decisions and their measurements:
/// docs/design/growable_buffer.md, "Growth ahead".
///
/// Beyond the GPU's memory (growable_buffer_options::spill_to_host, or further pools in
/// spill_to). A buffer of GPU memory may continue on another GPU's memory or, last, on pinned
/// host memory in the same CUDA address space when its pools are out of memory: one pointer
/// throughout, and kernels read every part. Other combinations are refused when the buffer
/// is made (docs/design/growable_buffer.md, "Spill").

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "vmm/chunk_pool.hpp"
#include "vmm/mapped_range.hpp"
#include "vmm/shared_chunk.hpp"
#include "vmm/stream_executor.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm {

namespace detail {
class growth_slot;
class growth_worker;
}  // namespace detail

/// How large the chunks a buffer maps are.
class chunk_policy {
 public:
  /// Chunks as large as the growth asks, at least 1/slack_divisor of the new size (a power
  /// of two), and none larger than largest_chunk (rounded down to the granularity; a grow
  /// past it maps several): O(log size) handles up to that size, slack under
  /// size/slack_divisor. The default largest, 256 MiB, keeps a warm grow (over recycled
  /// chunks, which pay per handle) as fast as writing preallocated memory
  /// (docs/design/growable_buffer.md, "Chunks"). slack_divisor > 0, largest_chunk > 0.
  static constexpr chunk_policy geometric(std::size_t slack_divisor = 8,
                                          std::size_t largest_chunk = std::size_t{256} << 20) noexcept {
    return chunk_policy(false, slack_divisor, largest_chunk);
  }
  /// Every chunk is `chunk_size` bytes (rounded up to the granularity). chunk_size > 0.
  static constexpr chunk_policy fixed(std::size_t chunk_size) noexcept {
    return chunk_policy(true, chunk_size, chunk_size);
  }
  /// The chunk to map when growing from `mapped` bytes to at least `required` bytes.
  [[nodiscard]] std::size_t next_chunk(std::size_t mapped, std::size_t required,
                                       std::size_t granularity) const;
  /// The capacity that growing from `mapped` bytes to at least `required` bytes reaches when
  /// every chunk is the one next_chunk() picks and none maps past `max_size`: what
  /// growable_buffer::resize maps while memory lasts, and an upper bound of what it maps
  /// otherwise (its fallbacks only take smaller chunks). `mapped` is a multiple of
  /// `granularity` (> 0), as a buffer's capacity is.
  /// @throws vmm::invalid_argument a parameter of the policy is 0 (as check()).
  [[nodiscard]] std::size_t capacity_after(std::size_t mapped, std::size_t required, std::size_t granularity,
                                           std::size_t max_size) const;
  [[nodiscard]] bool is_fixed() const noexcept { return fixed_; }
  /// Throws vmm::invalid_argument naming the policy when a parameter is 0.
  void check() const;

 private:
  constexpr chunk_policy(bool fixed, std::size_t parameter, std::size_t largest) noexcept
      : fixed_(fixed), parameter_(parameter), largest_(largest) {}
  bool fixed_;
  std::size_t parameter_;  // the chunk size, or the slack divisor
  std::size_t largest_;    // geometric: the largest chunk
};

/// How much memory a buffer keeps ready past its size, prepared on a background thread (see
/// the file comment of growable_buffer.hpp).
///
///     vmm::growable_buffer b(vmm::location::device(0), {.growth_ahead = {.bytes = 256 << 20}});
struct growth_ahead_options {
  /// Bytes past size() (past capacity() after a reserve, as device_vector grows) that a
  /// grow should find ready: mapped capacity, retired chunks and chunks prepared ahead
  /// together. 0 with learn false: no growth ahead.
  std::size_t bytes = 0;
  /// Also keep ready as much as the largest of the last four grows added (a resize past
  /// the last size, a reserve past the last capacity).
  bool learn = false;
};

/// Settings of a growable_buffer.
struct growable_buffer_options {
  /// The most the buffer may ever hold (its address range). 0: the location's physical
  /// memory size (the GPU's total memory; the OS provider's commit budget), rounded up to
  /// the granularity.
  std::size_t max_size = 0;
  chunk_policy policy = chunk_policy::geometric();
  /// The default stream: for operations given none, and what destruction is ordered after.
  /// A stream of the first pool's device.
  stream_ref stream;
  /// Who gets access (empty: every pool's default accessors, read-write).
  std::vector<access_grant> access;
  /// Pools to continue on, in order, once the ones before are out of memory: a buffer that
  /// fills one GPU and spills onto the next, one pointer throughout. Their memory must be
  /// of the same kind as the first pool's, or pinned host memory after GPU memory (and then
  /// last), and live in the same address space. With max_size 0 the range holds all of
  /// them. Every accessor must be able to reach every pool's memory (peer access between
  /// GPUs); a host accessor is given the host part only.
  std::vector<std::shared_ptr<chunk_pool>> spill_to;
  /// After the pools of spill_to, continue on default_pool(location::pinned_host(0)) (for
  /// another NUMA node, put a pool of location::pinned_host(node) last in spill_to instead).
  /// Only for a buffer of GPU memory. With max_size 0 the range then also holds all of the
  /// host's memory: give a max_size.
  bool spill_to_host = false;
  /// Memory kept ready past size() by a background thread; see the file comment.
  growth_ahead_options growth_ahead;
};

/// See the file comment. Move-only. Not thread-safe: one thread at a time uses a buffer.
class growable_buffer {
 public:
  /// An empty buffer drawing chunks from `pool`, with an address range of
  /// options.max_size allocated now. Nothing is mapped yet.
  /// @throws vmm::invalid_argument the pool is null or an option is bad (a zero chunk
  ///         policy, a null spill pool, a spill pool of another kind of memory other than
  ///         pinned host memory after GPU memory, of another address space, spill_to_host
  ///         for a buffer that is not GPU memory, an access list with no GPU for the GPU
  ///         part).
  /// @throws std::system_error growth ahead asked for and its thread could not start.
  /// @throws vmm::out_of_memory no address range of that size is left.
  /// @throws vmm::driver_error, vmm::os_error the driver or the OS refused the range for
  ///         another reason.
  explicit growable_buffer(std::shared_ptr<chunk_pool> pool, growable_buffer_options options = {});
  /// A buffer on the default pool of `where`.
  /// @throws vmm::driver_unavailable GPU or pinned memory asked for and no usable driver.
  /// @throws as the constructor above (a location that does not exist: invalid_argument).
  explicit growable_buffer(location where, growable_buffer_options options = {});
  growable_buffer(growable_buffer&&) noexcept;
  growable_buffer& operator=(growable_buffer&&) noexcept;
  growable_buffer(const growable_buffer&) = delete;
  growable_buffer& operator=(const growable_buffer&) = delete;
  /// Retires everything after the default stream (never blocks; see the file comment).
  ~growable_buffer();

  /// The first byte; never changes (nullptr only for a moved-from buffer).
  [[nodiscard]] void* data() const noexcept { return run_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Bytes mapped and accessible (>= size()).
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// The most the buffer can ever hold.
  [[nodiscard]] std::size_t max_size() const noexcept { return run_.size(); }
  /// Physical chunks mapped (retired ones included).
  [[nodiscard]] std::size_t chunk_count() const noexcept { return run_.chunks().size(); }
  /// The default stream.
  [[nodiscard]] stream_ref stream() const noexcept { return options_.stream; }
  /// Sets the default stream (later operations given none, and destruction, use it).
  void set_stream(stream_ref stream) noexcept { options_.stream = stream; }
  /// The pool chunks come from first (null for a moved-from buffer).
  [[nodiscard]] const std::shared_ptr<chunk_pool>& pool() const noexcept { return pool_; }
  /// Whether the buffer may continue from GPU memory into pinned host memory (a pinned
  /// host pool among its spill pools): then copies and fills across the boundary must run
  /// piece by piece (provider()->address_space().mapped_pieces()).
  [[nodiscard]] bool spills_to_host() const noexcept { return host_part_; }
  /// The provider of the first pool (null for a moved-from buffer).
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept { return run_.provider(); }

  /// Sets the size to `bytes`, mapping chunks as needed, and on shrinking retires the
  /// chunks wholly past the new size after `stream`'s queued work. Contents up to
  /// min(old, new) stay; new bytes are uninitialized.
  /// @throws vmm::out_of_memory past max_size(), the pool's cap, or the device's memory.
  /// @throws vmm::driver_error, vmm::os_error mapping, setting access or recording failed.
  /// On any exception the buffer is exactly as it was.
  void resize(std::size_t bytes, stream_ref stream);
  /// resize(bytes, stream()).
  /// @throws as resize(bytes, stream).
  void resize(std::size_t bytes) { resize(bytes, options_.stream); }
  /// Maps at least `bytes` without changing size(). Same errors and guarantee as resize.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error as resize().
  void reserve(std::size_t bytes, stream_ref stream);
  /// reserve(bytes, stream()).
  /// @throws as reserve(bytes, stream).
  void reserve(std::size_t bytes) { reserve(bytes, options_.stream); }
  /// As reserve, but maps nothing past what `bytes` needs, rounded up to the granularity:
  /// the chunk policy's largest chunk still applies, its amortizing slack does not. For a
  /// caller that knows the size it is about to reach (append_from_kernel's estimate).
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error as resize().
  void reserve_exact(std::size_t bytes, stream_ref stream);
  /// Retires every chunk wholly past size() after `stream`'s queued work.
  /// @throws vmm::driver_error recording the point the chunks wait for failed.
  void shrink_to_fit(stream_ref stream);
  /// shrink_to_fit(stream()).
  /// @throws as shrink_to_fit(stream).
  void shrink_to_fit() { shrink_to_fit(options_.stream); }
  /// Unmaps retired chunks and gives them back to the pool. With wait, blocks until the
  /// streams have passed their retirement; without, collects only those already passed.
  /// @throws vmm::driver_error waiting for or querying a stream's point failed.
  void collect_retired(bool wait = false);
  /// Blocks until the chunks asked for ahead are ready, or their preparation ended in a
  /// failure (dropped: see the file comment). Returns at once without growth ahead. Never
  /// needed for correctness: for tests and benchmarks that want the thread's work done.
  /// Throws nothing but std::system_error from a broken mutex.
  void wait_for_growth_ahead() const;
  /// Bytes of chunks prepared ahead and not mapped yet (0 without growth ahead). As
  /// wait_for_growth_ahead().
  [[nodiscard]] std::size_t ready_ahead() const;

  /// The chunks that back [offset, offset + length), in address order, for mapping the same
  /// physical memory elsewhere (aliases, re-layout). The range must start and end on chunk
  /// boundaries within capacity().
  /// @throws vmm::invalid_argument zero length, past capacity(), or not on chunk boundaries
  ///         (the message names the nearest boundaries).
  [[nodiscard]] std::vector<shared_chunk> chunks(std::size_t offset, std::size_t length) const;

 private:
  struct retirement {
    std::size_t first_chunk;  // chunks [first_chunk, next retirement's) retired at `passed`
    stream_event passed;
  };
  void reserve_mapping(std::size_t bytes, stream_ref stream, bool exact);
  // Maps up to `required`; with exact, no chunk reaches past it by more than the granularity.
  void grow_mapping(std::size_t required, stream_ref stream, bool exact = false);
  // Sets access over the chunks from `first_chunk` on, one call per run of one memory kind.
  void set_access_from(std::size_t first_chunk);
  // Asks the growth-ahead thread for what the next grows will need. Never throws: growth
  // ahead is an optimization, and a failure to ask leaves the grow to the caller's thread.
  void request_ahead() noexcept;
  // Remembers how far a resize or reserve to `bytes` grew past the last one (for learn).
  void note_growth(std::size_t bytes) noexcept;
  void retire_beyond(std::size_t bytes, stream_ref stream);
  // collect_retired(false) after a resize has taken effect: never throws, so that a stream
  // that cannot be queried (reported) keeps its chunks retired instead of failing a resize
  // that succeeded.
  void collect_passed() noexcept;
  [[nodiscard]] std::size_t active_chunks() const noexcept;
  [[nodiscard]] std::vector<access_grant> grants(memory_kind kind) const;
  [[nodiscard]] chunk_pool& pool_at(std::size_t index) const;
  [[nodiscard]] std::size_t pool_index_of(const shared_chunk& chunk) const noexcept;

  std::shared_ptr<chunk_pool> pool_;
  growable_buffer_options options_;
  mapped_range run_;                     // every chunk mapped, retired ones included
  std::vector<retirement> retirements_;  // ascending first_chunk; the tail of run_'s chunks
  std::size_t capacity_ = 0;             // bytes in active (not retired) chunks
  std::size_t size_ = 0;
  bool host_part_ = false;  // GPU memory first, pinned host memory last in spill_to
  // Growth ahead (null without): the slot the thread fills, the thread, the last grows.
  std::shared_ptr<detail::growth_slot> ahead_;
  std::shared_ptr<detail::growth_worker> worker_;
  std::array<std::size_t, 4> recent_grows_{};
  std::size_t grow_count_ = 0;
  std::size_t asked_ = 0;  // the last size asked for; after a reserve, the capacity
};

}  // namespace vmm
