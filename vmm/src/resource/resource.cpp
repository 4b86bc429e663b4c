// The memory resource: streams, arenas, and the slow path that maps and stitches pages.
// The design is in vmm/memory_resource.hpp and docs/design/memory_resource.md; the
// bookkeeping of one arena in arena.hpp.
//
// Locks. Each arena has a mutex; an allocation or a free on a stream takes only the mutex
// of the arena it lands in (fast path: a block whose pages are mapped). Everything that
// maps, unmaps or moves pages, or reaches across arenas (another stream's blocks, pages to
// stitch), runs on the slow path: the resource's mutex, then every arena's mutex in the
// order the arenas were made. A stream record's mutex is taken after any arena mutex, and
// so is the registrations' (resource/registrations.hpp).

#include "vmm/memory_resource.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <system_error>
#include <thread>

#include "cleanup.hpp"
#include "resource/arena.hpp"
#include "resource/host_copies.hpp"
#include "resource/registrations.hpp"
#include "retirement.hpp"
#include "vmm/error.hpp"

namespace vmm {
namespace detail {
namespace {

constexpr std::uint64_t unit = std::uint64_t{1} << free_index::unit_shift;
constexpr std::size_t small_limit = std::size_t{1} << 20;      // smaller requests: small arenas
constexpr std::uint32_t frees_per_point = 32;                  // frees on a stream between points
constexpr std::size_t max_points = 64;                         // outstanding points per stream
constexpr int candidates_weighed = 16;                         // free blocks compared per index
constexpr std::size_t wake_run_bytes = std::size_t{64} << 20;  // bytes granted per call in wake()
// Requests of at least this many large pages get large pages.
constexpr std::uint64_t large_page_factor = 2;
constexpr std::size_t largest_large_page = std::size_t{1} << 30;
// choose(): a page lent away and not passed yet counts as this many pages to map.
constexpr std::size_t retiring_penalty = std::size_t{1} << 16;
constexpr std::uint64_t largest_request = std::uint64_t{1} << 48;
constexpr std::size_t max_arenas = memory_resource::max_arenas;
constexpr auto no_skip = [](const arena&, std::size_t) { return false; };

// Adds the host time from `start` to its end to `total` (statistics' slow_path_time and
// host_wait_time), however the scope is left.
class timed_into {
 public:
  explicit timed_into(std::chrono::nanoseconds& total,
                      std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now()) noexcept
      : total_(total), start_(start) {}
  timed_into(const timed_into&) = delete;
  timed_into& operator=(const timed_into&) = delete;
  ~timed_into() { total_ += std::chrono::steady_clock::now() - start_; }

 private:
  std::chrono::nanoseconds& total_;
  std::chrono::steady_clock::time_point start_;
};

// The threads that give host copies back after a wake (memory_resource::wake), each counted
// under the resource that started it. A resource waits for its own before it sleeps again
// and when it is destroyed; the process waits for all of them when it exits, since they use
// the retirement list, the executors and the pools, statics of their own, and a resource
// may live until exit (vmm_torch's do). The exit wait is a static made after those (in
// instance(), after retired_count()), so destroyed before them; the count itself is never
// destroyed, so that a resource destroyed later in the exit can still ask it.
class host_releases_running {
 public:
  static host_releases_running& instance() {
    (void)retired_count();  // the retirement list exists before the exit wait, and outlives it
    static host_releases_running* const running = new host_releases_running;
    static const exit_wait waits_at_exit{running};
    return *running;
  }
  host_releases_running(const host_releases_running&) = delete;
  host_releases_running& operator=(const host_releases_running&) = delete;
  void add(const void* owner) {
    std::lock_guard lock(mutex_);
    running_.push_back(owner);
  }
  void remove(const void* owner) noexcept {
    std::lock_guard lock(mutex_);
    running_.erase(std::find(running_.begin(), running_.end(), owner));
    finished_.notify_all();
  }
  // Waits until no thread that `owner` started runs; with nullptr, until none at all runs.
  void wait_for(const void* owner) noexcept {
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [&] {
      return owner == nullptr ? running_.empty()
                              : std::find(running_.begin(), running_.end(), owner) == running_.end();
    });
  }

 private:
  struct exit_wait {
    host_releases_running* running;
    ~exit_wait() { running->wait_for(nullptr); }
  };
  host_releases_running() = default;
  std::mutex mutex_;
  std::condition_variable finished_;
  std::vector<const void*> running_;  // one entry per thread: the resource that started it
};

// std::has_single_bit is a popcount, a library call where the target lacks the instruction.
constexpr bool power_of_two(std::size_t x) noexcept {
  return x != 0 && (x & (x - 1)) == 0;
}

std::uint64_t round_to_unit(std::size_t bytes) {
  return (std::uint64_t{bytes} + unit - 1) & ~(unit - 1);
}

}  // namespace

class resource_state {
 public:
  resource_state(std::shared_ptr<chunk_pool> pool, memory_resource_properties properties,
                 reuse_policies policies);
  ~resource_state();

  void* allocate(stream_ref stream, std::size_t bytes, std::size_t alignment, bool sync,
                 std::uint32_t tag = 0);
  void deallocate(stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment, bool sync) noexcept;
  void trim_to(std::size_t bytes_to_keep);
  void synchronize();
  void set_release_threshold(std::size_t bytes);
  void set_access(std::span<const access_grant> grants);
  access_mode access(const accessor& who) const;
  void wait_for(stream_ref waiting, stream_ref freeing);
  void sleep(std::span<const allocation_tag> offload, stream_ref stream);
  void wake(std::span<const allocation_tag> tags, stream_ref stream, after_wake then);
  bool asleep() const noexcept { return asleep_.load(); }
  memory_resource_statistics statistics() const;
  memory_resource::allocation_pages pages_of(const void* ptr, std::size_t bytes) const;
  memory_registration register_memory(void* ptr, std::size_t bytes,
                                      std::shared_ptr<memory_registrar> registrar);
  void reset_high_water_marks();
  bool owns(const void* ptr) const noexcept {
    return arena_containing(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
  }

  const memory_resource_properties& properties() const noexcept { return properties_; }
  const reuse_policies& policies() const noexcept { return policies_; }
  const std::shared_ptr<memory_provider>& provider() const noexcept { return pool_->provider(); }
  const std::shared_ptr<chunk_pool>& pool() const noexcept { return pool_; }

 private:
  struct stream_entry {
    std::unique_ptr<stream_record> record;
    std::array<std::vector<arena*>, 3> arenas;  // by kind_of(); the last is the home
  };
  // Locks every arena (after the resource's mutex) for the slow path.
  class all_locked {
   public:
    explicit all_locked(const resource_state& state);

   private:
    std::unique_lock<std::mutex> resource_;
    std::vector<std::unique_lock<arena_mutex>> arenas_;
  };

  // The entry of `stream` (`sync`: of the calls without a stream), made on first use. The
  // lookup takes no lock.
  stream_entry& entry_of(stream_ref stream, bool sync) {
    if (sync) {
      if (stream_entry* e = sync_entry_.load(std::memory_order_acquire); e != nullptr) return *e;
      return make_entry(stream, sync);
    }
    const std::size_t start = stream_slot_of(stream);
    for (std::size_t i = 0; i < stream_table_.size(); ++i) {
      stream_entry* e = stream_table_[(start + i) % stream_table_.size()].load(std::memory_order_acquire);
      if (e == nullptr) break;
      if (e->record->stream == stream) return *e;
    }
    return make_entry(stream, sync);
  }
  [[nodiscard]] static std::size_t stream_slot_of(stream_ref stream) noexcept {
    const auto key = reinterpret_cast<std::uintptr_t>(stream.get());
    return static_cast<std::size_t>((key >> 4) * 0x9e3779b97f4a7c15ull >> 58);  // of 64
  }
  stream_entry& make_entry(stream_ref stream, bool sync);
  arena* arena_containing(std::uintptr_t address) const noexcept;
  // Its index in arenas_, or max_arenas when no arena holds `address`.
  std::size_t arena_index_containing(std::uintptr_t address) const noexcept;
  arena& add_arena(std::size_t bytes, std::size_t page_size);  // under the resource's mutex
  // Which arenas a request of `size` bytes lands in: 0 small, 1 the rest, 2 large pages.
  [[nodiscard]] std::size_t kind_of(std::uint64_t size) const noexcept {
    return size < small_limit ? 0 : size < large_limit_ ? 1 : 2;
  }
  // Pages of the granularity (0) or large pages (1).
  [[nodiscard]] std::size_t page_class(const arena& a) const noexcept {
    return a.page_size() == page_ ? 0 : 1;
  }
  // Physical bytes mapped or spare in pages of the granularity (0) or large pages (1).
  [[nodiscard]] std::size_t reserved_bytes(std::size_t which) const noexcept {
    return (mapped_pages_[which] + spare_[which].size()) * (which == 0 ? page_ : large_page_);
  }
  // Physical bytes mapped or spare.
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved_bytes(0) + reserved_bytes(1); }
  // The fast path: a block of `size` in `home` whose pages are all mapped, from the
  // stream's own pending blocks or the released ones.
  void* try_mapped(arena& home, stream_record* record, std::uint64_t size, std::uint64_t alignment,
                   std::uint32_t tag, std::uint8_t slack);
  void* slow_allocate(stream_entry& entry, std::uint64_t size, std::uint64_t alignment, bool sync,
                      std::size_t requested, std::uint32_t tag);
  // A free block to carve a request from: the one with the fewest pages to map (then the
  // smallest), among those with fewer than `better_than`.
  struct choice {
    arena* where = nullptr;
    block* b = nullptr;
    std::uint64_t start = 0;
    std::size_t unmapped = std::numeric_limits<std::size_t>::max();
  };
  choice choose(arena& a, free_index& index, std::uint64_t size, std::uint64_t alignment,
                std::size_t better_than) const;
  // Carves the chosen block and maps what it lacks; throws out_of_memory when the pages
  // cannot be had (nothing changed then).
  void* take(const choice& chosen, std::uint64_t size);
  // choose() then take(); nullptr when nothing fits.
  void* place(arena& a, free_index& index, std::uint64_t size, std::uint64_t alignment);
  // A run with every page mapped, in the stream's own pending blocks (unless `sync`) or the
  // released blocks of its arenas of `kind`; .b is null when there is none.
  choice mapped_run(const stream_entry& entry, std::size_t kind, std::uint64_t size, std::uint64_t alignment,
                    bool sync);
  void* place_with_dependency(stream_entry& entry, std::size_t kind, std::uint64_t size,
                              std::uint64_t alignment, bool wait_allowed);
  void* slow_allocate_locked(stream_entry& entry, std::size_t kind, std::uint64_t size,
                             std::uint64_t alignment, bool sync, std::size_t requested);
  // The out_of_memory of a request that cannot be had, with the numbers (under all_locked).
  [[noreturn]] void refuse_request(std::size_t requested, std::uint64_t size, const std::string& why) const;
  void map_pages(arena& a, std::uint64_t offset, std::uint64_t size);
  // `wanted` pages for `target`'s pages [first, first + count): spare, stitched or created
  // (each with whether it was created for this request). Nothing changes if it throws.
  std::vector<std::pair<shared_chunk, bool>> take_pages(const arena& target, std::size_t first,
                                                        std::size_t count, std::size_t wanted);
  // Unmaps idle pages (mapped, no block holds a byte of them) of the arenas whose page size
  // `size_fits` accepts, the newest arena first and each from its top down, passing over
  // pages `skip(arena, p)` names, while `more()`; gives each unmapped chunk to
  // `take(arena, chunk)` (mapped_pages_ counts it out already). A page the driver would
  // not unmap stays mapped (reported).
  template <class SizeFits, class Skip, class More, class Take>
  void unmap_idle_pages(SizeFits size_fits, Skip skip, More more, Take take);
  // Up to `wanted` idle pages, unmapped from where they are (not `target`'s pages [first,
  // first + count)), from the top of each arena down.
  std::vector<shared_chunk> steal_idle_pages(const arena& target, std::size_t first, std::size_t count,
                                             std::size_t wanted);
  // Unmaps idle pages of sizes other than `size`, up to `bytes`, and releases as much from
  // the pool.
  void give_back_idle_pages_of_other_sizes(std::size_t size, std::size_t bytes);
  // Waits for the allocating stream to pass the frees of its pending blocks of sizes other
  // than `size`, the oldest first, until their whole mapped pages make `bytes` (or all of
  // them do), and makes what has passed free for everyone: those pages are then idle.
  void pass_pending_of_other_sizes(std::size_t size, std::size_t bytes);
  // Unmaps the old mapping of lent page p once its stream has passed the free (`wait`:
  // waiting for it); false when it has not (or the driver refused). Keeps retiring_ as is.
  bool unmap_retiring(arena& a, std::size_t p, bool wait);
  // The same for every lent page, taking those unmapped out of retiring_.
  void unmap_passed_retiring(bool wait);
  // Blocks until `record`'s stream has passed `epoch` (a point after it, else the device);
  // whether the host had to wait for it (it had not passed yet).
  bool wait_for_epoch(stream_record& record, std::uint64_t epoch);
  // Whether a recorded point of `record` (its mutex held) follows `epoch`, recording one if
  // need be; where the stream already has all the points it may (it is far behind its
  // host), the host waits for the oldest to make room (counted in host_waits). False only
  // if no point could be recorded.
  bool point_after(stream_record& record, std::uint64_t epoch);
  // Under all_locked: notes the points that have passed (waiting for them with `wait`) and
  // makes what was freed before them free for every stream. A point is recorded only on
  // `caller`'s stream: vmm records on a stream only while a call names it (the stream is
  // alive then); others may have been destroyed since.
  void refresh_points(stream_record* caller, bool wait);
  // Under all_locked: blocks whose stream has passed their free become free for every
  // stream (released), where the reuse policies allow it.
  void release_passed();
  void record_point(stream_record& record);      // under the record's mutex
  void release_idle(std::size_t bytes_to_keep);  // under all_locked
  [[nodiscard]] std::uint64_t stitch_limit() const noexcept;
  [[nodiscard]] std::uint64_t large_page_room(std::uint64_t high) const noexcept;
  // The reserved memory past which the host waits for the allocating stream's pending
  // pages of the other size rather than creating more (take_pages).
  [[nodiscard]] std::uint64_t wait_limit() const noexcept;
  // The most bytes ever in use, counting the request being placed.
  [[nodiscard]] std::uint64_t most_in_use() const noexcept;
  [[nodiscard]] std::size_t largest_free_locked() const noexcept;
  // The bytes in use, and their high-water mark, after an allocation or a free of `bytes`.
  void note_used(std::uint64_t bytes) noexcept;
  void note_unused(std::uint64_t bytes) noexcept;
  // Reports a deallocation refused (deallocate is noexcept) and counts it.
  [[gnu::cold, gnu::noinline]] void refuse_deallocation(std::uintptr_t address, std::size_t bytes,
                                                        const std::string& why) noexcept;

