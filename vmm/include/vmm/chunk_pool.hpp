#pragma once
/// @file
/// A per-location cache of physical chunks, shared by buffers, with statistics.
///
///     auto pool = vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0)),
///                                         {.release_threshold = 1ull << 30});
///     vmm::growable_buffer a(pool), b(pool);   // both draw chunks from `pool`
///     a.resize(256 << 20);                     // creates memory (cuMemCreate)
///     a.resize(0); b.resize(256 << 20);        // b takes a's chunks: no driver call
///     pool->trim_to(0);                        // idle memory back to the device
///
/// Creating and releasing physical memory costs the driver tens of microseconds a handle
/// (more for large ones); a pool keeps chunks that buffers give back and hands them out
/// again without calling cuMemCreate/cuMemRelease. Its knobs and counters mean what the
/// CUDA stream-ordered allocator's do:
///  - release_threshold (cudaMemPoolAttrReleaseThreshold): idle bytes the pool may hold;
///    after a give-back that leaves more reserved than this, idle chunks are released;
///  - trim_to(n) (cudaMemPoolTrimTo): release idle chunks until at most n bytes are reserved;
///  - reserved / used, current and high (cudaMemPoolAttr{Reserved,Used}Mem{Current,High});
///  - cap: reserved bytes never exceed it; a request that would is vmm::out_of_memory.
/// Stream order: a chunk given back with a stream is handed to a request on another stream
/// only once the giving stream has passed the point where it gave the chunk back; a request
/// on the same stream may take it at once (its work is ordered after). Thread-safe.

#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <atomic>

#include "vmm/physical_allocation.hpp"
#include "vmm/provider.hpp"
#include "vmm/stream_executor.hpp"

namespace vmm {

/// Counters with the meaning of cudaMemPoolAttr{Reserved,Used}Mem{Current,High}.
struct pool_statistics {
  std::size_t reserved_current = 0;  ///< physical bytes the pool holds, in use or idle
  std::size_t reserved_high = 0;
  std::size_t used_current = 0;  ///< bytes handed out and not given back
  std::size_t used_high = 0;
  std::size_t chunks_created = 0;   ///< cuMemCreate calls made (lifetime)
  std::size_t chunks_reused = 0;    ///< requests served from idle chunks (lifetime)
  std::size_t chunks_released = 0;  ///< cuMemRelease calls made (lifetime)
};

/// Settings of a pool.
struct chunk_pool_options {
  /// Idle bytes are released whenever reserved memory exceeds this after a give-back.
  std::size_t release_threshold = std::numeric_limits<std::size_t>::max();
  /// Reserved memory never exceeds this.
  std::size_t cap = std::numeric_limits<std::size_t>::max();
};

class chunk_pool;

/// Names no stream: chunk_pool::acquire(size, any_stream) lends only chunks that every
/// stream may use at once, for work whose stream is not known yet (growth ahead).
struct any_stream_t {
  explicit any_stream_t() = default;
};
inline constexpr any_stream_t any_stream{};

/// A physical chunk lent by a pool. Move-only; destroying it gives it back at once
/// (give_back(stream) gives it back in stream order instead).
class pooled_chunk {
 public:
  pooled_chunk() noexcept = default;
  pooled_chunk(pooled_chunk&& other) noexcept
      : pool_(std::move(other.pool_)),
        memory_(std::move(other.memory_)),
        discarded_(other.discarded_.exchange(false)) {}
  pooled_chunk& operator=(pooled_chunk&& other) noexcept;
  /// Memory that belongs to no pool (imported from another process, say): destroyed when
  /// the last holder lets go.
  [[nodiscard]] static pooled_chunk own(physical_allocation memory) noexcept {
    return pooled_chunk(nullptr, std::move(memory));
  }
  pooled_chunk(const pooled_chunk&) = delete;
  pooled_chunk& operator=(const pooled_chunk&) = delete;
  ~pooled_chunk();

  [[nodiscard]] const physical_allocation& memory() const noexcept { return memory_; }
  [[nodiscard]] std::size_t size() const noexcept { return memory_.size(); }
  /// The pool it goes back to (null for memory that belongs to no pool).
  [[nodiscard]] const std::shared_ptr<chunk_pool>& pool() const noexcept { return pool_; }
  explicit operator bool() const noexcept { return static_cast<bool>(memory_); }
  /// Gives the chunk back; other streams get it once `stream` passes this point.
  /// @throws vmm::invalid_argument the chunk is empty.
  void give_back(stream_ref stream);
  /// Says that the memory must never be lent again: it is still mapped somewhere it could
  /// not be unmapped from. When the chunk is given back, the pool destroys the handle
  /// instead of keeping it (the mapping keeps the memory alive) and stops counting it.
  void discard() const noexcept { discarded_ = true; }

 private:
  friend class chunk_pool;
  pooled_chunk(std::shared_ptr<chunk_pool> pool, physical_allocation memory) noexcept
      : pool_(std::move(pool)), memory_(std::move(memory)) {}
  void return_to_pool(bool ordered, stream_ref stream) noexcept;
  std::shared_ptr<chunk_pool> pool_;
  physical_allocation memory_;
  mutable std::atomic<bool> discarded_{false};
};

/// See the file comment. Always held by std::shared_ptr (chunks keep their pool alive).
class chunk_pool : public std::enable_shared_from_this<chunk_pool> {
  struct private_tag {};

