#pragma once
/// @file
/// A stream-ordered memory resource on VMM: allocate and deallocate any size, in stream
/// order, with the features of CUDA's stream-ordered allocator (cudaMallocAsync /
/// cudaMemPool) and what VMM adds to them.
///
///     vmm::memory_resource gpu(vmm::location::device(0));
///     void* p = gpu.allocate(stream, 3 << 20);           // 256-byte aligned, like cudaMalloc
///     kernel<<<grid, block, 0, stream.get()>>>(p);
///     gpu.deallocate(stream, p, 3 << 20);                // reusable at once on `stream`
///     vmm::memory_resource_statistics s = gpu.statistics();
///
/// Design (docs/design/memory_resource.md has the reasons and the trade-offs). Each stream
/// that allocates gets arenas of its own: large address ranges (addresses are cheap) in
/// which blocks are carved by a two-level segregated fit index, 256 bytes the smallest
/// unit. Small requests (under 1 MiB), larger ones, and those of two large pages or more
/// (memory_resource_properties::large_page_size) live in separate arenas. Physical memory
/// is mapped page by page only under bytes that blocks use, so blocks share pages at their
/// edges and a request costs its bytes plus at most a page at each end of a run of blocks.
///
/// Reuse and stitching. A freed block is reused at once by its stream with its pages
/// mapped; a small block of a size asked for before waits in a quick bin for the next such
/// request (design note, "Quick bins"). A request goes where it needs the fewest pages to
/// be mapped (design note, "Placement"). When it needs pages and none is spare, the
/// resource unmaps an idle page (no block holds it, its streams have passed) anywhere in
/// any arena and maps its memory where it is needed ("stitching"), before it creates any;
/// each small page stitched teaches it to keep one idle page more, up to
/// memory_resource_properties::headroom of the most in use. A page that only blocks freed
/// on the allocating stream hold is lent to that stream's next request at once; its old
/// mapping goes once the stream has passed the last free over it (design note,
/// "Lending"). Idle pages of one page size are given back to be made in the other. The
/// host waits for a stream only where the memory bound needs it, and each wait is counted
/// (statistics().host_waits; design note, "Waits"). So free memory is never stranded behind
/// a fragmented address range and the reserved memory stays close to the most ever in use.
/// Pages given up (trim_to(), the release threshold) go back to the chunk pool.
///
/// Stream order, with the meaning of cudaFreeAsync: memory freed on a stream is reused at
/// once by that stream; another stream gets it only when the reuse policies allow
/// (reuse_policies). Every few frees the resource records an event on the freeing stream;
/// blocks freed before an event that has passed become free for every stream. Nothing is
/// unmapped while queued work may use it.
///
/// Threads: thread-safe. Allocations and frees on different streams take different locks
/// (one per arena); only mapping or taking pages takes the resource's own lock.
///
/// Sleep and wake (vLLM's sleep mode, on the resource itself). Allocations carry a tag
/// (allocation_tag). sleep(offload) copies the allocations whose tags are in `offload` to
/// host memory (pinned for a GPU), drops the rest, and unmaps every page, giving the memory
/// back to the device; wake(tags) maps fresh memory at the same addresses and restores the
/// bytes: every pointer and every captured CUDA graph stays valid. Sleep is stream-ordered
/// (the copies are queued on the stream given; work on other streams must be ordered before
/// it). While asleep, allocate() throws and deallocate() refuses (counted): nothing is lost.
/// Registrations of the memory with a transport (NCCL's ncclCommRegister, RDMA) made through
/// register_memory() follow it: sleep deregisters them before the pages go, and the wake
/// that maps their allocation registers them again over the new pages
/// (vmm/memory_registration.hpp says why, and what a failing registrar leaves).
///
/// Host memory (the OS provider) works synchronously: freed memory is free for everyone
/// at once. Every test suite of the resource runs on it in CI.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "vmm/chunk_pool.hpp"
#include "vmm/location.hpp"
#include "vmm/memory_registration.hpp"
#include "vmm/provider.hpp"
#include "vmm/shared_chunk.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm {

