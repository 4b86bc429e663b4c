#pragma once
/// @file
/// append_view<T>: what a kernel uses to append elements to a vmm::device_vector when how many
/// there will be is known only once the kernel has run (filters, stream compaction, graph
/// frontiers). vmm::append_from_kernel (vmm/append.hpp) builds the views, runs the caller's
/// kernel, grows the vector in place when the capacity ran out and runs again the part that
/// did not fit. Trivially copyable: pass it to kernels by value. On vectors in OS host memory
/// the same view works from host threads (see "Host path" below).
///
/// Slots. A view holds the vector's data(), `capacity` (the slots this launch may write) and a
/// 64-bit counter (in the vector's memory, past those slots). A push reserves slots by adding to
/// the counter and stores each element whose slot is below `capacity`; the rest are refused, and
/// nothing is ever written at or past `capacity`. Refused slots are counted all the same, so after
/// a launch `count > capacity` says that the capacity ran out, and the counter's advance is how
/// many elements the launch produced: the overflow information the vector grows by.
///
/// Why a refused launch is redone whole (the overflow protocol in one paragraph). Slots go to
/// whichever warp asks first, so when the capacity runs out some elements of late inputs may
/// already hold slots while an element of an earlier input is refused: no input index
/// separates what was stored from what was not, and relaunching "from the first refused
/// input" would append twice the elements of later inputs that had fit. The launch is
/// therefore the unit that either commits or is redone. append_from_kernel cuts the inputs
/// into windows launched one after the other in stream order (`input_end` is the current
/// window's end), notes the counter after each, and after the round reads those notes once:
/// the windows before the first one whose note passes `capacity` are committed, and the count
/// goes back to the note before it. What the refused window did store lies past that point
/// and is overwritten when it runs again, or left past size(). Later windows see
/// overflowed() and return at once; were they to run, every push of theirs would be refused.
/// So the relaunch is exact, with no tag per element and no order between warps, and costs
/// one window's work (see append.hpp for the window sizes and how the vector grows).
///
/// What a launch must do (the contract append_from_kernel relies on):
///  - process the inputs [first_input, limit(n)), pushing elements for those inputs only;
///  - preferably push the same elements for an input each time it processes it. Exactness
///    does not depend on it (the elements kept are those of the one run of each window that
///    committed), but the vector grows by what the refused run counted;
///  - (recommended) return at once when overflowed() at its start: an earlier window of the
///    round was refused, so this one runs again anyway. A launch may also stop once
///    overflowed() midway; its window is redone all the same, but the vector then grows by a
///    partial count, possibly in more steps.
/// The order of the appended elements is unspecified.
///
/// Aggregation. push(value) and push(values, count) gather the lanes that call them with
/// cooperative_groups::coalesced_threads(): one atomic per warp and call. push_selected(values,
/// keep) takes N candidates a lane and a mask of those to keep, one atomic for the warp's
/// 32 * N candidates, with the kept values of one j stored coalesced. push_selected_block
/// aggregates over a thread block (one atomic per block and call, the kept values gathered in
/// shared memory); it needs every thread of the block in every call. The fewer atomics the
/// shared counter sees, the closer a filter runs to its read floor (docs/design/append.md,
/// "Aggregation"). append_atomics::per_thread selects a plain atomicAdd per element.
///
/// Memory ordering. The counter is advanced with relaxed device-scope atomics and elements
/// are plain stores to distinct slots. Work queued after the launch in stream order sees the
/// elements and the counter (append_from_kernel reads the counter only after the stream).
/// Reading, within one launch, elements that other threads of it appended is outside this
/// protocol.
///
/// Host path. Compiled for the host (a .cpp file, or the host side of a .cu file) the same
/// functions advance the counter with std::atomic_ref (relaxed) and store with plain stores,
/// so that append_from_kernel also runs a host function over a vector in OS host memory:
/// that is how its protocol is tested without a GPU. Host threads that push must be joined
/// before the launch returns.

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#if defined(__CUDACC__)
#include <cooperative_groups.h>
#include <cooperative_groups/scan.h>

#include <cuda/atomic>
#include <cuda/std/span>
#endif

#include "vmm/host_device.hpp"