  std::shared_ptr<chunk_pool> pool_;
  memory_resource_properties properties_;
  reuse_policies policies_;
  std::size_t page_;
  std::size_t large_page_;     // the pages of requests of at least large_limit_ bytes
  std::uint64_t large_limit_;  // ~0: large pages are off
  bool synchronous_;
  stream_executor& executor_;

  mutable std::mutex mutex_;  // the slow path; the members below it guards
  std::vector<std::unique_ptr<arena>> arena_storage_;
  std::array<std::atomic<arena*>, max_arenas> arenas_{};
  std::atomic<std::size_t> arena_count_{0};
  std::vector<std::unique_ptr<stream_entry>> streams_;
  std::array<std::atomic<stream_entry*>, 64> stream_table_{};  // lock-free lookup
  std::atomic<stream_entry*> sync_entry_{nullptr};
  std::uint64_t request_ = 0;        // the size the slow path is placing (counts as in use)
  stream_record* caller_ = nullptr;  // the stream the slow path allocates for (null: none)
  std::vector<std::pair<arena*, std::size_t>> retiring_;  // pages lent with their old mapping
  std::array<std::vector<shared_chunk>, 2> spare_;        // by page_class()
  std::vector<access_grant> grants_;
  std::array<std::size_t, 2> mapped_pages_{};  // by page_class()
  std::size_t reserved_high_ = 0;
  std::size_t pages_stitched_ = 0;
  // Every page stitched lets the resource hold one page more before it stitches again (up
  // to memory_resource_properties::headroom of the most ever in use): a workload whose
  // layout keeps moving pages learns the room it needs, one that never moves any keeps to
  // the most it used and 1/256.
  std::uint64_t learned_headroom_ = 0;
  std::size_t pages_created_ = 0;
  std::size_t pages_released_ = 0;
  std::size_t host_waits_ = 0;
  std::chrono::nanoseconds slow_path_time_{};
  std::chrono::nanoseconds host_wait_time_{};

  std::atomic<std::size_t> used_{0};
  std::atomic<std::size_t> used_high_{0};
  std::atomic<std::size_t> bad_deallocations_{0};
  std::atomic<bool> over_threshold_{false};

  // Sleep: the host copies of the offloaded allocations, and the tags not woken yet.
  struct saved_run {
    std::uintptr_t address;
    std::size_t bytes;
    std::size_t offset;  // in saved_
    std::uint32_t tag;
  };
  std::atomic<bool> asleep_{false};
  std::vector<std::uint32_t> asleep_tags_;
  // The host copies: while asleep, of the sleep; while awake, those a wake kept for the
  // next sleep (after_wake::keep_host_copies), pinned, or none.
  std::unique_ptr<host_copies> saved_;
  std::vector<saved_run> saved_runs_;
  // Registrations with transports, withdrawn by sleep and renewed by wake
  // (vmm/memory_registration.hpp).
  const std::shared_ptr<registration_table> registrations_ = std::make_shared<registration_table>();
  // The host copies of the last wake are given back on a detached thread of their own (a
  // resource may live until the process exits, so nothing may have to join it), counted
  // in host_releases_running under this resource. Until a wake starts one, waiting for
  // them asks nothing (a resource destroyed at exit then touches no static).
  bool released_on_a_thread_ = false;
  void wait_for_host_release() noexcept;
  // After the last wake: gives saved_ back (on a thread of its own unless the executor is
  // synchronous).
  void give_back_host_copies();
};

resource_state::all_locked::all_locked(const resource_state& state) : resource_(state.mutex_) {
  const std::size_t count = state.arena_count_.load();
  arenas_.reserve(count);
  for (std::size_t i = 0; i < count; ++i) arenas_.emplace_back(state.arenas_[i].load()->mutex);
  // Whatever runs under every lock sees each free block and idle page as it is: none cached.
  for (std::size_t i = 0; i < count; ++i)
    state.arenas_[i].load()->flush_quick(state.policies_.allow_opportunistic);
}

resource_state::resource_state(std::shared_ptr<chunk_pool> pool, memory_resource_properties properties,
                               reuse_policies policies)
    : pool_(std::move(pool)),
      properties_(properties),
      policies_(policies),
      page_(pool_->granularity()),
      large_page_(properties.large_page_size != 0 ? properties.large_page_size
                  : properties.handle_type == handle_kind::none
                      ? page_ * memory_resource::default_large_page_granules
                      : page_),
      large_limit_(large_page_ == page_ ? ~std::uint64_t{0} : std::uint64_t{large_page_} * large_page_factor),
      synchronous_(pool_->provider()->capabilities().synchronous),
      executor_(pool_->provider()->executor()) {
  const provider_capabilities& offered = provider()->capabilities();
  if (properties_.handle_type == handle_kind::fabric && offered.export_kind != handle_kind::fabric)
    throw invalid_argument(fmt::format("memory_resource: {} memory has no fabric handles here: {}",
                                       to_string(offered.where), offered.fabric_unavailable_reason));
  if (properties_.handle_type == handle_kind::posix_fd && offered.export_kind == handle_kind::none)
    throw invalid_argument(
        fmt::format("memory_resource: {} memory cannot be exported, so handle_type "
                    "posix_fd cannot be had",
                    to_string(offered.where)));
  if (properties_.max_size == 0) properties_.max_size = offered.physical_memory_size;
  properties_.max_size = round_up(properties_.max_size, page_);
  grants_ = offered.grants(access_mode::read_write);
  if (large_page_ < page_ || large_page_ > largest_large_page || large_page_ % page_ != 0 ||
      !power_of_two(large_page_ / page_))
    throw invalid_argument(
        fmt::format("memory_resource: large_page_size {} is not the granularity {} times a power of two "
                    "of at most {} bytes",
                    large_page_, page_, largest_large_page));
  properties_.large_page_size = large_page_;
  if (!(properties_.headroom >= 0 && properties_.headroom <= 1))  // NaN too
    throw invalid_argument(
        fmt::format("memory_resource: headroom {} is not a share from 0 to 1", properties_.headroom));
  if (properties_.headroom == 0) properties_.headroom = large_page_ == page_ ? 1.0 / 8 : 1.0 / 128;
  const std::size_t initial = round_up(properties_.initial_size, page_) / page_;
  for (std::size_t i = 0; i < initial; ++i) {
    spare_[0].push_back(std::make_shared<const pooled_chunk>(pool_->acquire(page_)));
    ++pages_created_;
  }
  reserved_high_ = reserved_bytes();
}

resource_state::~resource_state() {
  if (const std::size_t registered = registrations_->close(); registered != 0)
    report_cleanup_failure(
        fmt::format("memory_resource: destroyed with {} registration(s) (memory_registration) "
                    "still live: deregistered",
                    registered)
            .c_str());
  wait_for_host_release();
  // The host copies (asleep, or kept by the last wake) go back to the system now.
  saved_.reset();
  std::size_t live = 0;
  for (std::size_t i = 0; i < arena_count_.load(); ++i) live += arenas_[i].load()->allocated_count();
  if (live != 0)
    report_cleanup_failure(fmt::format("memory_resource: destroyed with {} allocation(s) still live "
                                       "({} bytes): their memory is unmapped once the streams pass",
                                       live, used_.load())
                               .c_str());
  // Work queued on any stream may still use the pages: unmap them once it has passed. The
  // points recorded already cover the frees before them; frees after a stream's last point
  // have none, and vmm does not record on a stream it is not handed (it may be gone): then
  // the device is waited for.
  std::vector<stream_event> passed;
  bool open_epochs = false;
  for (const auto& entry : streams_) {
    if (synchronous_ || entry.get() == sync_entry_.load()) continue;
    stream_record& record = *entry->record;
    open_epochs = open_epochs || record.frees.load() != 0;
    for (auto& point : record.points) passed.push_back(std::move(point.second));
  }
  if (open_epochs) {
    cleanup("memory_resource: waiting for the device", [&] { executor_.synchronize_device(); });
    passed.clear();
  }
  struct everything {
    std::vector<std::unique_ptr<arena>> arenas;
    std::array<std::vector<shared_chunk>, 2> spare;
  };
  std::shared_ptr<void> held;
  try {
    held = std::make_shared<everything>(everything{std::move(arena_storage_), std::move(spare_)});
  } catch (...) {
    for (const stream_event& point : passed)
      cleanup("memory_resource: waiting", [&] { point.synchronize(); });
    return;  // the members unmap now
  }
  retire(std::move(passed), std::move(held));
}

// ---- streams and arenas -------------------------------------------------------------------

std::size_t resource_state::arena_index_containing(std::uintptr_t address) const noexcept {
  const std::size_t count = arena_count_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < count; ++i)
    if (arenas_[i].load(std::memory_order_acquire)->contains(address)) return i;
  return max_arenas;
}