namespace detail {
class resource_state;
}

/// A caller's label on an allocation: sleep() and wake() act on allocations by tag.
struct allocation_tag {
  std::uint32_t value = 0;
  friend bool operator==(allocation_tag, allocation_tag) = default;
};

/// The properties of a resource, named after cuda::memory_pool_properties.
struct memory_resource_properties {
  /// Bytes of physical memory created (or taken from the pool) when the resource is made,
  /// kept spare for the first allocations.
  std::size_t initial_size = 0;
  /// cudaMemPoolAttrReleaseThreshold: the reserved bytes above which a deallocation gives
  /// idle pages back to the chunk pool. The default keeps them (no driver call when the
  /// same sizes come back); trim_to() gives them back on request.
  std::size_t release_threshold = std::numeric_limits<std::size_t>::max();
  /// How the memory may be shared with other processes: posix_fd makes every page
  /// exportable (vmm::ipc), none does not ask for it. The provider must be able to.
  handle_kind handle_type = handle_kind::none;
  /// The most physical memory the resource reserves; 0: the location's memory size.
  std::size_t max_size = 0;
  /// The physical pages of requests of at least two of them, which live in address ranges
  /// of their own: the granularity times a power of two, at most 1 GiB; the granularity
  /// turns them off. 0: 16 times the granularity (32 MiB on a GPU) when handle_type is
  /// none, off for exportable memory (vmm::ipc exports pointers page by page in the
  /// granularity). The driver's cost of mapping, granting and unmapping a page hardly
  /// depends on its size, so large blocks, whose layout changes most between the steps of a
  /// program with changing shapes, move their memory for a fraction of the cost, at the
  /// price of up to a large page at each end of a run of them (docs/design/memory_resource.md,
  /// "Two page sizes").
  std::size_t large_page_size = 0;
  /// The most idle memory the resource learns to keep mapped, as a share of the most it
  /// has had in use: each page of the granularity it has to stitch lets it keep one page
  /// more, up to this share, before it stitches again. 0: 1/128 with large pages, 1/8
  /// without. Larger trades memory for host time (every page stitched is driver calls on
  /// the allocating thread); with large pages, less room than the swing of a program's
  /// shapes makes the two page sizes trade memory every step (docs/design/memory_resource.md,
  /// "Headroom"). The reserved memory stays under the most in use times
  /// 1 + 1/256 + headroom, plus a large page where that is at most 1/128 of it, two pages and
  /// the rounding of blocks to pages. From 0 to 1; properties() gives the share in use.
  double headroom = 0;
};

/// Which memory freed on one stream another stream may reuse: the three reuse policies of
/// cudaMemPoolReuse*, each a switch, all on by default as there.
struct reuse_policies {
  /// cudaMemPoolReuseFollowEventDependencies: reuse memory freed on stream A by stream B
  /// when vmm knows B's work is ordered after the free: B was made to wait, through this
  /// resource (wait_for()), for a point recorded on A after it. Costs nothing when unused.
  bool follow_event_dependencies = true;
  /// cudaMemPoolReuseAllowOpportunistic: reuse memory freed on another stream once the
  /// point recorded after the free has passed (an event query; no wait). Costs one event
  /// record per few frees on each stream.
  bool allow_opportunistic = true;
  /// cudaMemPoolReuseAllowInternalDependencies: when nothing else fits, take memory freed
  /// on another stream whose point has not passed yet and make the allocating stream wait
  /// for it (cuStreamWaitEvent): no host wait, but the allocating stream may stall.
  bool allow_internal_dependencies = true;
};

