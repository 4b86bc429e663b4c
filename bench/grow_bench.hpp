#pragma once
/// @file
/// The pieces of vmm_bench_grow: where the bytes are written (a memory_target), and the
/// contenders that grow a buffer there, vmm's and the baselines a user would pick instead.
///
/// One benchmark body runs every contender (the RMM habit: one body, several factories), so
/// they are timed, written and measured alike:
///  - begin() (untimed) makes an empty buffer; grow() (timed) grows it to a new size keeping
///    its contents; the body writes each appended slice once through the target (timed) and
///    synchronizes at the end (timed); end() (untimed) frees the buffer.
///  - Peak memory: where the target can read its free memory (a GPU: cudaMemGetInfo), one
///    untimed probe run samples it after every append, and contenders that free memory
///    while growing (realloc + copy, thrust) also sample right after each allocation, when
///    old and new storage are both alive; elsewhere each contender's own accounting is used.
///
/// This header is shared by the C++ and the CUDA C++ translation units, so it holds no vmm
/// types beyond plain ones and nothing nvcc cannot parse.

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "failure.hpp"
#include "vmm/growable_buffer.hpp"

namespace vmm::bench {

inline constexpr std::size_t mib = std::size_t{1} << 20;
inline constexpr std::size_t gib = std::size_t{1} << 30;

/// Where the bytes live and how they are written: a GPU through the CUDA runtime, or host
/// memory. All contenders of a run write through the same target.
class memory_target {
 public:
  virtual ~memory_target() = default;
  /// "gpu 0: <the device's name>, 139.8 GiB" or "os host".
  [[nodiscard]] virtual std::string name() const = 0;
  /// Whether this is a GPU (the GPU contender set) or host memory (the OS-provider set).
  [[nodiscard]] virtual bool is_gpu() const noexcept = 0;
  /// Writes n bytes at p once (queued on the default stream on a GPU).
  virtual void fill(void* p, std::size_t n) = 0;
  /// Waits for every write queued so far.
  virtual void synchronize() = 0;
  /// Free physical memory now, where the target can read it (nullopt on the host: the
  /// machine's other users make a host-wide figure meaningless for one process).
  [[nodiscard]] virtual std::optional<std::size_t> free_bytes() = 0;
  /// Physical memory at this location.
  [[nodiscard]] virtual std::size_t total_bytes() = 0;
  /// Untimed, before each timed run: waits until the device is done with the `released`
  /// bytes a contender has just freed (settle.hpp says why). The host: no wait.
  virtual void settle(std::size_t /*released*/) {}
};

/// Samples a target's free memory and keeps the lowest value seen.
class memory_probe {
 public:
  explicit memory_probe(memory_target& target)
      : target_(&target), start_(target.free_bytes()), lowest_(start_) {}
  /// Reads the free memory now (no-op where the target cannot).
  void sample() {
    if (!start_) return;
    const std::optional<std::size_t> now = target_->free_bytes();
    if (now && *now < *lowest_) lowest_ = now;
  }
  /// The largest drop of free memory since construction, where measured.
  [[nodiscard]] std::optional<std::size_t> peak_drop() const {
    if (!start_) return std::nullopt;
    return *start_ - *lowest_;
  }