arena* resource_state::arena_containing(std::uintptr_t address) const noexcept {
  const std::size_t i = arena_index_containing(address);
  return i == max_arenas ? nullptr : arenas_[i].load(std::memory_order_acquire);
}

arena& resource_state::add_arena(std::size_t bytes, std::size_t page_size) {
  const std::size_t count = arena_count_.load();
  if (count == max_arenas)
    throw out_of_memory(fmt::format("memory_resource: {} address ranges made already", max_arenas));
  arena_storage_.push_back(std::make_unique<arena>(provider(), bytes, page_size));
  arena* made = arena_storage_.back().get();
  arenas_[count].store(made, std::memory_order_release);
  arena_count_.store(count + 1, std::memory_order_release);
  return *made;
}

resource_state::resource_state::stream_entry& resource_state::make_entry(stream_ref stream, bool sync) {
  const std::size_t start = stream_slot_of(stream);
  // First use of the stream: its record and its two home arenas. Arenas are made outside
  // the fast path's locks (the resource's mutex only); adding one never moves another.
  std::lock_guard lock(mutex_);
  if (stream_entry* e = sync_entry_.load(); sync && e != nullptr) return *e;
  for (const auto& e : streams_)
    if (!sync && e.get() != sync_entry_.load() && e->record->stream == stream) return *e;
  auto entry = std::make_unique<stream_entry>();
  entry->record = std::make_unique<stream_record>(stream);
  // Addresses are cheap: the large arena spans twice the memory the resource may reserve,
  // so that holes left by freed blocks never run it out; small blocks need far less.
  entry->arenas[0].push_back(&add_arena(std::max(properties_.max_size / 8, std::size_t{64} << 20), page_));
  entry->arenas[1].push_back(&add_arena(2 * properties_.max_size, page_));
  if (large_limit_ != ~std::uint64_t{0})
    entry->arenas[2].push_back(&add_arena(round_up(2 * properties_.max_size, large_page_), large_page_));
  stream_entry* made = entry.get();
  streams_.push_back(std::move(entry));
  if (sync) {
    sync_entry_.store(made, std::memory_order_release);
  } else {
    for (std::size_t i = 0; i < stream_table_.size(); ++i) {
      auto& slot = stream_table_[(start + i) % stream_table_.size()];
      stream_entry* expected = nullptr;
      if (slot.compare_exchange_strong(expected, made, std::memory_order_acq_rel)) break;
    }
  }
  return *made;
}

// ---- allocation ---------------------------------------------------------------------------

void resource_state::note_used(std::uint64_t bytes) noexcept {
  std::size_t now = 0;
  if (process_single_threaded()) {  // no other thread: no locked instruction (arena_mutex.hpp)
    now = used_.load(std::memory_order_relaxed) + bytes;
    used_.store(now, std::memory_order_relaxed);
  } else {
    now = used_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  }
  std::size_t high = used_high_.load(std::memory_order_relaxed);
  while (now > high && !used_high_.compare_exchange_weak(high, now, std::memory_order_relaxed)) {}
}

void resource_state::note_unused(std::uint64_t bytes) noexcept {
  if (process_single_threaded())
    used_.store(used_.load(std::memory_order_relaxed) - bytes, std::memory_order_relaxed);
  else
    used_.fetch_sub(bytes, std::memory_order_relaxed);
}

void* resource_state::try_mapped(arena& home, stream_record* record, std::uint64_t size,
                                 std::uint64_t alignment, std::uint32_t tag, std::uint8_t slack) {
  std::lock_guard lock(home.mutex);
  if (size < small_limit)  // only small blocks wait in quick bins (deallocate)
    if (block* b = home.take_quick(size, alignment, record)) {
      b->tag = tag;
      b->slack = slack;
      ++home.allocations_made;
      return reinterpret_cast<void*>(home.base() + b->offset);
    }
  const auto search = [&](free_index& index) -> void* {
    block* found = nullptr;
    std::uint64_t start = 0;
    int weighed = 0;
    index.candidates(size, [&](block* b) {
      const std::uint64_t at = arena::fit(b, size, alignment);
      if (at != ~std::uint64_t{0} && home.all_mapped(at, size)) {
        found = b;
        start = at;
        return true;
      }
      return ++weighed >= candidates_weighed;
    });
    if (found == nullptr) return nullptr;
    block* b = home.carve(found, start, size);
    b->tag = tag;
    b->slack = slack;
    ++home.allocations_made;
    return reinterpret_cast<void*>(home.base() + b->offset);
  };
  const auto search_all = [&]() -> void* {
    if (record != nullptr)
      for (auto& slot : home.slots())
        if (slot->record == record)
          if (void* p = search(slot->pending)) return p;
    return search(home.released());
  };
  if (void* p = search_all()) return p;
  // The cached blocks, freed as they would have been, may make the run that fits.
  if (home.cached_count() == 0) return nullptr;
  home.flush_quick(policies_.allow_opportunistic);
  return search_all();
}

void* resource_state::allocate(stream_ref stream, std::size_t bytes, std::size_t alignment, bool sync,
                               std::uint32_t tag) {
  if (asleep_.load(std::memory_order_relaxed))
    throw invalid_argument("memory_resource: allocate while the resource is asleep (wake() it first)");
  if (!power_of_two(alignment) || alignment > page_)
    throw invalid_argument(
        fmt::format("memory_resource: alignment {} is not a power of two of at most the granularity {}",
                    alignment, page_));
  if (bytes == 0) return nullptr;
  if (bytes > largest_request)
    throw invalid_argument(
        fmt::format("memory_resource: {} bytes asked for: more than any address space holds", bytes));
  const std::uint64_t size = round_to_unit(bytes);
  if (size > properties_.max_size) {  // before a stream's arenas are made: nothing changes
    const all_locked locked(*this);
    refuse_request(bytes, size, fmt::format("more than max_size of {} bytes", properties_.max_size));
  }
  const std::uint64_t align = std::max<std::uint64_t>(alignment, unit);
  stream_entry& entry = entry_of(stream, sync);
  const std::size_t kind = kind_of(size);
  const auto slack = static_cast<std::uint8_t>(size - bytes);
  void* p =
      try_mapped(*entry.arenas[kind].back(), sync ? nullptr : entry.record.get(), size, align, tag, slack);
  if (p == nullptr) p = slow_allocate(entry, size, align, sync, bytes, tag);
  note_used(size);
  return p;
}

std::uint64_t resource_state::stitch_limit() const noexcept {
  // The reserved memory past which a page is stitched rather than created: the most ever
  // in use, and 1/256 more for the pages shared at the edges of runs of blocks, a large
  // page (large_page_room), and the headroom learned (up to
  // memory_resource_properties::headroom of the most in use: by default 1/8; 1/128 when the
  // blocks whose layout moves most, the large ones, have large pages, which move for 1/16 of
  // the cost). The edges get a fixed 1/256 rather than more: it holds the replays of
  // bench/data closer to their peak for a few more pages moved or made
  // (docs/design/memory_resource.md, "Headroom").
  const std::uint64_t high = most_in_use();
  const auto most_headroom =
      static_cast<std::uint64_t>(static_cast<long double>(high) * properties_.headroom);
  return high + high / 256 + 2 * page_ + large_page_room(high) + std::min(learned_headroom_, most_headroom);
}

std::uint64_t resource_state::large_page_room(std::uint64_t high) const noexcept {
  // With two page sizes, memory moves between them a large page at a time: where the room
  // past the most in use is less than a large page, the small pages that one request makes
  // cost the large pages a large page, which the next large request makes again from idle
  // small pages, every step. One large page more of room, where it is at most 1/128 of the
  // most in use, ends that (docs/design/memory_resource.md, "Two page sizes").
  return large_page_ != page_ && large_page_ <= high / 128 ? large_page_ : 0;
}

std::uint64_t resource_state::most_in_use() const noexcept {
  return std::max<std::uint64_t>(used_high_.load(std::memory_order_relaxed), used_.load() + request_);
}