 public:
  /// A new pool over `provider`.
  /// @throws vmm::invalid_argument the provider is null.
  [[nodiscard]] static std::shared_ptr<chunk_pool> create(std::shared_ptr<memory_provider> provider,
                                                          chunk_pool_options options = {});
  chunk_pool(private_tag, std::shared_ptr<memory_provider> provider, chunk_pool_options options);
  chunk_pool(const chunk_pool&) = delete;
  chunk_pool& operator=(const chunk_pool&) = delete;
  ~chunk_pool();

  /// A chunk of exactly `size` bytes (rounded up to the granularity) for use on `stream`:
  /// an idle one when there is one this stream may use, else a new one. Running out
  /// releases idle chunks and tries once more.
  /// @throws vmm::out_of_memory the cap or the memory is exhausted.
  /// @throws vmm::invalid_argument size is 0.
  /// @throws vmm::os_error, vmm::driver_error creating the memory failed for another reason.
  /// @throws vmm::driver_error querying whether an idle chunk's stream has passed failed.
  [[nodiscard]] pooled_chunk acquire(std::size_t size, stream_ref stream = {});
  /// The same for work whose stream is not known yet: only an idle chunk every stream may
  /// use at once (none still waiting for the stream that gave it back), else a new one.
  /// @throws as acquire(size, stream).
  [[nodiscard]] pooled_chunk acquire(std::size_t size, any_stream_t);
  /// The largest idle chunk of at most `max_size` bytes that `stream` may use, or an empty
  /// chunk. Never creates memory.
  /// @throws vmm::driver_error querying whether an idle chunk's stream has passed failed.
  [[nodiscard]] pooled_chunk acquire_idle(std::size_t max_size, stream_ref stream = {});
  /// @throws as acquire_idle(max_size, stream).
  [[nodiscard]] pooled_chunk acquire_idle(std::size_t max_size, any_stream_t);

  /// Releases idle chunks (those no stream still has to pass) until at most
  /// `bytes_to_keep` bytes are reserved or none is left to release. A chunk that cannot be
  /// destroyed is reported (report_cleanup_failure).
  /// @throws vmm::driver_error querying whether an idle chunk's stream has passed failed.
  void trim_to(std::size_t bytes_to_keep);
  /// Throws nothing but std::system_error from a broken mutex.
  [[nodiscard]] pool_statistics statistics() const;
  /// Sets reserved_high and used_high to the current values. As statistics().
  void reset_high_water_marks();
  /// Sets the release threshold and releases idle chunks above it now.
  /// @throws as trim_to().
  void set_release_threshold(std::size_t bytes);
  /// A cap below what is reserved now only stops further growth. As statistics().
  void set_cap(std::size_t bytes);
  /// As statistics().
  [[nodiscard]] chunk_pool_options options() const;

  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept { return provider_; }
  [[nodiscard]] std::size_t granularity() const noexcept { return provider_->capabilities().granularity; }

 private:
  friend class pooled_chunk;
  struct idle_chunk {
    // A constructor for emplace: clang before 16 has no parenthesized aggregate init.
    idle_chunk(physical_allocation&& given, stream_ref on, bool is_ordered, stream_event&& passed)
        : memory(std::move(given)), stream(on), ordered(is_ordered), ready(std::move(passed)) {}
    physical_allocation memory;
    stream_ref stream;
    bool ordered = false;  // given back with a stream: others wait for `ready`
    stream_event ready;
  };
  using idle_map = std::multimap<std::size_t, idle_chunk>;

  // Takes back `memory` (or, when discarded, destroys it and stops counting it).
  void give_back(physical_allocation memory, bool ordered, stream_ref stream, bool discarded) noexcept;
  // Picks a usable idle chunk in [first, last), or last.
  // `stream` empty: any stream (only chunks every stream may use).
  idle_map::iterator find_usable(idle_map::iterator first, idle_map::iterator last,
                                 std::optional<stream_ref> stream) const;
  pooled_chunk acquire_for(std::size_t size, std::optional<stream_ref> stream);
  pooled_chunk acquire_idle_for(std::size_t max_size, std::optional<stream_ref> stream);
  // Creates a chunk of `size` bytes, counted already; uncounts it when creating fails.
  pooled_chunk create_counted(std::size_t size);
  pooled_chunk lend(idle_map::iterator it);  // under the lock
  // Moves idle chunks nobody waits for out of the pool until reserved <= target.
  std::vector<physical_allocation> evict_until(std::size_t target);  // under the lock
  void note_usage();                                                 // under the lock

  std::shared_ptr<memory_provider> provider_;
  mutable std::mutex mutex_;
  chunk_pool_options options_;
  pool_statistics statistics_;
  idle_map idle_;
};

/// The process-wide pool for `where` (created on first use, never destroyed), which buffers
/// made from a location use. Like every pool it keeps the chunks given back to it (release
/// threshold unlimited), so that the next growth costs no cuMemCreate: call
/// trim_to(0) or set_release_threshold() on it to hand idle memory back to the device.
/// @throws vmm::invalid_argument, vmm::driver_unavailable as provider_for().
[[nodiscard]] std::shared_ptr<chunk_pool> default_pool(location where);

}  // namespace vmm