namespace vmm {

/// How a push reserves its slots on the device.
enum class append_atomics : std::uint8_t {
  per_warp,    ///< one atomic per warp and call, explicitly aggregated (coalesced_group)
  per_thread,  ///< one atomicAdd per element, as written (the compiler may aggregate it)
};

/// The input end of a launch that is given no window (all inputs to the end).
inline constexpr std::uint64_t no_input_end = std::numeric_limits<std::uint64_t>::max();

namespace detail {

VMM_HOST_DEVICE inline std::uint64_t load_relaxed(const std::uint64_t* counter) {
#if defined(__CUDA_ARCH__)
  return cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device>(*const_cast<std::uint64_t*>(counter))
      .load(cuda::std::memory_order_relaxed);
#else
  return std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(counter)).load(std::memory_order_relaxed);
#endif
}

#if !defined(__CUDA_ARCH__)
inline std::uint64_t host_fetch_add(std::uint64_t* counter, std::uint64_t n) {
  return std::atomic_ref<std::uint64_t>(*counter).fetch_add(n, std::memory_order_relaxed);
}
#endif

#if defined(__CUDACC__)
static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));

__device__ inline std::uint64_t device_fetch_add(std::uint64_t* counter, std::uint64_t n) {
  return atomicAdd(reinterpret_cast<unsigned long long*>(counter), static_cast<unsigned long long>(n));
}

__device__ inline unsigned lane_id() {
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

__device__ inline unsigned lanes_below() {
  unsigned mask;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
  return mask;
}
#endif

}  // namespace detail

#if defined(__CUDACC__)
/// The shared memory of append_view::push_selected_block: declare one per block,
/// `__shared__ vmm::append_block_storage<T, BlockThreads, N> storage;`, and pass it to every
/// call (BlockThreads * N values of T, plus a few words).
template <class T, int BlockThreads, int N>
struct append_block_storage {
  static_assert(BlockThreads % 32 == 0 && BlockThreads >= 32 && BlockThreads <= 1024,
                "a block of 32 to 1024 threads, whole warps");
  static_assert(N >= 1 && N <= 32, "push_selected_block takes 1 to 32 candidates per thread");
  static constexpr int warps = BlockThreads / 32;
  T kept[BlockThreads * N];    // the block's kept values, in slot order
  unsigned warp_kept[warps];   // values each warp kept
  unsigned warp_first[warps];  // where each warp's values start in `kept`
  std::uint64_t first_slot;    // the block's first slot
  unsigned block_kept;         // values the block kept
};
#endif

/// Appends elements of `T` to a vector from kernels (or host threads, for vectors in OS host
/// memory). See the file comment for the protocol. Trivially copyable; its pointers are valid
/// during the launch append_from_kernel gave it to.
/// @tparam T a trivially copyable type (as for device_vector).
template <class T>
struct append_view {
  static_assert(std::is_trivially_copyable_v<T>, "vmm::append_view<T> needs a trivially copyable T");

  T* data = nullptr;                       ///< the vector's first element
  std::uint64_t capacity = 0;              ///< slots [0, capacity) may be written
  std::uint64_t* count = nullptr;          ///< slots reserved so far, refused ones included
  std::uint64_t input_end = no_input_end;  ///< inputs at or past this are another launch's

  /// The end of this launch's inputs when there are `n` in all: min(n, input_end). A kernel
  /// processes [first_input, limit(n)).
  [[nodiscard]] VMM_HOST_DEVICE std::uint64_t limit(std::uint64_t n) const {
    return n < input_end ? n : input_end;
  }

  /// Whether a push has been refused for want of capacity (in this launch or one before it
  /// in the same round): this launch will be run again, so it may stop.
  [[nodiscard]] VMM_HOST_DEVICE bool overflowed() const { return detail::load_relaxed(count) > capacity; }

  /// Appends `value`. Any thread may call it, in any branch.
  /// @return whether the value was stored (false: the capacity ran out).
  template <append_atomics Atomics = append_atomics::per_warp>
  VMM_HOST_DEVICE bool push(const T& value) const {
#if defined(__CUDA_ARCH__)
    std::uint64_t slot = 0;
    if constexpr (Atomics == append_atomics::per_thread) {
      slot = detail::device_fetch_add(count, 1);
    } else {
      namespace cg = cooperative_groups;
      const cg::coalesced_group group = cg::coalesced_threads();
      std::uint64_t first = 0;
      if (group.thread_rank() == 0) first = detail::device_fetch_add(count, group.num_threads());
      slot = group.shfl(first, 0) + group.thread_rank();
    }
#else
    const std::uint64_t slot = detail::host_fetch_add(count, 1);
#endif
    if (slot >= capacity) return false;
    data[slot] = value;
    return true;
  }