std::uint64_t resource_state::wait_limit() const noexcept {
  // 1/128 past the most in use, about where the stitch limit is without learned headroom,
  // weighed on every page a request makes (take_pages): a wider limit lets pending pages of
  // the other size be made again beside themselves; a narrower one waits more often for
  // little memory (docs/design/memory_resource.md, "Waits").
  const std::uint64_t high = most_in_use();
  return high + high / 128;
}

template <class SizeFits, class Skip, class More, class Take>
void resource_state::unmap_idle_pages(SizeFits size_fits, Skip skip, More more, Take take) {
  for (std::size_t i = arena_count_.load(); i-- > 0 && more();) {
    arena& a = *arenas_[i].load();
    if (!size_fits(a.page_size())) continue;
    for (std::size_t p = a.idle_page_below(a.page_count()); p < a.page_count() && more();
         p = a.idle_page_below(p)) {
      if (skip(a, p)) continue;
      shared_chunk chunk = a.unmap_page(p);
      if (chunk == nullptr) continue;
      --mapped_pages_[page_class(a)];
      take(a, std::move(chunk));
    }
  }
}

std::vector<shared_chunk> resource_state::steal_idle_pages(const arena& target, std::size_t first,
                                                           std::size_t count, std::size_t wanted) {
  // Idle pages go from the top of each arena down, the newest arena first. The pages
  // highest up are where a request lands only when nothing lower fits, so moving them
  // unsettles the least; taking the pages of the smallest free blocks first stitches more
  // and reserves more (docs/design/memory_resource.md, "Stitching"). Only pages of the
  // target's size fit it. Moving a large page costs the driver about what a small one does,
  // so only small pages teach the resource headroom.
  std::vector<shared_chunk> stolen;
  const std::size_t size = target.page_size();
  const auto skip = [&](const arena& a, std::size_t p) {
    return &a == &target && p >= first && p < first + count;
  };
  const auto took = [&] {
    ++pages_stitched_;
    if (size == page_) learned_headroom_ += page_;
  };
  unmap_idle_pages([&](std::size_t s) { return s == size; }, skip, [&] { return stolen.size() < wanted; },
                   [&](const arena&, shared_chunk chunk) {
                     took();
                     stolen.push_back(std::move(chunk));
                   });
  // Then pages that only blocks freed on the allocating stream hold, whose free that
  // stream's queued work may not have passed yet: work queued on it from now on comes
  // after the free, so the memory may serve this request at once (as a block freed on a
  // stream is reused by that stream at once). The page is mapped here too and its old
  // mapping stays until the stream passes the free (retiring_), since unmapping is not
  // stream-ordered. Without this, a program running ahead of its GPU reserves anew what it
  // has just freed. Whole pages inside one pending block only: no other block holds them.
  if (caller_ == nullptr || synchronous_ || stolen.size() >= wanted) return stolen;
  stream_record& record = *caller_;
  std::lock_guard record_lock(record.mutex);
  for (std::size_t i = arena_count_.load(); i-- > 0 && stolen.size() < wanted;) {
    arena& a = *arenas_[i].load();
    if (a.page_size() != size) continue;
    for (auto& slot : a.slots()) {
      if (slot->record != &record) continue;
      for (block* b = slot->oldest; b != nullptr && stolen.size() < wanted; b = b->next_pending) {
        // Whole pages of the block, from its end farthest from the target: the stream's
        // next requests land next to this one (the rest of a block it was carved from, or
        // the run a growing tensor leaves below), where a page lent away would make them
        // wait for the stream or move pages again (docs/design/memory_resource.md,
        // "Lending").
        const std::size_t low = (b->offset + size - 1) / size;
        const std::size_t high = b->end() / size;
        const bool below = &a == &target && high <= first;
        for (std::size_t i = 0; i < (high > low ? high - low : 0) && stolen.size() < wanted; ++i) {
          const std::size_t p = below ? low + i : high - 1 - i;
          if (!a.mapped(p) || a.held(p) != size || a.retiring(p) || skip(a, p)) continue;
          // The last free over the page, not the block's newest, must be behind a recorded
          // point, for the old mapping to wait for: a block freed just now takes in the
          // blocks freed before it, and a request that needs the lent page's address again
          // waits only for the work before its own free, not for the whole block's.
          const std::uint64_t epoch = a.freed_epoch(p, record, b->epoch);
          if (!point_after(record, epoch)) return stolen;
          took();
          --mapped_pages_[page_class(a)];
          stolen.push_back(a.lend_page(p, record, epoch));
          retiring_.emplace_back(&a, p);
        }
      }
    }
  }
  return stolen;
}

void resource_state::give_back_idle_pages_of_other_sizes(std::size_t size, std::size_t bytes) {
  // Idle pages of the other size go back to the device (unmapped, released from the
  // pool), so that the memory is made again in pages of `size`: what one size frees, the
  // other can take, at the cost of a release and a create instead of a stitch.
  std::size_t freed = 0;
  unmap_idle_pages([&](std::size_t s) { return s != size; }, no_skip, [&] { return freed < bytes; },
                   [&](const arena& a, shared_chunk) {  // back to the pool as it goes
                     ++pages_released_;
                     freed += a.page_size();
                     if (a.page_size() == page_) learned_headroom_ += page_;
                   });
  if (freed == 0) return;
  const std::size_t pool_reserved = pool_->statistics().reserved_current;
  pool_->trim_to(pool_reserved > freed ? pool_reserved - freed : 0);
}

void resource_state::pass_pending_of_other_sizes(std::size_t size, std::size_t bytes) {
  // What has passed becomes free for everyone only where the reuse policies allow it:
  // otherwise the pages stay held, and waiting would free nothing.
  if (!policies_.allow_opportunistic) return;
  // The allocating stream's pending blocks in arenas of the other size, with the bytes of
  // the whole pages each has mapped, oldest free first: the host waits for the last one needed.
  stream_record& record = *caller_;
  std::vector<std::pair<std::uint64_t, std::size_t>> frees;  // (epoch, bytes)
  for (std::size_t i = 0; i < arena_count_.load(); ++i) {
    arena& a = *arenas_[i].load();
    if (a.page_size() == size) continue;
    for (const auto& slot : a.slots()) {
      if (slot->record != &record) continue;
      for (const block* b = slot->oldest; b != nullptr; b = b->next_pending) {
        const std::uint64_t first = (b->offset + a.page_size() - 1) / a.page_size() * a.page_size();
        const std::uint64_t end = b->end() / a.page_size() * a.page_size();
        if (end <= first) continue;
        const std::size_t count = (end - first) / a.page_size();
        if (const std::size_t mapped = count - a.unmapped_pages(first, end - first, count); mapped != 0)
          frees.emplace_back(b->epoch, mapped * a.page_size());
      }
    }
  }
  if (frees.empty()) return;
  std::sort(frees.begin(), frees.end());
  std::uint64_t epoch = 0;
  std::size_t found = 0;
  for (auto it = frees.begin(); it != frees.end() && found < bytes; ++it) {
    epoch = it->first;
    found += it->second;
  }
  {
    // The free must be behind a recorded point, for the host to wait for.
    std::lock_guard record_lock(record.mutex);
    if (!point_after(record, epoch)) return;
  }
  host_waits_ += wait_for_epoch(record, epoch) ? 1 : 0;  // point_after may have waited already
  release_passed();
}

std::vector<std::pair<shared_chunk, bool>> resource_state::take_pages(const arena& target, std::size_t first,
                                                                      std::size_t count, std::size_t wanted) {
  // Spare pages first, then pages stitched from idle places (once the resource holds as
  // much as it ever needed, or at its maximum), then idle pages of the other size given
  // back, then fresh ones from the pool; a full device lets idle pages be stitched after all.
  std::vector<std::pair<shared_chunk, bool>> taken;  // (page, created for this request)
  const std::size_t size = target.page_size();
  std::vector<shared_chunk>& spare = spare_[page_class(target)];
  while (taken.size() < wanted && !spare.empty()) {
    taken.emplace_back(std::move(spare.back()), false);
    spare.pop_back();
  }
  const auto reserved = [&] { return reserved_bytes() + taken.size() * size; };
  const auto steal = [&](std::size_t n) {
    for (shared_chunk& chunk : steal_idle_pages(target, first, count, n))
      taken.emplace_back(std::move(chunk), false);
  };
  // Pages short of `wanted` that would take the reserved memory past what it may grow to.
  const auto beyond_room = [&]() -> std::size_t {
    const std::size_t limit = std::min<std::size_t>(stitch_limit(), properties_.max_size);
    const std::size_t room = limit > reserved() ? (limit - reserved()) / size : 0;
    return wanted - taken.size() > room ? wanted - taken.size() - room : 0;
  };
  // A failure anywhere gives the pages taken so far (none created) back as spare.
  try {
    if (const std::size_t beyond = beyond_room(); beyond != 0) steal(beyond);
    if (large_page_ != page_) {
      if (const std::size_t beyond = beyond_room(); beyond != 0)
        give_back_idle_pages_of_other_sizes(size, beyond * size);
      // Pages of the other size that blocks freed on the allocating stream hold cannot be
      // lent (the sizes differ) and cannot go back to the device before the stream passes
      // the free; without them, a program running ahead of its GPU reserves again what it
      // has just freed in the other size. Where making every page still missing would take
      // the reserved memory past wait_limit(), the host waits for the stream instead, and
      // the pages are made again in this size.
      if (const std::size_t beyond = beyond_room(); beyond != 0 && caller_ != nullptr && !synchronous_)
        if (const std::size_t after = reserved() + (wanted - taken.size()) * size; after > wait_limit()) {
          pass_pending_of_other_sizes(size, after - wait_limit());
          give_back_idle_pages_of_other_sizes(size, beyond * size);
        }
    }
    while (taken.size() < wanted) {
      if (reserved() + size > properties_.max_size)
        throw out_of_memory(
            fmt::format("memory_resource: max_size of {} bytes reached", properties_.max_size));
      try {
        taken.emplace_back(std::make_shared<const pooled_chunk>(pool_->acquire(size)), true);
      } catch (const out_of_memory&) {
        const std::size_t before = taken.size();
        steal(wanted - taken.size());  // the device is full: idle pages of ours instead
        if (taken.size() == before) throw;
      }
    }
  } catch (...) {
    for (auto& [chunk, fresh] : taken)
      if (!fresh) spare.push_back(std::move(chunk));
    throw;
  }
  return taken;
}

bool resource_state::unmap_retiring(arena& a, std::size_t p, bool wait) {
  const page& lent = a.page_at(p);
  if (lent.retiring_on->passed.load() < lent.retiring_epoch) {
    if (!wait) return false;
    host_waits_ += wait_for_epoch(*lent.retiring_on, lent.retiring_epoch) ? 1 : 0;
  }
  return a.drop_retiring(p);
}

