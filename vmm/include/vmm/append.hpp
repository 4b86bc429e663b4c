#pragma once
/// @file
/// vmm::append_from_kernel: fills a device_vector from a kernel whose output size is known
/// only after it ran, growing the vector in place (no copy: data() stays) and running again
/// only the part that did not fit. A third way beside allocating for the worst case and
/// counting, scanning, allocating, then writing.
///
///     // Keys below a threshold, in any order. The kernel processes inputs
///     // [first, view.limit(n)) and pushes what it selects.
///     __global__ void select_below(const std::uint32_t* keys, std::uint64_t first,
///                                  std::uint64_t n, std::uint32_t threshold,
///                                  vmm::append_view<std::uint32_t> view) {
///       if (view.overflowed()) return;  // this launch will run again
///       const std::uint64_t end = view.limit(n);
///       const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
///       for (std::uint64_t i = first + std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
///            i < end; i += stride)
///         if (keys[i] < threshold) view.push(keys[i]);
///     }
///
///     vmm::device_vector<std::uint32_t> selected(vmm::location::device(0));
///     const std::size_t appended = vmm::append_from_kernel(
///         selected,
///         [&](vmm::append_view<std::uint32_t> view, std::size_t first, vmm::stream_ref stream) {
///           select_below<<<blocks, 256, 0, stream.get()>>>(keys, first, n, threshold, view);
///         },
///         stream, {.input_count = n});
///
/// A round. The launch is called once per window of inputs (one window [first, end) when
/// options.input_count is 0), in stream order, each with a view whose input_end is the
/// window's end, and the counter is noted after each window. Then the host reads the small
/// status block once (the round's only round trip). If every window fit, the vector's size
/// becomes the count and the call returns. Otherwise the first window that did not fit and
/// all after it are the unfinished part: the count goes back to where that window began
/// (see vmm/append_view.hpp for why this is exact), the vector grows in place, and the next
/// round starts at that window's first input. The order of the appended elements is
/// unspecified.
///
/// Windows and growth (docs/design/append.md has the reasons and measurements). With
/// input_count n the inputs left are cut into windows from 1/64 to 1/8 of them, so that a
/// capacity far too small says so early and a late overflow redoes little; each window costs
/// a launch and an 8-byte copy (leave input_count 0 where no overflow is expected). The
/// refused window's count is its demand: the capacity grows to the elements committed plus
/// that demand plus the rest of the inputs at its rate with 1/16 headroom (or by
/// options.growth_factor), mapped exactly (device_vector::reserve_exact), and while the next
/// round runs the vector maps, window by window, what the windows are predicted to need. The
/// counter and the window notes live in the last 256 bytes of the vector's capacity.
///
/// Errors and guarantees. A launch that throws, a kernel fault (an illegal address, a trap:
/// reported by the read of the status block as vmm::driver_error), a launch the runtime
/// refused (vmm::driver_error with the cudaError_t, when compiled by nvcc), and a growth past
/// max_size() or the pool's cap (vmm::out_of_memory) are thrown, and leave size() and the
/// elements before it unchanged; capacity() may have grown. An error while a round is being
/// queued waits for the windows already queued before it is thrown, so that none still
/// writes when the caller frees the vector. Nothing is allocated besides the vector's own
/// capacity. After a kernel fault the CUDA context is unusable, as always.
///
/// Host memory. With a vector in OS host memory (location::os_host(): its provider is
/// host-accessible and its executor synchronous) the launch may be a host function that
/// pushes through the view from host threads, joined before it returns.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

#include "vmm/append_view.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/error.hpp"
#include "vmm/provider.hpp"
#include "vmm/stream_executor.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm {

/// What an append_from_kernel call did.
struct append_statistics {
  std::size_t rounds = 0;    ///< rounds run (1: everything fit at once)
  std::size_t launches = 0;  ///< calls of the launch, over all rounds
  std::size_t growths = 0;   ///< times the vector grew (one or more per refused round)
  double grow_seconds = 0;   ///< host time spent growing the vector (mapping memory)
};

