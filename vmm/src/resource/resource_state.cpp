// The memory resource's state: the parts composed (resource_state.hpp), the checks of each
// call, and the slow path that runs the parts in turn under every lock.

#include "resource/resource_state.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "vmm/detail/cleanup.hpp"
#include "resource/timed_into.hpp"
#include "vmm/detail/retirement.hpp"
#include "vmm/error.hpp"

namespace vmm {
namespace detail {
namespace {

constexpr std::uint64_t unit = std::uint64_t{1} << free_index::unit_shift;
constexpr std::uint32_t frees_per_point = 32;  // frees on a stream between points
// Requests of at least this many large pages get large pages.
constexpr std::uint64_t large_page_factor = 2;
constexpr std::uint64_t largest_request = std::uint64_t{1} << 48;

// std::has_single_bit is a popcount, a library call where the target lacks the instruction.
constexpr bool power_of_two(std::size_t x) noexcept {
  return x != 0 && (x & (x - 1)) == 0;
}

std::uint64_t round_to_unit(std::size_t bytes) {
  return (std::uint64_t{bytes} + unit - 1) & ~(unit - 1);
}

// The properties with their defaults filled in (max_size, large_page_size, headroom), or
// invalid_argument naming what `pool` cannot give.
memory_resource_properties checked(const chunk_pool& pool, memory_resource_properties properties) {
  const std::size_t page = pool.granularity();
  const std::size_t large_page = properties.large_page_size != 0 ? properties.large_page_size
                                 : properties.handle_type == handle_kind::none
                                     ? page * memory_resource::default_large_page_granules
                                     : page;
  const provider_capabilities& offered = pool.provider()->capabilities();
  if (properties.handle_type == handle_kind::fabric && offered.export_kind != handle_kind::fabric)
    throw invalid_argument(fmt::format("memory_resource: {} memory has no fabric handles here: {}",
                                       to_string(offered.where), offered.fabric_unavailable_reason));
  if (properties.handle_type == handle_kind::posix_fd && offered.export_kind == handle_kind::none)
    throw invalid_argument(
        fmt::format("memory_resource: {} memory cannot be exported, so handle_type "
                    "posix_fd cannot be had",
                    to_string(offered.where)));
  if (properties.max_size == 0) properties.max_size = offered.physical_memory_size;
  properties.max_size = round_up(properties.max_size, page);
  if (large_page < page || large_page > memory_resource::largest_large_page_size || large_page % page != 0 ||
      !power_of_two(large_page / page))
    throw invalid_argument(
        fmt::format("memory_resource: large_page_size {} is not the granularity {} times a power of two "
                    "of at most {} bytes",
                    large_page, page, memory_resource::largest_large_page_size));
  properties.large_page_size = large_page;
  if (!(properties.headroom >= 0 && properties.headroom <= 1))  // NaN too
    throw invalid_argument(
        fmt::format("memory_resource: headroom {} is not a share from 0 to 1", properties.headroom));
  if (properties.headroom == 0) properties.headroom = large_page == page ? 1.0 / 8 : 1.0 / 128;
  return properties;
}

}  // namespace

resource_state::all_locked::all_locked(const resource_state& state) : resource_(state.mutex_) {
  const std::size_t count = state.arenas_.count();
  arenas_.reserve(count);
  for (std::size_t i = 0; i < count; ++i) arenas_.emplace_back(state.arenas_.at(i).mutex);
  // Whatever runs under every lock sees each free block and idle page as it is: none cached.
  for (std::size_t i = 0; i < count; ++i)
    state.arenas_.at(i).flush_quick(state.policies_.allow_opportunistic);
}

resource_state::resource_state(std::shared_ptr<chunk_pool> pool, memory_resource_properties properties,
                               reuse_policies policies)
    : pool_(std::move(pool)),
      properties_(checked(*pool_, properties)),
      policies_(policies),
      page_(pool_->granularity()),
      arenas_(pool_->provider()),
      clock_(pool_->provider()->executor(), pool_->provider()->capabilities().synchronous),
      supply_(pool_, arenas_, clock_, used_, page_, properties_.large_page_size,
              {properties_.max_size, properties_.headroom, properties_.release_threshold,
               policies_.allow_opportunistic},
              pool_->provider()->capabilities().grants(access_mode::read_write)),
      placement_(arenas_, clock_, supply_, policies_, page_, properties_.large_page_size,
                 properties_.large_page_size == page_
                     ? ~std::uint64_t{0}
                     : std::uint64_t{properties_.large_page_size} * large_page_factor,
                 properties_.max_size),
      sleep_wake_(arenas_, clock_, supply_, *registrations_) {
  supply_.add_spare(round_up(properties_.initial_size, page_) / page_);
}

resource_state::~resource_state() {
  if (const std::size_t registered = registrations_->close(); registered != 0)
    report_cleanup_failure(
        fmt::format("memory_resource: destroyed with {} registration(s) (memory_registration) "
                    "still live: deregistered",
                    registered)
            .c_str());
  // The host copies (asleep, or kept by the last wake) go back to the system now.
  sleep_wake_.drop_copies();
  std::size_t live = 0;
  for (std::size_t i = 0; i < arenas_.count(); ++i) live += arenas_.at(i).allocated_count();
  if (live != 0)
    report_cleanup_failure(fmt::format("memory_resource: destroyed with {} allocation(s) still live "
                                       "({} bytes): their memory is unmapped once the streams pass",
                                       live, used_.current())
                               .c_str());
  // Work queued on any stream may still use the pages: unmap them once it has passed.
  std::vector<stream_event> passed = clock_.points_to_retire_after();
  struct everything {
    std::vector<std::unique_ptr<arena>> arenas;
    std::array<std::vector<shared_chunk>, 2> spare;
  };
  std::shared_ptr<void> held;
  try {
    held = std::make_shared<everything>(everything{arenas_.take_all(), supply_.take_spare()});
  } catch (...) {
    for (const stream_event& point : passed)
      cleanup("memory_resource: waiting", [&] { point.synchronize(); });
    return;  // the members unmap now
  }
  retire(std::move(passed), std::move(held));
}

// ---- allocation ---------------------------------------------------------------------------

resource_state::stream_entry& resource_state::entry_of(stream_ref stream, bool sync) {
  if (stream_entry* e = placement_.find(stream, sync); e != nullptr) return *e;
  std::lock_guard lock(mutex_);
  return placement_.add_entry(stream, sync);
}

void* resource_state::allocate(stream_ref stream, std::size_t bytes, std::size_t alignment, bool sync,
                               std::uint32_t tag) {
  if (sleep_wake_.asleep())
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
  const std::size_t kind = placement_.kind_of(size);
  const auto slack = static_cast<std::uint8_t>(size - bytes);
  void* p = placement_.try_mapped(*entry.arenas[kind].back(), sync ? nullptr : entry.record, size, align, tag,
                                  slack);
  if (p == nullptr) p = slow_allocate(entry, size, align, sync, bytes, tag);
  used_.add(size);
  return p;
}

void* resource_state::slow_allocate(stream_entry& entry, std::uint64_t size, std::uint64_t alignment,
                                    bool sync, std::size_t requested, std::uint32_t tag) {
  const std::size_t kind = placement_.kind_of(size);
  const auto start = std::chrono::steady_clock::now();  // the wait for the lock counts
  all_locked locked(*this);
  const timed_into timer(slow_path_time_, start);
  void* p = slow_allocate_locked(entry, kind, size, alignment, sync, requested);
  arena& a = *arenas_.containing(reinterpret_cast<std::uintptr_t>(p));
  block* b = a.allocated_at(reinterpret_cast<std::uintptr_t>(p) - a.base());
  b->tag = tag;
  b->slack = static_cast<std::uint8_t>(size - requested);
  ++a.allocations_made;
  return p;
}

void* resource_state::slow_allocate_locked(stream_entry& entry, std::size_t kind, std::uint64_t size,
                                           std::uint64_t alignment, bool sync, std::size_t requested) {
  stream_record* const caller = sync ? nullptr : entry.record;
  used_.set_request(size);
  supply_.set_caller(caller);
  struct forget {
    usage& used;
    page_supply& supply;
    ~forget() {
      used.set_request(0);
      supply.set_caller(nullptr);
    }
  } forget_request{used_, supply_};
  // The bytes live blocks hold and this request cannot share: past max_size, no way of
  // placing it can succeed, and none is tried (a new address range would stay behind).
  if (used_.current() + size > properties_.max_size)
    refuse_request(
        requested, size,
        fmt::format("max_size of {} bytes reached ({} in use)", properties_.max_size, used_.current()));
  std::string shortage;  // the last option's out-of-memory, for the message
  for (int attempt = 0; attempt < 2; ++attempt) {
    // The points that have passed make blocks free for every stream.
    refresh_points(caller, attempt > 0);
    supply_.unmap_passed_retiring(attempt > 0);
    if (void* p = placement_.place_slow(entry, kind, size, alignment, sync, shortage)) return p;
    // Out of memory: wait for what was retired in stream order and for every stream's
    // recorded points, then once more.
    if (attempt == 0) collect_retired(true);
  }
  refuse_request(requested, size, shortage);
}

void resource_state::refresh_points(stream_record* caller, bool wait) {
  if (clock_.synchronous()) return;
  clock_.refresh(caller, wait);
  placement_.release_passed();
}

void resource_state::refuse_request(std::size_t requested, std::uint64_t size, const std::string& why) const {
  throw out_of_memory(fmt::format(
      "memory_resource on {}: {} bytes requested ({} with rounding), {} reserved, {} in use, the largest "
      "free run of addresses is {} bytes{}{}",
      to_string(provider()->capabilities().where), requested, size, supply_.reserved_bytes(), used_.current(),
      static_cast<std::size_t>(arenas_.largest_released()), why.empty() ? "" : ": ", why));
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
  arena* a = arenas_.containing(address);
  if (a == nullptr) return refuse("the pointer is not one of this resource's");
  if (sleep_wake_.asleep()) return refuse("the resource is asleep (wake() it first)");
  if (!power_of_two(alignment)) return refuse(fmt::format("alignment {} is not a power of two", alignment));
  bool over = false;
  cleanup("memory_resource: deallocate", [&] {
    stream_entry* entry = (sync || clock_.synchronous()) ? nullptr : &entry_of(stream, false);
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
    const bool quick = size < placement::small_limit;
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
            clock_.record_point(record);
        }
        // What has passed on this stream is free for every stream now, in this arena.
        if (policies_.allow_opportunistic) (void)a->release_pending(slot, record.passed.load());
      }
    }
    used_.remove(size);
    over = supply_.over_threshold();
  });
  if (over)
    cleanup("memory_resource: release threshold", [&] {
      all_locked locked(*this);
      release_idle(properties_.release_threshold);
    });
}