/// What a resource holds. The first four mean what cudaMemPoolAttr{Reserved,Used}Mem
/// {Current,High} mean; the rest are what PyTorch users read.
struct memory_resource_statistics {
  std::size_t reserved_current = 0;  ///< physical bytes mapped or kept spare
  std::size_t reserved_high = 0;
  std::size_t used_current = 0;  ///< bytes handed out (each rounded up to 256)
  std::size_t used_high = 0;
  /// The part of reserved_current in pages of the granularity, and in large pages
  /// (memory_resource_properties::large_page_size): the two add up to it.
  std::size_t reserved_small_pages = 0;
  std::size_t reserved_large_pages = 0;  ///< see reserved_small_pages
  std::size_t allocations = 0;           ///< live allocations
  std::size_t allocations_total = 0;     ///< allocations made (lifetime)
  std::size_t segments = 0;              ///< address ranges (arenas)
  std::size_t handles = 0;               ///< physical pages mapped or spare
  std::size_t largest_free_block = 0;    ///< the largest free run of addresses for any stream
  std::size_t pages_stitched = 0;        ///< pages unmapped from one place and mapped in another
  std::size_t pages_created = 0;         ///< pages taken from the chunk pool (lifetime)
  std::size_t pages_released = 0;        ///< pages given back to the chunk pool (lifetime)
  std::size_t bad_deallocations = 0;     ///< refused deallocations: unknown pointers, double frees
  /// Times an allocation (or sleep()) made the calling thread wait for a stream to pass a
  /// free (lifetime): to map a page again at an address whose old mapping work queued
  /// before the free may still use (its memory was lent to a request when the resource held
  /// all it may), to give back pages of the other page size that the stream's own frees
  /// hold (the file comment), or, out of memory, for every stream before the second try.
  /// Each costs the host as long as the stream's queued work takes to get there;
  /// synchronize() and the destructor are not counted.
  std::size_t host_waits = 0;
  /// Host time the allocating threads spent on the slow path (lifetime): placing requests
  /// that found no mapped block fit, with the driver calls that map, grant, stitch, create
  /// and give back pages, the waits of host_waits and the wait for the resource's lock. On a
  /// program whose steps are the host's, this is what the resource adds to them beyond its
  /// fast path.
  std::chrono::nanoseconds slow_path_time{};
  /// Host time spent in the waits counted by host_waits (part of slow_path_time where an
  /// allocation waited).
  std::chrono::nanoseconds host_wait_time{};
  /// Host memory holding saved bytes while asleep, or kept by a wake for the next sleep
  /// (after_wake::keep_host_copies): pinned for a GPU.
  std::size_t host_copy_bytes = 0;
  /// reserved_current - used_current: what a caching allocator calls "inactive split" plus
  /// the free pages.
  [[nodiscard]] std::size_t reserved_unused() const noexcept { return reserved_current - used_current; }
};

/// What a wake that leaves no tag asleep does with the host copies of the sleep.
enum class after_wake {
  /// Give them back to the system (unpinned; on a thread of their own for a GPU): the
  /// host memory is the sleep's only while it sleeps.
  give_back_host_copies,
  /// Keep them (pinned) for the next sleep(), which then only copies when they are large
  /// enough: for a program that sleeps and wakes in a loop. Making fresh host memory
  /// ready is most of a sleep's time (docs/design/memory_resource.md, "Sleep and wake").
  /// trim_to() and the
  /// destructor give them back; statistics().host_copy_bytes counts them.
  keep_host_copies,
};

/// See the file comment. Not copyable or movable: pointers name it.
class memory_resource {
 public:
  /// The alignment of every allocation unless asked otherwise: cudaMalloc's.
  static constexpr std::size_t default_alignment = 256;
  /// The most address ranges (arenas) a resource makes; allocation_pages::arena is below
  /// it (vmm::ipc names arenas by their index).
  static constexpr std::size_t max_arenas = 256;
  /// Large pages unless memory_resource_properties::large_page_size says otherwise: this
  /// many times the granularity.
  static constexpr std::size_t default_large_page_granules = 16;
  /// The most memory_resource_properties::large_page_size may be.
  static constexpr std::size_t largest_large_page_size = std::size_t{1} << 30;