/// Settings of append_from_kernel.
struct append_options {
  /// The number of inputs, n, when the caller knows it: each round is then cut into windows
  /// so that an overflow redoes one window (see the file comment). 0: one launch per round.
  std::size_t input_count = 0;
  /// 0: grow from the overflow information. Greater than 1: multiply the capacity by this
  /// at each overflow (geometric growth).
  double growth_factor = 0;
  /// When set, receives what the call did when it returns.
  append_statistics* statistics = nullptr;
};

namespace detail {

// The status block at the end of the capacity: the counter, then the count after each
// window of the round.
inline constexpr std::size_t append_status_bytes = 256;
inline constexpr std::size_t append_max_windows = append_status_bytes / sizeof(std::uint64_t) - 1;
inline constexpr std::uint64_t append_window_alignment = 4096;  // inputs
inline constexpr double append_headroom = 1.0 + 1.0 / 16;       // on the estimated rest

struct append_status {
  std::uint64_t count;
  std::uint64_t window_counts[append_max_windows];
};
static_assert(sizeof(append_status) == append_status_bytes);

// The ends of the windows [first, n) is cut into (see the file comment). n == 0 means
// unknown: one window to the end.
inline std::vector<std::uint64_t> append_windows(std::uint64_t first, std::uint64_t n) {
  if (n == 0) return {no_input_end};
  std::vector<std::uint64_t> ends;
  if (first >= n) return ends;
  const std::uint64_t left = n - first;
  const auto aligned = [](std::uint64_t inputs) {
    const std::uint64_t a = append_window_alignment;
    return std::max(a, (inputs + a - 1) / a * a);
  };
  const std::uint64_t largest = aligned((left + 7) / 8);
  std::uint64_t window = std::min(aligned((left + 63) / 64), largest);
  for (std::uint64_t begin = first; begin < n; begin = ends.back()) {
    // The last window takes what is left rather than exceed the status block.
    const bool last = ends.size() + 1 == append_max_windows;
    ends.push_back(last || n - begin <= window ? n : begin + window);
    window = std::min(window * 2, largest);
  }
  return ends;
}

// Where the status block is, and how many slots lie before it, for the capacity mapped now.
template <class T>
struct append_layout {
  append_status* status = nullptr;
  std::uint64_t slots = 0;
};

template <class T>
append_layout<T> append_layout_of(device_vector<T>& vector) {
  const std::size_t bytes = vector.capacity() * sizeof(T);
  if (bytes < append_status_bytes) return {};
  const std::size_t at = (bytes - append_status_bytes) / alignof(append_status) * alignof(append_status);
  return {reinterpret_cast<append_status*>(reinterpret_cast<std::byte*>(vector.data()) + at), at / sizeof(T)};
}

// Elements of capacity the status block takes, alignment included.
template <class T>
constexpr std::size_t append_status_elements() {
  return (append_status_bytes + alignof(append_status) + sizeof(T) - 1) / sizeof(T);
}

// Elements to reserve for `slots` slots and the status block after them.
template <class T>
std::size_t append_elements_for(std::uint64_t slots) {
  return static_cast<std::size_t>(slots) + append_status_elements<T>();
}

// The most slots a reserve within max_size() can give a launch.
template <class T>
std::uint64_t append_most_slots(const device_vector<T>& vector) {
  const std::size_t most = vector.max_size();
  return most > append_status_elements<T>() ? most - append_status_elements<T>() : 0;
}

// Maps room for at least `wanted` slots, or failing that for `needed` (<= wanted); adds the
// time it took to `statistics`.
template <class T>
void append_reserve(device_vector<T>& vector, std::uint64_t wanted, std::uint64_t needed, stream_ref stream,
                    append_statistics& statistics) {
  const auto started = std::chrono::steady_clock::now();
  try {
    vector.reserve_exact(append_elements_for<T>(wanted), stream);
  } catch (const out_of_memory&) {
    if (needed >= wanted) throw;
    vector.reserve_exact(append_elements_for<T>(needed), stream);
  }
  ++statistics.growths;
  statistics.grow_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

// Growth spread over a round: after a refused window measured how many elements an input
// produces, the round maps, before each window, what the windows so far are predicted to
// need, so that the GPU runs the windows already queued while the host maps the next part.
struct append_growth_plan {
  double rate = 0;           // elements per input, with headroom
  std::uint64_t wanted = 0;  // the capacity the round grows toward (0: no plan)
  std::uint64_t base = 0;    // the count where the round begins
  std::uint64_t first = 0;   // the round's first input

  [[nodiscard]] std::uint64_t predicted(std::uint64_t end) const {
    const double need = static_cast<double>(base) + rate * static_cast<double>(end - first);
    return std::min(wanted, static_cast<std::uint64_t>(need) + 1);
  }
  // What to map for a window ending at `end` when `slots` are mapped: its predicted need, in
  // steps of at least an eighth of the growth, so that each mapping (a fixed cost per chunk,
  // mostly) has several windows' work to hide behind.
  [[nodiscard]] std::uint64_t target(std::uint64_t end, std::uint64_t slots) const {
    return std::min(wanted, std::max(predicted(end), slots + (wanted - base) / 8));
  }
};

#if defined(__CUDACC__)
// A launch the runtime refused (bad configuration, no kernel image) leaves no trace the
// driver calls below would see: ask the runtime. Not for memory whose work is done at once
// (OS host memory), where the launch may be a host function on a machine without CUDA.
inline void check_append_launch(bool queued) {
  if (!queued) return;
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess)
    throw driver_error(static_cast<int>(launched),
                       std::string("vmm::append_from_kernel: the launch failed: ") +
                           cudaGetErrorName(launched) + " (" + cudaGetErrorString(launched) + ")");
}
#else
inline void check_append_launch(bool) {}
#endif

}  // namespace detail