// ---- giving memory back -------------------------------------------------------------------

// ---- giving memory back -------------------------------------------------------------------

void resource_state::release_idle(std::size_t bytes_to_keep) {
  refresh_points(nullptr, false);
  supply_.give_back(bytes_to_keep);
}

void resource_state::trim_to(std::size_t bytes_to_keep) {
  all_locked locked(*this);
  release_idle(bytes_to_keep);
  sleep_wake_.drop_kept_copies();  // host copies kept by the last wake
}

void resource_state::synchronize() {
  all_locked locked(*this);
  clock_.synchronize();
  arenas_.release_passed();
}

void resource_state::set_release_threshold(std::size_t bytes) {
  all_locked locked(*this);
  properties_.release_threshold = bytes;
  supply_.set_release_threshold(bytes);
  release_idle(bytes);
}

// ---- sleep and wake -----------------------------------------------------------------------

void resource_state::sleep(std::span<const allocation_tag> offload, stream_ref stream) {
  all_locked locked(*this);
  sleep_wake_.prepare_sleep();
  // Stream order, not a device-wide synchronize: the copies are queued on `stream` after
  // the work queued there, and the pages go once `stream` has passed them.
  refresh_points(nullptr, false);
  sleep_wake_.sleep(offload, stream);
}

void resource_state::wake(std::span<const allocation_tag> tags, stream_ref stream, after_wake then) {
  all_locked locked(*this);
  sleep_wake_.wake(tags, stream, then);
}