 private:
  memory_target* target_;
  std::optional<std::size_t> start_;
  std::optional<std::size_t> lowest_;
};

/// Physical bytes a baseline holds, by its own accounting.
struct allocation_tracker {
  std::size_t current = 0;
  std::size_t high = 0;
  std::size_t allocations = 0;
  void allocated(std::size_t bytes) noexcept {
    current += bytes;
    ++allocations;
    if (current > high) high = current;
  }
  void freed(std::size_t bytes) noexcept { current -= bytes; }
  void reset() noexcept { *this = {}; }
};

/// What a contender is in the comparison (the benchmark's label; the report reads it).
enum class contender_role { floor, vmm, baseline };

/// "floor", "vmm", "baseline".
inline const char* to_string(contender_role role) noexcept {
  switch (role) {
    case contender_role::floor:
      return "floor";
    case contender_role::vmm:
      return "vmm";
    case contender_role::baseline:
      return "baseline";
  }
  return "?";
}

/// One way to grow a buffer. Lives for one run of a benchmark (several iterations), so a
/// warm pool can outlive an iteration but not the benchmark.
class grow_contender {
 public:
  virtual ~grow_contender() = default;
  /// Untimed: an empty buffer that will grow to `final_size` bytes. `probe` (null in timed
  /// iterations) is sampled after allocations made while growing.
  virtual void begin(std::size_t final_size, memory_probe* probe) = 0;
  /// Timed: grows the buffer to `new_size` bytes, keeping its contents; returns its first
  /// byte (which may move).
  virtual char* grow(std::size_t new_size) = 0;
  /// Untimed: frees the buffer (and a cold pool's memory). Never throws.
  virtual void end() noexcept = 0;
  /// Physical bytes held at the high-water mark since begin(), by the contender's own
  /// accounting (for vmm: the pool's reserved_high).
  [[nodiscard]] virtual std::size_t own_peak_bytes() const = 0;
  /// vmm: chunks mapped now; baselines: allocations made since begin().
  [[nodiscard]] virtual std::size_t handle_count() const = 0;
};

/// One grow of one chunk and its undo, for the per-grow cost with a warm pool.
class grow_once_contender {
 public:
  virtual ~grow_once_contender() = default;
  /// Timed: maps one chunk and makes it accessible.
  virtual void grow() = 0;
  /// Untimed: unmaps it again (the memory stays with the contender).
  virtual void undo() = 0;
  /// Physical chunks created since construction (0 for a pool that stayed warm).
  [[nodiscard]] virtual std::size_t chunks_created() const { return 0; }
};

/// A named contender and how to make it.
struct grow_entry {
  std::string name;
  contender_role role;
  std::function<std::unique_ptr<grow_contender>()> make;
};

/// A named per-grow contender and how to make it for a chunk size.
struct grow_once_entry {
  std::string name;
  contender_role role;
  std::function<std::unique_ptr<grow_once_contender>(std::size_t chunk)> make;
};

// ---- Contenders that need only vmm and the OS (grow_contenders.cpp) ----

/// vmm::growable_buffer on a location's provider, growing by `policy`. warm: one pool for the whole run
/// (warmed by the untimed first run); cold: a fresh pool every iteration, trimmed and destroyed after it.
/// `gpu_ordinal` < 0: OS host memory; else that GPU.
std::unique_ptr<grow_contender> make_vmm_contender(int gpu_ordinal, vmm::chunk_policy policy, bool warm);
/// reserve(chunk) then shrink_to_fit + collect_retired(true) on a growable_buffer with its
/// own pool, warmed before the first timed grow.
// max_size 0: the buffer's default reservation (the location's whole memory).
std::unique_ptr<grow_once_contender> make_vmm_growable_once(int gpu_ordinal, std::size_t chunk,
                                                            std::size_t max_size);
/// provider_for(location)->map + set_access over one physical_allocation; undo: unmap.
std::unique_ptr<grow_once_contender> make_vmm_provider_once(int gpu_ordinal, std::size_t chunk);
/// Grows a growable_buffer on the default pool of GPU `gpu_ordinal` (max_size = its total
/// memory) in `append` steps until out_of_memory, writing each slice; returns the size
/// reached. Trims the default pool afterwards.
std::size_t reach_with_vmm(memory_target& target, int gpu_ordinal, std::size_t append);

/// Host memory written with memset.
std::unique_ptr<memory_target> make_os_target();
/// Host baselines: preallocated and pre-touched memory; malloc + memcpy + free with 2×
/// capacity; std::vector<char>::resize (with a counting allocator).
std::vector<grow_entry> os_baseline_contenders();
/// mmap(MAP_FIXED) of a memfd + mprotect, undone with an anonymous PROT_NONE mmap: what the
/// OS provider does under map + set_access, with nothing around it.
std::unique_ptr<grow_once_contender> make_raw_os_once(std::size_t chunk);

// ---- GPU pieces (gpu_baselines.cu, built where nvcc is) ----

/// GPU 0 through the CUDA runtime (made current, its primary context initialised), or null
/// with the reason in *why when there is no usable GPU.
std::unique_ptr<memory_target> make_gpu_target(std::string* why);
/// GPU baselines: preallocated cudaMalloc (floor); cudaMalloc + cudaMemcpyAsync + cudaFree
/// with 2× capacity; thrust::device_vector<char>::resize.
std::vector<grow_entry> gpu_baseline_contenders();
/// The raw driver calls a user would write by hand (cuMemCreate, cuMemMap, cuMemSetAccess into
/// one reservation; no vmm), creating handles of the sizes `policy` picks; end() releases
/// everything.
std::unique_ptr<grow_contender> make_raw_vmm_grow(vmm::chunk_policy policy);
/// cuMemMap + cuMemSetAccess on a pre-created handle (undo: cuMemUnmap), the driver called
/// through entry points from cudaGetDriverEntryPointByVersion.
// reservation: the range the chunk is mapped into (0: the chunk's own size).
std::unique_ptr<grow_once_contender> make_raw_driver_once(std::size_t chunk, std::size_t reservation);
/// Grows by cudaMalloc + copy with 2× capacity in `append` steps until cudaMalloc fails;
/// returns the size reached.
std::size_t reach_with_realloc_2x(memory_target& target, std::size_t append);

}  // namespace vmm::bench