void resource_state::unmap_passed_retiring(bool wait) {
  std::erase_if(retiring_, [&](const std::pair<arena*, std::size_t>& entry) {
    return unmap_retiring(*entry.first, entry.second, wait);
  });
}

bool resource_state::wait_for_epoch(stream_record& record, std::uint64_t epoch) {
  const timed_into timer(host_wait_time_);
  std::lock_guard lock(record.mutex);
  bool waited = false;
  while (record.passed.load() < epoch && !record.points.empty()) {
    if (stream_event& point = record.points.front().second; !point.done()) {
      point.synchronize();
      waited = true;
    }
    record.pass_oldest();
  }
  record.outstanding.store(record.points.size());
  if (record.passed.load() < epoch) {  // no point left: everything
    executor_.synchronize_device();
    waited = true;
  }
  return waited;
}

void resource_state::map_pages(arena& a, std::uint64_t offset, std::uint64_t size) {
  const auto [first, count] = a.page_span(offset, size);
  // Pages taken for this run, and whether each was created for it: a failure gives the
  // created ones back to the pool and keeps the others spare, so that the reserved memory
  // is what it was.
  std::vector<std::size_t> mapped_now;
  std::vector<std::size_t> missing;
  for (std::size_t p = first; p < first + count; ++p)
    if (!a.mapped(p)) missing.push_back(p);
  // A page lent away with its old mapping still here: its stream must pass the free
  // before the address is mapped again (choose() avoids this where it can).
  for (std::size_t p : missing)
    if (a.retiring(p)) {
      if (!unmap_retiring(a, p, true))
        throw driver_error(0, "memory_resource: an address lent away could not be unmapped");
      std::erase(retiring_, std::pair{&a, p});
    }
  std::vector<std::pair<shared_chunk, bool>> taken = take_pages(a, first, count, missing.size());
  try {
    for (std::size_t i = 0; i < missing.size(); ++i) {
      const std::size_t p = missing[i];
      a.map_page(p, taken[i].first);
      ++mapped_pages_[page_class(a)];
      mapped_now.push_back(p);
    }
    // One access call per run of pages mapped now: the driver's cost is per call and handle.
    for (std::size_t i = 0; i < mapped_now.size();) {
      std::size_t j = i + 1;
      while (j < mapped_now.size() && mapped_now[j] == mapped_now[j - 1] + 1) ++j;
      provider()->set_access(a.base() + mapped_now[i] * a.page_size(), (j - i) * a.page_size(), grants_);
      i = j;
    }
  } catch (...) {
    for (std::size_t p : mapped_now) {
      if (a.unmap_page(p) == nullptr) {  // stays mapped: a later allocation uses it
        std::erase_if(taken, [&](const auto& t) { return t.first == a.chunk(p); });
        continue;
      }
      --mapped_pages_[page_class(a)];
    }
    for (auto& [chunk, fresh] : taken)  // the fresh ones go back to the pool
      if (!fresh) spare_[page_class(a)].push_back(std::move(chunk));
    throw;
  }
  for (const auto& t : taken) pages_created_ += t.second ? 1 : 0;
  const std::size_t reserved = reserved_bytes();
  reserved_high_ = std::max(reserved_high_, reserved);
  over_threshold_.store(reserved > properties_.release_threshold, std::memory_order_relaxed);
}

resource_state::choice resource_state::choose(arena& a, free_index& index, std::uint64_t size,
                                              std::uint64_t alignment, std::size_t better_than) const {
  choice best;
  best.unmapped = better_than;
  int weighed = 0;
  // Pages to map at `at`; pages lent away and not passed yet would make the stream wait:
  // last resort.
  const auto pages_to_map = [&](std::uint64_t at) {
    std::size_t unmapped = a.unmapped_pages(at, size, best.unmapped);
    if (unmapped != 0) unmapped += a.retiring_pages(at, size) * retiring_penalty;
    return unmapped;
  };
  index.candidates(size, [&](block* b) {
    std::uint64_t at = arena::fit(b, size, alignment);
    if (at == ~std::uint64_t{0}) return ++weighed >= candidates_weighed * 4;
    std::size_t unmapped = pages_to_map(at);
    // The block's far end, where its start lacks pages and the far end fewer: what a block
    // freed just below a live one leaves once merged with the free addresses under it, as a
    // tensor grown by x = cat(x, y) does at every step. Its pages are used where they are
    // instead of being moved. A pending block only when no page below the far end is mapped:
    // pages left idle there could be lent only once its stream passes the free.
    if (const std::uint64_t far = (b->end() - size) & ~(alignment - 1);
        unmapped != 0 && far > at && (b->owner == 0 || a.none_mapped(b->offset, far - b->offset)))
      if (const std::size_t there = pages_to_map(far); there < unmapped) {
        at = far;
        unmapped = there;
      }
    // Inside a block larger than the request by a page or more, the run with the fewest
    // pages to map: a large free block (the top of an arena, where the largest blocks of a
    // step come and go) holds the pages of the blocks freed in it where they lay, and a
    // request a little larger or smaller than one of them takes those pages where they are
    // instead of moving them from the block's start (docs/design/memory_resource.md,
    // "Placement"). Linear in the block's pages that have been held, as is mapping one.
    if (unmapped != 0 && b->size >= size + a.page_size())
      if (const auto [start, fewest] = a.fewest_unmapped(b->offset, b->end(), size); fewest < unmapped)
        if (const std::size_t there = pages_to_map(start); there < unmapped) {
          at = start;
          unmapped = there;
        }
    if (unmapped < best.unmapped) best = choice{&a, b, at, unmapped};
    return best.unmapped == 0 || ++weighed >= candidates_weighed;
  });
  return best;
}

void* resource_state::take(const choice& chosen, std::uint64_t size) {
  arena& a = *chosen.where;
  const std::uint32_t owner = chosen.b->owner;
  const std::uint64_t epoch = chosen.b->epoch;
  block* b = a.carve(chosen.b, chosen.start, size);
  if (chosen.unmapped != 0) {
    try {
      map_pages(a, b->offset, size);
    } catch (...) {
      // Back where it was. A pending block lacks pages where it took in released
      // neighbours; it stays pending on its stream, whose free has not passed.
      if (owner == 0)
        a.free_released(b);
      else
        a.free_pending(b, *a.slots()[owner - 1], epoch);
      throw;
    }
  }
  return reinterpret_cast<void*>(a.base() + b->offset);
}

resource_state::choice resource_state::mapped_run(const stream_entry& entry, std::size_t kind,
                                                  std::uint64_t size, std::uint64_t alignment, bool sync) {
  for (arena* a : entry.arenas[kind]) {
    if (!sync)
      for (auto& slot : a->slots())
        if (slot->record == entry.record.get())
          if (choice c = choose(*a, slot->pending, size, alignment, 1); c.b != nullptr) return c;
    if (choice c = choose(*a, a->released(), size, alignment, 1); c.b != nullptr) return c;
  }
  return {};
}

void* resource_state::place(arena& a, free_index& index, std::uint64_t size, std::uint64_t alignment) {
  const choice chosen = choose(a, index, size, alignment, std::numeric_limits<std::size_t>::max());
  return chosen.b == nullptr ? nullptr : take(chosen, size);
}

bool resource_state::point_after(stream_record& record, std::uint64_t epoch) {
  if (epoch < record.epoch.load()) return true;
  record_point(record);  // returns without one only where the stream has all it may have
  if (epoch < record.epoch.load()) return true;
  // Without a point the pages could neither be lent nor waited for, and the request would
  // make new ones beside them: a program far ahead of its GPU would reserve well past its
  // peak (docs/design/memory_resource.md, "Waits").
  ++host_waits_;
  {
    const timed_into timer(host_wait_time_);
    record.points.front().second.synchronize();
  }
  record.pass_oldest();
  record_point(record);
  return epoch < record.epoch.load();
}

void resource_state::record_point(stream_record& record) {
  // Points that have passed go first, so that the list stays short however long the
  // program runs without a slow path; a stream far behind its host keeps its epoch open
  // rather than piling up events.
  while (!record.points.empty() && record.points.front().second.done()) record.pass_oldest();
  record.outstanding.store(record.points.size());
  if (record.points.size() >= max_points) return;
  const std::uint64_t closed = record.epoch.fetch_add(1);
  record.frees.store(0, std::memory_order_relaxed);
  try {
    if (record.spare_events.empty()) {
      record.points.emplace_back(closed, stream_event(executor_, record.stream));
    } else {
      record.spare_events.back().record_again(record.stream);
      record.points.emplace_back(closed, std::move(record.spare_events.back()));
      record.spare_events.pop_back();
    }
  } catch (...) {
    record.epoch.fetch_sub(1);  // the epoch stays open
    throw;
  }
  record.outstanding.store(record.points.size());
}

void resource_state::refresh_points(stream_record* caller, bool wait) {
  if (synchronous_) return;
  bool waited = false;
  for (const auto& entry : streams_) {
    if (entry.get() == sync_entry_.load()) continue;
    stream_record& record = *entry->record;
    std::lock_guard lock(record.mutex);
    if (&record == caller && record.frees.load() != 0) record_point(record);
    while (!record.points.empty()) {
      const stream_event& point = record.points.front().second;
      if (!point.done()) {
        if (!wait) break;
        const timed_into timer(host_wait_time_);
        point.synchronize();
        waited = true;
      }
      record.pass_oldest();
    }
    record.outstanding.store(record.points.size());
  }
  host_waits_ += waited ? 1 : 0;
  release_passed();
}

void resource_state::release_passed() {
  if (!policies_.allow_opportunistic) return;
  for (std::size_t i = 0; i < arena_count_.load(); ++i) {
    arena& a = *arenas_[i].load();
    for (auto& slot : a.slots()) (void)a.release_pending(*slot, slot->record->passed.load());
  }
}