// ---- access, dependencies, statistics -----------------------------------------------------

void resource_state::set_access(std::span<const access_grant> grants) {
  if (grants.empty()) throw invalid_argument("memory_resource: set_access with no grants");
  all_locked locked(*this);
  supply_.set_access(std::vector<access_grant>(grants.begin(), grants.end()));
}

access_mode resource_state::access(const accessor& who) const {
  std::lock_guard lock(mutex_);
  for (const access_grant& grant : supply_.grants())
    if (grant.who == who) return grant.mode;
  return access_mode::none;
}

void resource_state::wait_for(stream_ref waiting, stream_ref freeing) {
  if (clock_.synchronous()) return;
  clock_.order_after(waiting, *entry_of(freeing, false).record);
}

memory_resource_statistics resource_state::statistics() const {
  all_locked locked(*this);
  memory_resource_statistics s;
  s.reserved_current = supply_.reserved_bytes();
  s.reserved_high = supply_.reserved_high();
  s.reserved_small_pages = supply_.reserved_bytes(0);
  s.reserved_large_pages = supply_.reserved_bytes(1);
  s.used_current = used_.current();
  s.used_high = used_.high();
  for (std::size_t i = 0; i < arenas_.count(); ++i) {
    const arena& a = arenas_.at(i);
    s.allocations += a.allocated_count();
    s.allocations_total += a.allocations_made;
  }
  s.segments = arenas_.count();
  s.handles = supply_.handles();
  s.largest_free_block = static_cast<std::size_t>(arenas_.largest_released());
  s.pages_stitched = supply_.page_counts().stitched;
  s.pages_created = supply_.page_counts().created;
  s.pages_released = supply_.page_counts().released;
  s.host_waits = clock_.host_waits();
  s.slow_path_time = slow_path_time_;
  s.host_wait_time = clock_.host_wait_time();
  s.host_copy_bytes = sleep_wake_.host_copy_bytes();
  s.bad_deallocations = bad_deallocations_.load();
  return s;
}

memory_resource::allocation_pages resource_state::pages_of(const void* ptr, std::size_t bytes) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const std::size_t count = arenas_.count();
  for (std::size_t i = 0; i < count; ++i) {
    arena& a = arenas_.at(i);
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
  if (sleep_wake_.asleep())
    throw invalid_argument("memory_resource: register_memory while the resource is asleep (wake() it first)");
  arena* a = arenas_.containing(address);
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
  supply_.reset_reserved_high();
  used_.reset_high();
}

}  // namespace detail
}  // namespace vmm