  /// Appends `n` values from `values` (this thread's own; other threads may append theirs in
  /// the same call). Each thread's values stay together and in order.
  /// @return whether all of this thread's values were stored.
  template <append_atomics Atomics = append_atomics::per_warp>
  VMM_HOST_DEVICE bool push(const T* values, std::uint64_t n) const {
#if defined(__CUDA_ARCH__)
    std::uint64_t first = 0;
    if constexpr (Atomics == append_atomics::per_thread) {
      if (n == 0) return true;
      first = detail::device_fetch_add(count, n);
    } else {
      namespace cg = cooperative_groups;
      const cg::coalesced_group group = cg::coalesced_threads();
      const std::uint64_t before = cg::exclusive_scan(group, n);
      const std::uint64_t total = group.shfl(before + n, group.num_threads() - 1);
      if (total == 0) return true;
      std::uint64_t base = 0;
      if (group.thread_rank() == 0) base = detail::device_fetch_add(count, total);
      first = group.shfl(base, 0) + before;
    }
#else
    if (n == 0) return true;
    const std::uint64_t first = detail::host_fetch_add(count, n);
#endif
    if (first >= capacity) return false;
    const std::uint64_t stored = capacity - first < n ? capacity - first : n;
    for (std::uint64_t i = 0; i < stored; ++i) data[first + i] = values[i];
    return stored == n;
  }

#if defined(__CUDACC__)
  /// push(values.data(), values.size()).
  template <append_atomics Atomics = append_atomics::per_warp>
  VMM_HOST_DEVICE bool push(cuda::std::span<const T> values) const {
    return push<Atomics>(values.data(), values.size());
  }
#else
  /// push(values.data(), values.size()).
  template <append_atomics Atomics = append_atomics::per_warp>
  bool push(std::span<const T> values) const {
    return push<Atomics>(values.data(), values.size());
  }
#endif

  /// Appends the values[j] whose bit j is set in `keep`: the filter shape, where each lane
  /// holds N candidates. With append_atomics::per_warp the lanes that call together make one
  /// atomic for all their candidates, and the kept values j of all lanes take consecutive
  /// slots (coalesced stores). Any thread may call it, in any branch.
  /// @tparam N candidates per thread, at most 32.
  /// @return whether all of this thread's kept values were stored.
  template <append_atomics Atomics = append_atomics::per_warp, int N>
  VMM_HOST_DEVICE bool push_selected(const T (&values)[N], std::uint32_t keep) const {
    static_assert(N >= 1 && N <= 32, "push_selected takes 1 to 32 candidates per thread");
    if constexpr (N < 32) keep &= (std::uint32_t{1} << N) - 1;
#if defined(__CUDA_ARCH__)
    bool all_stored = true;
    if constexpr (Atomics == append_atomics::per_thread) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        if ((keep >> j) & 1u) {
          const std::uint64_t slot = detail::device_fetch_add(count, 1);
          if (slot < capacity) {
            data[slot] = values[j];
          } else {
            all_stored = false;
          }
        }
      }
    } else {
      // Lane masks rather than coalesced_group::ballot, which packs the bits of a partial
      // group one lane at a time: this is the hot loop of a filter.
      const unsigned lanes = __activemask();
      const unsigned below = detail::lanes_below();
      const auto mine = static_cast<unsigned>(__popc(static_cast<int>(keep)));
#if __CUDA_ARCH__ >= 800
      const unsigned total = __reduce_add_sync(lanes, mine);
#else
      unsigned total = mine;
      for (int delta = 16; delta > 0; delta /= 2) total += __shfl_xor_sync(lanes, total, delta);
#endif
      if (total == 0) return true;
      const int leader = __ffs(static_cast<int>(lanes)) - 1;
      unsigned long long base = 0;
      if (detail::lane_id() == static_cast<unsigned>(leader)) base = detail::device_fetch_add(count, total);
      std::uint64_t offset = __shfl_sync(lanes, base, leader);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const unsigned vote = __ballot_sync(lanes, (keep >> j) & 1u);
        if ((keep >> j) & 1u) {
          const auto rank = static_cast<unsigned>(__popc(static_cast<int>(vote & below)));
          if (offset + rank < capacity) {
            data[offset + rank] = values[j];
          } else {
            all_stored = false;
          }
        }
        offset += static_cast<unsigned>(__popc(static_cast<int>(vote)));
      }
    }
    return all_stored;