void* resource_state::place_with_dependency(stream_entry& entry, std::size_t kind, std::uint64_t size,
                                            std::uint64_t alignment, bool wait_allowed) {
  // Blocks freed on other streams, in this size class's arenas: those the allocating
  // stream is already ordered after (follow_event_dependencies), then, when allowed, any
  // (the allocating stream is made to wait for the freeing stream's point).
  stream_record& me = *entry.record;
  for (const auto& other : streams_) {
    if (other.get() == &entry || other.get() == sync_entry_.load()) continue;
    stream_record& record = *other->record;
    std::uint64_t ordered_after = 0;
    {
      std::lock_guard lock(record.mutex);
      for (const auto& [stream, epoch] : record.waited_by)
        if (stream == me.stream) ordered_after = std::max(ordered_after, epoch);
    }
    for (arena* a : other->arenas[kind]) {
      for (auto& slot : a->slots()) {
        if (slot->record != &record) continue;
        block* chosen = nullptr;
        slot->pending.candidates(size, [&](block* b) {
          if (arena::fit(b, size, alignment) == ~std::uint64_t{0}) return false;
          const bool followed = policies_.follow_event_dependencies && b->epoch <= ordered_after;
          if (followed || (wait_allowed && policies_.allow_internal_dependencies)) chosen = b;
          return chosen != nullptr;
        });
        if (chosen == nullptr) continue;
        if (chosen->epoch > ordered_after) {
          // Internal dependency: the allocating stream waits for the freeing stream's point
          // after this block's free. A block of an epoch still open has no such point (and
          // the freeing stream may be gone): it is not taken.
          std::lock_guard lock(record.mutex);
          const auto point = std::find_if(record.points.begin(), record.points.end(),
                                          [&](const auto& p) { return p.first >= chosen->epoch; });
          if (point == record.points.end()) continue;
          point->second.enqueue_wait(me.stream);
        }
        // Carved from that block itself: the bytes around the request stay pending on the
        // freeing stream, since only this stream has been ordered after the free.
        const std::uint64_t start = arena::fit(chosen, size, alignment);
        return take(
            choice{a, chosen, start, a->unmapped_pages(start, size, std::numeric_limits<std::size_t>::max())},
            size);
      }
    }
  }
  return nullptr;
}

void* resource_state::slow_allocate(stream_entry& entry, std::uint64_t size, std::uint64_t alignment,
                                    bool sync, std::size_t requested, std::uint32_t tag) {
  const std::size_t kind = kind_of(size);
  const auto start = std::chrono::steady_clock::now();  // the wait for the lock counts
  all_locked locked(*this);
  const timed_into timer(slow_path_time_, start);
  void* p = slow_allocate_locked(entry, kind, size, alignment, sync, requested);
  arena& a = *arena_containing(reinterpret_cast<std::uintptr_t>(p));
  block* b = a.allocated_at(reinterpret_cast<std::uintptr_t>(p) - a.base());
  b->tag = tag;
  b->slack = static_cast<std::uint8_t>(size - requested);
  ++a.allocations_made;
  return p;
}

void* resource_state::slow_allocate_locked(stream_entry& entry, std::size_t kind, std::uint64_t size,
                                           std::uint64_t alignment, bool sync, std::size_t requested) {
  request_ = size;
  caller_ = sync ? nullptr : entry.record.get();
  struct forget {
    std::uint64_t& request;
    stream_record*& caller;
    ~forget() {
      request = 0;
      caller = nullptr;
    }
  } forget_request{request_, caller_};
  // The bytes live blocks hold and this request cannot share: past max_size, no way of
  // placing it can succeed, and none is tried (a new address range would stay behind).
  if (used_.load() + size > properties_.max_size)
    refuse_request(
        requested, size,
        fmt::format("max_size of {} bytes reached ({} in use)", properties_.max_size, used_.load()));
  std::string shortage;  // the last option's out-of-memory, for the message
  // Runs one way of placing the request; an out-of-memory of one way (no pages for it)
  // lets the next be tried.
  const auto attempt_with = [&](auto&& option) -> void* {
    try {
      return option();
    } catch (const out_of_memory& error) {
      shortage = error.what();
      return nullptr;
    }
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    // The points that have passed make blocks free for every stream.
    refresh_points(sync ? nullptr : entry.record.get(), attempt > 0);
    unmap_passed_retiring(attempt > 0);
    // A request of small pages of at least a large page takes a run whose pages are all
    // mapped, in its own arenas or else in those of large pages, before any page is moved
    // or made: the memory that large blocks (activations of changing shapes) free from step
    // to step then serves it where it is, instead of going back to the device in large pages
    // while small ones are made again. Smaller requests would hold large pages for little
    // (docs/design/memory_resource.md, "Two page sizes").
    if (kind == 1 && large_limit_ != ~std::uint64_t{0} && size >= large_page_)
      for (const std::size_t k : {std::size_t{1}, std::size_t{2}})
        if (const choice c = mapped_run(entry, k, size, alignment, sync); c.b != nullptr)
          return take(c, size);
    arena& home = *entry.arenas[kind].back();
    if (!sync)
      for (auto& slot : home.slots())
        if (slot->record == entry.record.get())
          if (void* p = attempt_with([&] { return place(home, slot->pending, size, alignment); })) return p;
    // The released blocks of every arena of this size class (other streams' arenas only
    // when their frees may be reused: they have passed): the one that needs the fewest new
    // pages, this stream's own arenas first on a tie.
    choice best;
    for (arena* a : entry.arenas[kind])
      if (choice c = choose(*a, a->released(), size, alignment, best.unmapped); c.b != nullptr) best = c;
    if (policies_.allow_opportunistic)
      for (const auto& other : streams_)
        if (other.get() != &entry)
          for (arena* a : other->arenas[kind])
            if (choice c = choose(*a, a->released(), size, alignment, best.unmapped); c.b != nullptr)
              best = c;
    if (best.b != nullptr)
      if (void* p = attempt_with([&] { return take(best, size); })) return p;
    if (!sync)
      if (void* p = attempt_with([&] { return place_with_dependency(entry, kind, size, alignment, true); }))
        return p;
    if (shortage.empty()) {
      // No address run fits anywhere: a new arena for this stream.
      const std::size_t page_size = kind == 2 ? large_page_ : page_;
      arena* added = nullptr;
      try {  // an address range the provider refuses is this request's shortage too
        added =
            &add_arena(round_up(std::max<std::size_t>(2 * properties_.max_size, size), page_size), page_size);
      } catch (const out_of_memory& error) {
        shortage = error.what();
      }
      if (added != nullptr) {
        std::unique_lock<arena_mutex> hold(added->mutex);
        entry.arenas[kind].push_back(added);
        if (void* p = attempt_with([&] { return place(*added, added->released(), size, alignment); }))
          return p;
      }
    }
    // Out of memory: wait for what was retired in stream order and for every stream's
    // recorded points, then once more.
    if (attempt == 0) collect_retired(true);
  }
  refuse_request(requested, size, shortage);
}

void resource_state::refuse_request(std::size_t requested, std::uint64_t size, const std::string& why) const {
  throw out_of_memory(fmt::format(
      "memory_resource on {}: {} bytes requested ({} with rounding), {} reserved, {} in use, the largest "
      "free run of addresses is {} bytes{}{}",
      to_string(provider()->capabilities().where), requested, size, reserved_bytes(), used_.load(),
      largest_free_locked(), why.empty() ? "" : ": ", why));
}

// ---- deallocation -------------------------------------------------------------------------

void resource_state::refuse_deallocation(std::uintptr_t address, std::size_t bytes,
                                         const std::string& why) noexcept {
  bad_deallocations_.fetch_add(1, std::memory_order_relaxed);
  cleanup("memory_resource: deallocate", [&] {
    throw invalid_argument(fmt::format(
        "memory_resource: deallocate of {:#x} ({} bytes) refused: {}; nothing changed", address, bytes, why));
  });
}

void resource_state::deallocate(stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment,
                                bool sync) noexcept {
  if (ptr == nullptr) return;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const auto refuse = [&](const std::string& why) { refuse_deallocation(address, bytes, why); };
  arena* a = arena_containing(address);
  if (a == nullptr) return refuse("the pointer is not one of this resource's");
  if (asleep_.load()) return refuse("the resource is asleep (wake() it first)");
  if (!power_of_two(alignment)) return refuse(fmt::format("alignment {} is not a power of two", alignment));
  bool over = false;
  cleanup("memory_resource: deallocate", [&] {
    stream_entry* entry = (sync || synchronous_) ? nullptr : &entry_of(stream, false);
    std::lock_guard lock(a->mutex);
    block* b = a->allocated_at(address - a->base());
    if (b == nullptr || b->cached)
      return refuse("it is not a live allocation (freed twice, or never allocated)");
    if (bytes != b->size - b->slack)
      return refuse(fmt::format("it was allocated with {} bytes", b->size - b->slack));
    if (registrations_->any_in(address, b->size))
      return refuse("it is registered (memory_registration): end the registration first");
    const std::uint64_t size = b->size;
    // Small blocks wait in a quick bin for the next request of their size (arena.hpp). Not
    // larger ones: kept whole, they change where other sizes are placed, and the replays of
    // bench/data then stitch far more pages (docs/design/memory_resource.md, "Quick bins").
    // Small blocks have arenas of their own.
    const bool quick = size < small_limit;
    if (entry == nullptr) {
      if (!(quick && a->keep_quick(b, nullptr, 0))) a->free_released(b);
    } else {
      stream_record& record = *entry->record;
      stream_slot& slot = a->slot_of(record);
      const std::uint64_t epoch = record.epoch.load();
      if (!(quick && a->keep_quick(b, &slot, epoch))) a->free_pending(b, slot, epoch);
      // A point closes the epoch every few frees, and at once when none is outstanding (the
      // stream has caught up): so that what a stream frees before it falls idle becomes
      // free for others too, without an event for every free.
      // A count, not a ledger: two threads freeing on one stream into two arenas may lose
      // an increment (that point comes a free later), and the hot path saves an atomic
      // read-modify-write. A point is still recorded when none is outstanding.
      const std::uint32_t frees = record.frees.load(std::memory_order_relaxed) + 1;
      record.frees.store(frees, std::memory_order_relaxed);
      if (frees >= frees_per_point || record.outstanding.load(std::memory_order_relaxed) == 0) {
        {
          std::lock_guard record_lock(record.mutex);
          if (record.frees.load() != 0 && (record.frees.load() >= frees_per_point || record.points.empty()))
            record_point(record);
        }
        // What has passed on this stream is free for every stream now, in this arena.
        if (policies_.allow_opportunistic) (void)a->release_pending(slot, record.passed.load());
      }
    }
    note_unused(size);
    over = over_threshold_.load(std::memory_order_relaxed);
  });
  if (over)
    cleanup("memory_resource: release threshold", [&] {
      all_locked locked(*this);
      release_idle(properties_.release_threshold);
    });
}

// ---- giving memory back -------------------------------------------------------------------

void resource_state::release_idle(std::size_t bytes_to_keep) {
  refresh_points(nullptr, false);
  unmap_passed_retiring(false);
  for (std::vector<shared_chunk>& spare : spare_)
    while (!spare.empty() && reserved_bytes() > bytes_to_keep) {
      spare.pop_back();  // back to the chunk pool
      ++pages_released_;
    }
  unmap_idle_pages([](std::size_t) { return true; }, no_skip,
                   [&] { return reserved_bytes() > bytes_to_keep; },
                   [&](const arena&, shared_chunk) { ++pages_released_; });  // back to the pool
  over_threshold_.store(reserved_bytes() > properties_.release_threshold, std::memory_order_relaxed);
}