/// Appends to `vector` what `launch` pushes, growing the vector in place and launching again
/// what did not fit, until everything fit; see the file comment. All work is queued on
/// `stream`, which is synchronized once per round.
/// @param launch called as launch(append_view<T> view, std::size_t first_input, stream_ref
///        stream): queues on `stream` the processing of inputs [first_input, view.limit(n)),
///        under the contract of vmm/append_view.hpp. With a vector in OS host memory it may
///        do the work itself, on host threads.
/// @return the number of elements appended (size() grew by it).
/// @throws whatever `launch` throws; vmm::driver_error for a kernel fault or a refused
///         launch; vmm::out_of_memory when the vector cannot grow enough. size() and the
///         elements before it are then unchanged.
template <class T, class Launch>
requires std::invocable<Launch&, append_view<T>, std::size_t, stream_ref> std::size_t append_from_kernel(
    device_vector<T>& vector, Launch&& launch, stream_ref stream, append_options options = {}) {
  const auto& provider = vector.provider();
  stream_executor& executor = provider->executor();
  // Work queued for later (GPU and pinned memory) rather than done at once (OS host memory).
  const bool queued = !provider->capabilities().synchronous;
  const std::uint64_t start = vector.size();
  const std::uint64_t n = options.input_count;
  append_statistics statistics;
  std::uint64_t first = 0;                          // the first input not yet committed
  std::uint64_t committed = start;                  // elements committed: the count where `first` begins
  std::uint64_t last_refused_first = no_input_end;  // where the last round was refused
  detail::append_growth_plan plan;                  // growth while the next round runs
  bool memory_short = false;                        // a plan ran out of memory: plan no more
  const std::uint64_t most = detail::append_most_slots(vector);
  if (detail::append_layout_of(vector).slots <= committed)  // room for the status block
    vector.reserve_exact(detail::append_elements_for<T>(committed + 1), stream);

  for (;;) {
    const std::vector<std::uint64_t> ends = detail::append_windows(first, n);
    if (ends.empty()) break;
    ++statistics.rounds;
    detail::append_layout<T> layout = detail::append_layout_of(vector);
    const std::uint64_t initial = committed;
    executor.copy(&layout.status->count, &initial, sizeof initial, stream);
    std::vector<std::uint64_t> slots(ends.size());  // the capacity each window was given
    try {
      std::uint64_t begin = first;
      for (std::size_t k = 0; k < ends.size(); ++k) {
        if (plan.wanted > layout.slots && plan.predicted(ends[k]) > layout.slots) {
          // Map this window's predicted need while the GPU runs the windows before it. Out of
          // memory only ends the plan: a window that then does not fit is refused, and the
          // next round grows by what it needed, or says that it cannot.
          try {
            const std::uint64_t target = plan.target(ends[k], layout.slots);
            detail::append_reserve(vector, target, target, stream, statistics);
          } catch (const out_of_memory&) {
            plan.wanted = 0;
            memory_short = true;
          }
          const detail::append_layout<T> grown = detail::append_layout_of(vector);
          if (grown.status != layout.status)  // the counter and the notes so far move along
            executor.copy(grown.status, layout.status, sizeof(detail::append_status), stream);
          layout = grown;
        }
        slots[k] = layout.slots;
        const append_view<T> view{vector.data(), layout.slots, &layout.status->count, ends[k]};
        launch(view, static_cast<std::size_t>(begin), stream);
        ++statistics.launches;
        detail::check_append_launch(queued);
        executor.copy(&layout.status->window_counts[k], &layout.status->count, sizeof(std::uint64_t), stream);
        begin = ends[k];
      }
    } catch (...) {
      // What was queued may still write past size(): let it finish before the caller frees
      // the vector. A fault it reports is the caller's error already being thrown.
      try {
        executor.synchronize(stream);
      } catch (...) {}
      throw;
    }
    detail::append_status seen{};
    executor.copy(&seen, layout.status, sizeof(std::uint64_t) * (1 + ends.size()), stream);
    executor.synchronize(stream);

    // The first window whose count passes its capacity was refused; those before it committed.
    std::size_t refused = 0;
    while (refused < ends.size() && seen.window_counts[refused] <= slots[refused]) ++refused;
    if (refused == ends.size()) {
      committed = seen.window_counts[ends.size() - 1];
      break;
    }
    const std::uint64_t refused_first = refused == 0 ? first : ends[refused - 1];
    const std::uint64_t before = refused == 0 ? committed : seen.window_counts[refused - 1];
    const std::uint64_t demand = seen.window_counts[refused] - before;
    const std::uint64_t needed = before + demand;  // the refused window fits
    const std::uint64_t capacity = detail::append_layout_of(vector).slots;
    std::uint64_t wanted = needed;
    plan = {};
    if (options.growth_factor > 1) {
      wanted = std::max(static_cast<std::uint64_t>(static_cast<double>(capacity) * options.growth_factor),
                        capacity + 1);
    } else {
      if (n != 0 && ends[refused] < n) {
        const double rate = static_cast<double>(demand) / static_cast<double>(ends[refused] - refused_first);
        const double rest = rate * static_cast<double>(n - ends[refused]) * detail::append_headroom;
        wanted += static_cast<std::uint64_t>(rest) + 1;
        wanted = std::max(needed, std::min(wanted, most));  // the headroom only where max_size allows
        if (!memory_short) plan = {rate * detail::append_headroom, wanted, before, refused_first};
      }
      // Refused again where the last round was: the demand was not the whole story (the
      // kernel stops early, or pushes other elements each time). Double, to make progress.
      if (refused_first == last_refused_first) {
        wanted = std::max(wanted, 2 * capacity);
        plan = {};
      }
    }
    // Now what the refused window needs (or, with a plan, the next round's first window,
    // if more); the plan maps the rest while the next round runs.
    const std::uint64_t now =
        plan.wanted != 0
            ? std::max(needed, plan.target(detail::append_windows(refused_first, n)[0], capacity))
            : wanted;
    if (now > capacity) detail::append_reserve(vector, now, std::min(now, needed), stream, statistics);
    first = refused_first;
    committed = before;
    last_refused_first = refused_first;
  }

  vector.resize(static_cast<std::size_t>(committed), element_init::uninitialized, stream);
  if (options.statistics != nullptr) *options.statistics = statistics;
  return static_cast<std::size_t>(committed - start);
}

}  // namespace vmm