#else
    const auto kept = static_cast<std::uint64_t>(std::popcount(keep));
    if (kept == 0) return true;
    std::uint64_t slot = detail::host_fetch_add(count, kept);
    bool all_stored = true;
    for (int j = 0; j < N; ++j) {
      if (((keep >> j) & 1u) == 0) continue;
      if (slot < capacity) {
        data[slot] = values[j];
      } else {
        all_stored = false;
      }
      ++slot;
    }
    return all_stored;
#endif
  }

#if defined(__CUDACC__)
  /// push_selected for a whole thread block at once: the block makes one atomic for all its
  /// BlockThreads * N candidates, gathers the kept values in `storage` (shared memory) and
  /// stores them to consecutive slots with coalesced writes. Every thread of the block must
  /// call it, the same number of times (it has barriers: a thread with nothing to keep
  /// passes keep = 0), and the block must have exactly BlockThreads threads (otherwise the
  /// kernel traps: append_from_kernel reports it as vmm::driver_error). A kernel that stops
  /// when overflowed() must decide it for the whole block: `if (__syncthreads_or(view.overflowed()))
  /// return;`, since threads may read the counter at different moments.
  /// @tparam BlockThreads the block's size, a multiple of 32 up to 1024.
  /// @tparam N candidates per thread, at most 32.
  /// @return whether every value the block kept in this call was stored (the same in every
  ///         thread).
  template <int BlockThreads, int N>
  __device__ bool push_selected_block(const T (&values)[N], std::uint32_t keep,
                                      append_block_storage<T, BlockThreads, N>& storage) const;
#endif
};

static_assert(std::is_trivially_copyable_v<append_view<int>>);
static_assert(std::is_standard_layout_v<append_view<int>>);

#if defined(__CUDACC__)
template <class T>
template <int BlockThreads, int N>
__device__ bool append_view<T>::push_selected_block(const T (&values)[N], std::uint32_t keep,
                                                    append_block_storage<T, BlockThreads, N>& storage) const {
  constexpr unsigned all_lanes = 0xffffffffu;
  constexpr int warps = append_block_storage<T, BlockThreads, N>::warps;
  if (blockDim.x * blockDim.y * blockDim.z != BlockThreads) __trap();  // the barriers would not hold
  if constexpr (N < 32) keep &= (std::uint32_t{1} << N) - 1;
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned lane = thread % 32;
  const unsigned warp = thread / 32;

  // Each warp's count; warp 0 turns them into offsets and makes the block's one atomic.
  const unsigned warp_kept =
      __reduce_add_sync(all_lanes, static_cast<unsigned>(__popc(static_cast<int>(keep))));
  if (lane == 0) storage.warp_kept[warp] = warp_kept;
  __syncthreads();
  if (warp == 0) {
    const unsigned own = lane < warps ? storage.warp_kept[lane] : 0;
    unsigned through = own;  // inclusive scan over the warps
#pragma unroll
    for (int delta = 1; delta < warps; delta *= 2) {
      const unsigned lower = __shfl_up_sync(all_lanes, through, delta);
      if (lane >= static_cast<unsigned>(delta)) through += lower;
    }
    const unsigned total = __shfl_sync(all_lanes, through, warps - 1);
    if (lane < warps) storage.warp_first[lane] = through - own;
    if (lane == 0) {
      storage.block_kept = total;
      storage.first_slot = total == 0 ? 0 : detail::device_fetch_add(count, total);
    }
  }
  __syncthreads();
  const unsigned total = storage.block_kept;
  if (total == 0) return true;

  // Gather in slot order (the kept values j of a warp's lanes are consecutive), then copy out
  // with consecutive threads writing consecutive slots.
  unsigned at = storage.warp_first[warp];
  const unsigned below = detail::lanes_below();
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const unsigned vote = __ballot_sync(all_lanes, (keep >> j) & 1u);
    if ((keep >> j) & 1u)
      storage.kept[at + static_cast<unsigned>(__popc(static_cast<int>(vote & below)))] = values[j];
    at += static_cast<unsigned>(__popc(static_cast<int>(vote)));
  }
  __syncthreads();
  const std::uint64_t first = storage.first_slot;
  const std::uint64_t room = first < capacity ? capacity - first : 0;
  const auto stored = static_cast<unsigned>(room < total ? room : total);
  for (unsigned i = thread; i < stored; i += BlockThreads) data[first + i] = storage.kept[i];
  return stored == total;
}
#endif

}  // namespace vmm