void resource_state::trim_to(std::size_t bytes_to_keep) {
  all_locked locked(*this);
  release_idle(bytes_to_keep);
  if (!asleep_.load()) saved_.reset();  // host copies kept by the last wake
}

void resource_state::synchronize() {
  all_locked locked(*this);
  executor_.synchronize_device();
  // Every epoch of every stream has passed: close them without an event.
  for (const auto& entry : streams_) {
    stream_record& record = *entry->record;
    std::lock_guard lock(record.mutex);
    record.passed.store(record.epoch.fetch_add(1));
    record.frees.store(0);
    record.points.clear();
    record.outstanding.store(0);
  }
  for (std::size_t i = 0; i < arena_count_.load(); ++i) {
    arena& a = *arenas_[i].load();
    for (auto& slot : a.slots()) (void)a.release_pending(*slot, slot->record->passed.load());
  }
}

void resource_state::set_release_threshold(std::size_t bytes) {
  all_locked locked(*this);
  properties_.release_threshold = bytes;
  release_idle(bytes);
}

// ---- sleep and wake -----------------------------------------------------------------------

void resource_state::sleep(std::span<const allocation_tag> offload, stream_ref stream) {
  all_locked locked(*this);
  if (asleep_.load()) throw invalid_argument("memory_resource: sleep while asleep already");
  wait_for_host_release();  // the last wake's host memory is back before more is taken
  // Stream order, not a device-wide synchronize: the copies are queued on `stream` after
  // the work queued there, and the pages go once `stream` has passed them.
  refresh_points(nullptr, false);

  // The runs of allocations to save, adjacent ones of one tag together.
  const auto offloaded = [&](std::uint32_t tag) {
    return std::any_of(offload.begin(), offload.end(), [&](allocation_tag t) { return t.value == tag; });
  };
  std::vector<saved_run> runs;
  std::vector<std::uint32_t> tags;
  std::size_t total = 0;
  for (std::size_t i = 0; i < arena_count_.load(); ++i) {
    arena& a = *arenas_[i].load();
    std::vector<const block*> blocks;
    a.allocated().for_each([&](const block* b) { blocks.push_back(b); });
    std::sort(blocks.begin(), blocks.end(),
              [](const block* x, const block* y) { return x->offset < y->offset; });
    for (const block* b : blocks) {
      if (std::find(tags.begin(), tags.end(), b->tag) == tags.end()) tags.push_back(b->tag);
      if (!offloaded(b->tag)) continue;
      const std::uintptr_t address = a.base() + b->offset;
      if (!runs.empty() && runs.back().tag == b->tag && runs.back().address + runs.back().bytes == address) {
        runs.back().bytes += b->size;
      } else {
        runs.push_back({address, b->size, total, b->tag});
      }
      total += b->size;
    }
  }
  for (std::size_t i = 1; i < runs.size(); ++i) runs[i].offset = runs[i - 1].offset + runs[i - 1].bytes;

  // The host copies first: if they cannot be had, nothing has changed. Each run is copied
  // piece by piece as the host memory under it becomes ready.
  std::unique_ptr<host_copies> saved;
  const bool reused = total != 0 && saved_ && saved_->size() >= total;
  if (total != 0) {
    if (reused) {
      saved = std::move(saved_);
    } else {
      saved_.reset();  // kept copies too small: the host has them back before more is asked
      saved = std::make_unique<host_copies>(total, executor_);
    }
    std::size_t next_run = 0;
    try {
      saved->prepare([&](std::size_t begin, std::size_t n) {
        for (; next_run < runs.size() && runs[next_run].offset < begin + n; ++next_run) {
          const saved_run& run = runs[next_run];
          const std::size_t from = std::max(begin, run.offset);
          const std::size_t to = std::min(begin + n, run.offset + run.bytes);
          executor_.copy(saved->data() + from,
                         reinterpret_cast<std::byte*>(run.address) + (from - run.offset), to - from, stream);
          if (to < run.offset + run.bytes) break;  // the rest of it lies in the next piece
        }
      });
    } catch (...) {
      // Copies queued into the host memory may still run: they finish before it goes, or
      // before kept copies are kept again (nothing changed).
      cleanup("memory_resource: sleep", [&] { executor_.synchronize(stream); });
      if (reused) saved_ = std::move(saved);
      throw;
    }
  }
  executor_.synchronize(stream);
  // Nothing can fail from here: the transports let go of the memory before its pages go.
  registrations_->withdraw_all();
  unmap_passed_retiring(true);  // the old mappings of lent pages too

  // Every page goes: the physical memory back to the pool, and the pool's idle memory back
  // to the device.
  for (std::size_t i = 0; i < arena_count_.load(); ++i) {
    arena& a = *arenas_[i].load();
    for (std::size_t p = 0; p < a.page_count(); ++p) {
      if (!a.mapped(p) || a.unmap_page(p) == nullptr) continue;  // a page that cannot be unmapped stays
      --mapped_pages_[page_class(a)];
      ++pages_released_;
    }
  }
  for (std::vector<shared_chunk>& spare : spare_) {
    pages_released_ += spare.size();
    spare.clear();
  }
  pool_->trim_to(0);
  if (saved) saved_ = std::move(saved);  // nothing saved: copies kept before stay kept
  saved_runs_ = std::move(runs);
  asleep_tags_ = std::move(tags);
  asleep_.store(true);
}