  /// A resource over the default chunk pool of `where`.
  /// @throws vmm::invalid_argument the location does not exist, a property is bad
  ///         (handle_type the memory cannot have), or a policy combination is refused.
  /// @throws vmm::driver_unavailable GPU memory asked for and no usable driver or GPU.
  /// @throws vmm::out_of_memory initial_size cannot be had.
  explicit memory_resource(location where, memory_resource_properties properties = {},
                           reuse_policies policies = {});
  /// A resource over `pool`: its pages come from, and go back to, that pool.
  /// @throws vmm::invalid_argument the pool is null or a property is bad.
  /// @throws vmm::out_of_memory initial_size cannot be had.
  explicit memory_resource(std::shared_ptr<chunk_pool> pool, memory_resource_properties properties = {},
                           reuse_policies policies = {});
  memory_resource(const memory_resource&) = delete;
  memory_resource& operator=(const memory_resource&) = delete;
  /// Reports allocations still live (and counts them as leaked), then retires every page
  /// after the points recorded on the streams that freed into it (vmm/retirement.hpp).
  /// vmm records on a stream only during a call that names it (the stream may be destroyed
  /// later): when frees were queued after a stream's last point, the destructor blocks
  /// until the device is idle instead.
  ~memory_resource();

  /// `bytes` (0: nullptr) aligned to `alignment` (a power of two, at most the granularity),
  /// usable by work queued on `stream` from now on.
  /// @throws vmm::invalid_argument the alignment is not a power of two or exceeds the
  ///         granularity, `bytes` is beyond any address space (more than 2^48), or the
  ///         resource is asleep. Nothing has changed.
  /// @throws vmm::out_of_memory nothing fits even after giving back what is idle and
  ///         waiting for what other streams freed, or `bytes` and the bytes in use pass
  ///         max_size (refused before any address range is reserved), or the provider
  ///         refuses an address range for it: the message gives the numbers (requested,
  ///         reserved, used, the largest free run). Nothing has changed.
  /// @throws vmm::os_error, vmm::driver_error mapping or granting its pages failed for
  ///         another reason than memory; nothing has changed.
  [[nodiscard]] void* allocate(stream_ref stream, std::size_t bytes,
                               std::size_t alignment = default_alignment);
  /// allocate() with a tag for sleep() and wake().
  /// @throws vmm::invalid_argument, vmm::out_of_memory, vmm::os_error, vmm::driver_error
  ///         as allocate().
  [[nodiscard]] void* allocate(stream_ref stream, std::size_t bytes, std::size_t alignment,
                               allocation_tag tag);
  /// Frees `ptr` in stream order: work queued on `stream` before this call may still use
  /// it. `bytes` exactly as given to allocate(), not rounded (what torch's pluggable
  /// allocator, CuPy and RMM's resources pass); `alignment` a power of two (nullptr:
  /// nothing). Never throws: a pointer this resource did not hand out, a second free,
  /// another size (also one that rounds to the same 256 bytes), an allocation still
  /// registered (register_memory()) or a resource asleep is reported
  /// (report_cleanup_failure), counted in bad_deallocations, and changes nothing.
  void deallocate(stream_ref stream, void* ptr, std::size_t bytes,
                  std::size_t alignment = default_alignment) noexcept;
  /// allocate() for use by any stream, without stream order: only memory no stream may
  /// still use is handed out.
  /// @throws vmm::invalid_argument, vmm::out_of_memory, vmm::os_error, vmm::driver_error
  ///         as allocate().
  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment = default_alignment);
  /// deallocate() of memory no queued work uses any more (the caller synchronized): free
  /// for every stream at once.
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment = default_alignment) noexcept;

  /// The names of CCCL 3.0's cuda::mr::async_resource (allocate/deallocate are the
  /// synchronous pair there). `Stream` is any stream type with get() (cuda::stream_ref).
  /// The pair is templated on exactly std::size_t so that allocate({}, n) still means the
  /// legacy default stream. Each throws what allocate_sync() or allocate() throws.
  template <std::same_as<std::size_t> Bytes, std::same_as<std::size_t> Alignment>
  [[nodiscard]] void* allocate(Bytes bytes, Alignment alignment) {
    return allocate_sync(bytes, alignment);
  }
  template <std::same_as<std::size_t> Bytes, std::same_as<std::size_t> Alignment>
  void deallocate(void* ptr, Bytes bytes, Alignment alignment) noexcept {
    deallocate_sync(ptr, bytes, alignment);
  }
  template <class Stream>
  requires requires(const Stream& s) { stream_ref(s.get()); }
  [[nodiscard]] void* allocate_async(std::size_t bytes, std::size_t alignment, const Stream& stream) {
    return allocate(stream_ref(stream.get()), bytes, alignment);
  }
  template <class Stream>
  requires requires(const Stream& s) { stream_ref(s.get()); }
  void deallocate_async(void* ptr, std::size_t bytes, std::size_t alignment, const Stream& stream) noexcept {
    deallocate(stream_ref(stream.get()), ptr, bytes, alignment);
  }
  /// Resources are equal when they are the same object (memory from one cannot be freed
  /// through another).
  friend bool operator==(const memory_resource& a, const memory_resource& b) noexcept { return &a == &b; }

  /// cudaMemPoolTrimTo: gives idle pages back to the chunk pool until at most
  /// `bytes_to_keep` are reserved. Pages under frees whose streams the resource has not
  /// seen pass are kept: synchronize() first to give back everything freed. Host copies a
  /// wake kept for the next sleep (after_wake::keep_host_copies) go back too.
  /// @throws vmm::driver_error querying the points recorded on the streams failed.
  void trim_to(std::size_t bytes_to_keep);
  /// Blocks until the device is idle (every stream; cudaDeviceSynchronize), after which
  /// everything freed on any stream is free for every stream and its idle pages can be
  /// trimmed. vmm learns that a stream has passed a free only from points it records
  /// during calls that name the stream; this is the way to tell it about all of them.
  /// @throws vmm::driver_error the device's synchronize failed (an earlier kernel's fault).
  void synchronize();
  /// Sets the release threshold (see memory_resource_properties) and applies it now.
  /// @throws vmm::driver_error as trim_to().
  void set_release_threshold(std::size_t bytes);
  /// cudaMemPoolSetAccess: the access each accessor gets to every page mapped now and to
  /// every page mapped later. The default: the provider's default accessors, read-write.
  /// @throws vmm::invalid_argument no grant, or an accessor cannot be given this memory;
  ///         nothing changed.
  /// @throws vmm::os_error, vmm::driver_error the provider refused the access of a mapped
  ///         run (pages before it have the new access, later ones the old).
  void set_access(std::span<const access_grant> grants);
  /// The access `who` has (none when no grant names it). Throws nothing but std::bad_alloc.
  [[nodiscard]] access_mode access(const accessor& who) const;
  /// Makes work queued on `waiting` from now on wait for the work queued on `freeing`
  /// so far (an event, cuStreamWaitEvent), and lets memory freed on `freeing` before this
  /// call be reused by `waiting` (follow_event_dependencies). Nothing on the OS provider.
  /// @throws vmm::out_of_memory `freeing` is new to the resource and its arenas cannot be had.
  /// @throws vmm::driver_error recording the event or the wait failed.
  void wait_for(stream_ref waiting, stream_ref freeing);

  /// The physical pages under a live allocation, for sharing it (vmm::ipc exports them):
  /// the arena it lies in (its index and base address) and the pages that back
  /// [ptr, ptr + bytes), which are pages [first_page, first_page + pages.size()) of the arena.
  struct allocation_pages {
    std::size_t arena = 0;          ///< which of the resource's address ranges
    std::uintptr_t arena_base = 0;  ///< its first address
    std::size_t arena_size = 0;     ///< its size in bytes
    std::size_t first_page = 0;
    std::size_t page_size = 0;
    std::vector<shared_chunk> pages;
  };
  /// @throws vmm::invalid_argument `ptr` is not a live allocation of exactly `bytes` bytes
  ///         (as asked for) of this resource.
  [[nodiscard]] allocation_pages pages_of(const void* ptr, std::size_t bytes) const;

  /// Registers [ptr, ptr + bytes) through `registrar` now, and keeps it registered across
  /// sleep() and wake() (vmm/memory_registration.hpp): `ptr` is a live allocation of this
  /// resource, `bytes` at most its size. The allocation cannot be deallocated until the
  /// registration ends.
  /// @throws vmm::invalid_argument the registrar is null, the resource is asleep, or the
  ///         range is not the start of a live allocation of at least `bytes` bytes; nothing
  ///         was registered.
  /// @throws whatever registrar->register_memory() throws; nothing was recorded.
  [[nodiscard]] memory_registration register_memory(void* ptr, std::size_t bytes,
                                                    std::shared_ptr<memory_registrar> registrar);

  /// Puts the resource to sleep (see the file comment): copies the allocations tagged with
  /// one of `offload` to pinned host memory (plain host memory on the OS provider) in order
  /// on `stream`, waits for `stream` (not for the device), unmaps every page and gives the
  /// physical memory back (the chunk pool is trimmed of what it holds idle). The host
  /// memory is fresh anonymous memory (huge pages where the kernel has them), touched by up
  /// to 16 threads at once and pinned 64 MiB at a time (cuMemHostRegister); each piece's
  /// copies are queued as soon as it is pinned, so that they overlap the work on the rest.
  /// Host copies the last wake kept (after_wake::keep_host_copies) are used instead when
  /// they are large enough, and given back first when not.
  /// Every registration made through register_memory() is deregistered once the copies
  /// are taken, before the first page goes.
  /// @throws vmm::invalid_argument the resource is asleep already.
  /// @throws vmm::out_of_memory the host copies cannot be had (more than the host can
  ///         commit safely, or refused); nothing changed.
  /// @throws vmm::os_error, vmm::driver_error mapping or pinning them failed; nothing changed.
  void sleep(std::span<const allocation_tag> offload, stream_ref stream = {});
  /// Maps fresh physical memory under the allocations tagged with one of `tags` (empty: all)
  /// at their addresses and restores their saved bytes, in order on `stream`, which it then
  /// waits for. The pages are mapped and granted 64 MiB at a time, and each saved run
  /// is copied as soon as its pages are granted, so that the copies overlap the driver's
  /// work on the pages after them. Once every tag is awake the resource allocates again,
  /// and its host copies are given back or kept for the next sleep, as `then` says. Pinned
  /// copies go back to the system on a thread of their own (unpinning them costs about as
  /// much as the rest of the wake); the next sleep() and the destructor wait for that. On
  /// the OS provider they go back before wake() returns. A resource destroyed asleep gives
  /// its host copies back at once. Last, the registrations (register_memory()) of the
  /// waking allocations are registered again, over the new pages.
  /// @throws vmm::invalid_argument the resource is not asleep.
  /// @throws vmm::out_of_memory not enough memory: what was mapped is given back, and the
  ///         message says how many bytes were missing; the tags stay asleep.
  /// @throws vmm::os_error, vmm::driver_error a map or grant refused: what was mapped is
  ///         given back (after the copies queued into it) and the tags stay asleep.
  /// @throws whatever a registrar's register_memory() throws: the registrations renewed by
  ///         this wake are deregistered again, what was mapped is given back, the tags stay
  ///         asleep.
  void wake(std::span<const allocation_tag> tags = {}, stream_ref stream = {},
            after_wake then = after_wake::give_back_host_copies);
  /// Whether the resource is asleep (some tag not woken yet).
  [[nodiscard]] bool asleep() const noexcept;

  /// Throws nothing but std::bad_alloc (none in practice: the statistics are counters).
  [[nodiscard]] memory_resource_statistics statistics() const;
  /// Sets reserved_high and used_high to the current values. Throws nothing.
  void reset_high_water_marks();
  [[nodiscard]] const memory_resource_properties& properties() const noexcept;
  [[nodiscard]] const reuse_policies& policies() const noexcept;
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept;
  [[nodiscard]] const std::shared_ptr<chunk_pool>& pool() const noexcept;
  /// Whether `ptr` lies in one of this resource's arenas (live or not).
  [[nodiscard]] bool owns(const void* ptr) const noexcept;

 private:
  std::unique_ptr<detail::resource_state> state_;
};

}  // namespace vmm