void resource_state::wake(std::span<const allocation_tag> tags, stream_ref stream, after_wake then) {
  all_locked locked(*this);
  if (!asleep_.load()) throw invalid_argument("memory_resource: wake while awake");
  const auto waking = [&](std::uint32_t tag) {
    return tags.empty() ||
           std::any_of(tags.begin(), tags.end(), [&](allocation_tag t) { return t.value == tag; });
  };
  // The pages under the allocations of the waking tags, in order of arena and page.
  struct needed_page {
    arena* where;
    std::size_t arena_index;
    std::size_t page;
  };
  std::vector<needed_page> needed;
  for (std::size_t i = 0; i < arena_count_.load(); ++i) {
    arena& a = *arenas_[i].load();
    std::vector<bool> wanted;
    a.allocated().for_each([&](const block* b) {
      if (!waking(b->tag)) return;
      const auto [first, count] = a.page_span(b->offset, b->size);
      if (wanted.size() < first + count) wanted.resize(first + count);
      for (std::size_t p = first; p < first + count; ++p) wanted[p] = true;
    });
    for (std::size_t p = 0; p < wanted.size(); ++p)
      if (wanted[p] && !a.mapped(p)) needed.push_back({&a, i, p});
  }
  // Take every page first: a wake that cannot have them all gives them back.
  std::vector<shared_chunk> taken;
  taken.reserve(needed.size());
  std::size_t needed_bytes = 0;
  for (const needed_page& n : needed) needed_bytes += n.where->page_size();
  std::size_t taken_bytes = 0;
  try {
    while (taken.size() < needed.size()) {
      const std::size_t size = needed[taken.size()].where->page_size();
      if (properties_.max_size < reserved_bytes() + taken_bytes + size)
        throw out_of_memory(fmt::format("max_size of {} bytes reached", properties_.max_size));
      taken.push_back(std::make_shared<const pooled_chunk>(pool_->acquire(size)));
      taken_bytes += size;
    }
  } catch (const out_of_memory& error) {
    taken.clear();
    pool_->trim_to(0);
    throw out_of_memory(
        fmt::format("memory_resource: wake needs {} bytes ({} pages); {} bytes were missing: {}",
                    needed_bytes, needed.size(), needed_bytes - taken_bytes, error.what()));
  }
  // A pipeline: the pages are mapped and granted a run at a time (the driver's cost is per
  // handle), and the copy of a saved run is queued as soon as every page it
  // touches is granted, so that the copies of the first runs overlap the driver's work on
  // the later ones. `copies`: each waking saved run, after how many of `needed` must be
  // granted before it is copied (0: every page it touches stayed mapped).
  std::vector<std::pair<std::size_t, const saved_run*>> copies;
  for (const saved_run& run : saved_runs_) {
    if (!waking(run.tag)) continue;
    const std::size_t index = arena_index_containing(run.address);  // a saved run is an allocation's
    const arena& a = *arenas_[index].load();
    const auto [first, count] = a.page_span(run.address - a.base(), run.bytes);
    // The last needed page at or below the run's last page, if it is one of the run's.
    const auto after =
        std::upper_bound(needed.begin(), needed.end(), std::pair{index, first + count - 1},
                         [](const std::pair<std::size_t, std::size_t>& key, const needed_page& n) {
                           return key < std::pair{n.arena_index, n.page};
                         });
    const bool touches =
        after != needed.begin() && std::prev(after)->arena_index == index && std::prev(after)->page >= first;
    copies.emplace_back(touches ? static_cast<std::size_t>(after - needed.begin()) : 0, &run);
  }
  std::sort(copies.begin(), copies.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::size_t copied = 0;
  const auto copy_ready = [&](std::size_t granted) {
    for (; copied < copies.size() && copies[copied].first <= granted; ++copied) {
      const saved_run& run = *copies[copied].second;
      saved_->for_each_piece(run.offset, run.bytes, [&](std::size_t from, std::size_t n) {
        executor_.copy(reinterpret_cast<std::byte*>(run.address) + (from - run.offset), saved_->data() + from,
                       n, stream);
      });
    }
  };
  std::size_t mapped_now = 0;
  try {
    copy_ready(0);
    for (std::size_t i = 0; i < needed.size();) {
      std::size_t j = i + 1;
      const std::size_t run_pages = std::max<std::size_t>(1, wake_run_bytes / needed[i].where->page_size());
      while (j < needed.size() && j - i < run_pages && needed[j].where == needed[i].where &&
             needed[j].page == needed[j - 1].page + 1)
        ++j;
      for (std::size_t k = i; k < j; ++k) {
        needed[k].where->map_page(needed[k].page, std::move(taken[k]));
        ++mapped_pages_[page_class(*needed[k].where)];
        ++mapped_now;
      }
      const std::size_t size = needed[i].where->page_size();
      provider()->set_access(needed[i].where->base() + needed[i].page * size, (j - i) * size, grants_);
      copy_ready(j);
      i = j;
    }
    executor_.synchronize(stream);
    // The registrations of the waking allocations, over the new pages and restored bytes;
    // a registrar that throws has had the ones renewed here withdrawn again.
    registrations_->renew(waking);
  } catch (...) {
    // Copies queued into the pages may still run: they finish before the pages go.
    if (copied != 0) cleanup("memory_resource: wake", [&] { executor_.synchronize(stream); });
    for (std::size_t i = 0; i < mapped_now; ++i)
      if (needed[i].where->unmap_page(needed[i].page) != nullptr) {
        --mapped_pages_[page_class(*needed[i].where)];
      }
    throw;
  }
  pages_created_ += needed.size();
  std::erase_if(asleep_tags_, waking);
  std::erase_if(saved_runs_, [&](const saved_run& run) { return waking(run.tag); });
  reserved_high_ = std::max(reserved_high_, reserved_bytes());
  if (asleep_tags_.empty()) {
    saved_runs_.clear();
    if (then == after_wake::give_back_host_copies) give_back_host_copies();
    asleep_.store(false);
  }
}

void resource_state::give_back_host_copies() {
  if (synchronous_) {
    // Host memory (the OS provider): nothing to unpin, so the copies go back here, and no
    // thread is left running behind the call.
    saved_.reset();
    return;
  }
  // Pinned copies go back to the system on a thread of their own: unpinning and unmapping
  // them costs about as much as the rest of the wake (docs/design/memory_resource.md,
  // "Sleep and wake"), and nothing waits for it. The next sleep() and the destructor wait for
  // it. The thread holds what it uses (the copies use the executor, a static): it may outlive
  // the resource.
  wait_for_host_release();
  host_releases_running& running = host_releases_running::instance();
  running.add(this);
  released_on_a_thread_ = true;
  try {
    std::thread([owner = this, &running, saved = std::move(saved_)]() mutable noexcept {
      saved.reset();
      running.remove(owner);  // last: the resource's destructor waits for this
    }).detach();
  } catch (const std::system_error&) {
    // No thread to be had: the copies went with the closure that could not start.
    running.remove(this);
  }
}

void resource_state::wait_for_host_release() noexcept {
  if (released_on_a_thread_) host_releases_running::instance().wait_for(this);
}

// ---- access, dependencies, statistics -----------------------------------------------------

void resource_state::set_access(std::span<const access_grant> grants) {
  if (grants.empty()) throw invalid_argument("memory_resource: set_access with no grants");
  all_locked locked(*this);
  std::vector<access_grant> next(grants.begin(), grants.end());
  for (std::size_t i = 0; i < arena_count_.load(); ++i) {
    arena& a = *arenas_[i].load();
    for (std::size_t p = 0; p < a.page_count();) {
      if (!a.mapped(p)) {
        ++p;
        continue;
      }
      std::size_t q = p + 1;
      while (a.mapped(q)) ++q;
      provider()->set_access(a.base() + p * a.page_size(), (q - p) * a.page_size(), next);
      p = q;
    }
  }
  grants_ = std::move(next);
}

access_mode resource_state::access(const accessor& who) const {
  std::lock_guard lock(mutex_);
  for (const access_grant& grant : grants_)
    if (grant.who == who) return grant.mode;
  return access_mode::none;
}

void resource_state::wait_for(stream_ref waiting, stream_ref freeing) {
  if (synchronous_) return;
  stream_record& record = *entry_of(freeing, false).record;
  std::lock_guard lock(record.mutex);
  record_point(record);
  const auto& [epoch, point] = record.points.back();
  point.enqueue_wait(waiting);
  for (auto& [stream, ordered] : record.waited_by)
    if (stream == waiting) {
      ordered = std::max(ordered, epoch);
      return;
    }
  record.waited_by.emplace_back(waiting, epoch);
}

std::size_t resource_state::largest_free_locked() const noexcept {
  std::uint64_t largest = 0;
  for (std::size_t i = 0; i < arena_count_.load(); ++i)
    largest = std::max(largest, arenas_[i].load()->released().largest());
  return static_cast<std::size_t>(largest);
}

memory_resource_statistics resource_state::statistics() const {
  all_locked locked(*this);
  memory_resource_statistics s;
  s.reserved_current = reserved_bytes();
  s.reserved_high = reserved_high_;
  s.reserved_small_pages = reserved_bytes(0);
  s.reserved_large_pages = reserved_bytes(1);
  s.used_current = used_.load();
  s.used_high = used_high_.load();
  for (std::size_t i = 0; i < arena_count_.load(); ++i) {
    const arena& a = *arenas_[i].load();
    s.allocations += a.allocated_count();
    s.allocations_total += a.allocations_made;
  }
  s.segments = arena_count_.load();
  s.handles = mapped_pages_[0] + mapped_pages_[1] + spare_[0].size() + spare_[1].size();
  s.largest_free_block = largest_free_locked();
  s.pages_stitched = pages_stitched_;
  s.pages_created = pages_created_;
  s.pages_released = pages_released_;
  s.host_waits = host_waits_;
  s.slow_path_time = slow_path_time_;
  s.host_wait_time = host_wait_time_;
  s.host_copy_bytes = saved_ ? saved_->size() : 0;
  s.bad_deallocations = bad_deallocations_.load();
  return s;
}

memory_resource::allocation_pages resource_state::pages_of(const void* ptr, std::size_t bytes) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const std::size_t count = arena_count_.load();
  for (std::size_t i = 0; i < count; ++i) {
    arena& a = *arenas_[i].load();
    if (!a.contains(address)) continue;
    std::lock_guard lock(a.mutex);
    const block* b = a.allocated_at(address - a.base());
    if (b == nullptr || b->cached || b->size - b->slack != bytes)
      throw invalid_argument(
          fmt::format("memory_resource: {:#x} ({} bytes) is not a live allocation of "
                      "this resource",
                      address, bytes));
    const auto [first, pages] = a.page_span(b->offset, b->size);
    memory_resource::allocation_pages result{i, a.base(), a.size(), first, a.page_size(), {}};
    for (std::size_t p = first; p < first + pages; ++p) result.pages.push_back(a.chunk(p));
    return result;
  }
  throw invalid_argument(fmt::format("memory_resource: {:#x} is not this resource's", address));
}

memory_registration resource_state::register_memory(void* ptr, std::size_t bytes,
                                                    std::shared_ptr<memory_registrar> registrar) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  if (registrar == nullptr) throw invalid_argument("memory_resource: register_memory with a null registrar");
  all_locked locked(*this);
  if (asleep_.load())
    throw invalid_argument("memory_resource: register_memory while the resource is asleep (wake() it first)");
  arena* a = arena_containing(address);
  const block* b = a == nullptr ? nullptr : a->allocated_at(address - a->base());
  if (b == nullptr || b->cached || bytes == 0 || bytes > b->size - b->slack)
    throw invalid_argument(fmt::format(
        "memory_resource: register_memory of {:#x} ({} bytes): not the start of a live allocation "
        "of this resource of at least that many bytes",
        address, bytes));
  return registrations_->add(address, bytes, b->tag, std::move(registrar));
}

void resource_state::reset_high_water_marks() {
  std::lock_guard lock(mutex_);
  reserved_high_ = reserved_bytes();
  used_high_.store(used_.load());
}

}  // namespace detail

// ---- the public class ---------------------------------------------------------------------

namespace {

std::shared_ptr<chunk_pool> require(std::shared_ptr<chunk_pool> pool) {
  if (pool == nullptr) throw invalid_argument("memory_resource: the pool is null");
  return pool;
}

}  // namespace

memory_resource::memory_resource(location where, memory_resource_properties properties,
                                 reuse_policies policies)
    : memory_resource(default_pool(where), properties, policies) {}

memory_resource::memory_resource(std::shared_ptr<chunk_pool> pool, memory_resource_properties properties,
                                 reuse_policies policies)
    : state_(std::make_unique<detail::resource_state>(require(std::move(pool)), properties, policies)) {}

memory_resource::~memory_resource() = default;

void* memory_resource::allocate(stream_ref stream, std::size_t bytes, std::size_t alignment) {
  return state_->allocate(stream, bytes, alignment, false);
}

void memory_resource::deallocate(stream_ref stream, void* ptr, std::size_t bytes,
                                 std::size_t alignment) noexcept {
  state_->deallocate(stream, ptr, bytes, alignment, false);
}

void* memory_resource::allocate(stream_ref stream, std::size_t bytes, std::size_t alignment,
                                allocation_tag tag) {
  return state_->allocate(stream, bytes, alignment, false, tag.value);
}

memory_registration memory_resource::register_memory(void* ptr, std::size_t bytes,
                                                     std::shared_ptr<memory_registrar> registrar) {
  return state_->register_memory(ptr, bytes, std::move(registrar));
}

void memory_resource::sleep(std::span<const allocation_tag> offload, stream_ref stream) {
  state_->sleep(offload, stream);
}
void memory_resource::wake(std::span<const allocation_tag> tags, stream_ref stream, after_wake then) {
  state_->wake(tags, stream, then);
}
bool memory_resource::asleep() const noexcept {
  return state_->asleep();
}

void* memory_resource::allocate_sync(std::size_t bytes, std::size_t alignment) {
  return state_->allocate({}, bytes, alignment, true);
}

void memory_resource::deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
  state_->deallocate({}, ptr, bytes, alignment, true);
}

void memory_resource::trim_to(std::size_t bytes_to_keep) {
  state_->trim_to(bytes_to_keep);
}
void memory_resource::synchronize() {
  state_->synchronize();
}
void memory_resource::set_release_threshold(std::size_t bytes) {
  state_->set_release_threshold(bytes);
}
void memory_resource::set_access(std::span<const access_grant> grants) {
  state_->set_access(grants);
}
access_mode memory_resource::access(const accessor& who) const {
  return state_->access(who);
}
void memory_resource::wait_for(stream_ref waiting, stream_ref freeing) {
  state_->wait_for(waiting, freeing);
}
memory_resource_statistics memory_resource::statistics() const {
  return state_->statistics();
}
memory_resource::allocation_pages memory_resource::pages_of(const void* ptr, std::size_t bytes) const {
  return state_->pages_of(ptr, bytes);
}
void memory_resource::reset_high_water_marks() {
  state_->reset_high_water_marks();
}
const memory_resource_properties& memory_resource::properties() const noexcept {
  return state_->properties();
}
const reuse_policies& memory_resource::policies() const noexcept {
  return state_->policies();
}
const std::shared_ptr<memory_provider>& memory_resource::provider() const noexcept {
  return state_->provider();
}
const std::shared_ptr<chunk_pool>& memory_resource::pool() const noexcept {
  return state_->pool();
}
bool memory_resource::owns(const void* ptr) const noexcept {
  return state_->owns(ptr);
}

}  // namespace vmm
