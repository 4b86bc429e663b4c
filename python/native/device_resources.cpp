// One vmm::memory_resource per device (device_resources.hpp).
//
// Design. The resources live in a table indexed by device, made on first use under the
// device's mutex and never destroyed: PyTorch and CuPy free tensors while the interpreter
// shuts down, after static destructors may have run, so a resource must outlive them all
// (the CUDA address space of vmm is kept the same way). Allocation and free on the fast
// path touch only the table, the calling thread's tag and the resource, whose own locks
// are per arena.
//
// The gate. Sleep and wake must not run while an allocation or a free is inside the
// resource on another thread (a free that lands after the sleep would be refused and its
// allocation kept forever). Each device counts the calls inside its resource (in_flight)
// and has a flag (gated). A call increments the count, then reads the flag; sleep sets the
// flag, then waits for the count to reach zero. With sequentially consistent operations on
// both, either the call sees the flag, or sleep sees the call (the store-load pattern of
// Dekker's algorithm), so no call is inside the resource once sleep starts. A call that
// sees the flag backs out and takes the device's mutex, which sleep and wake hold
// throughout: it runs after them, allocates or frees normally when the resource is awake,
// and while it sleeps an allocation fails with the reason and a free is kept for the wake
// that wakes every tag. The fast path costs two atomic operations.

#include "device_resources.hpp"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "conf.hpp"
#include "last_error.hpp"
#include "receiver_leases.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/location.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/provider.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm_python {
namespace {

struct device_state {
  std::atomic<vmm::memory_resource*> resource{nullptr};
  std::atomic<int> in_flight{0};
  std::atomic<bool> gated{false};
  std::mutex mutex;  // making the resource, sleep, wake, the gated path, deferred
  std::vector<pending_free> deferred;
  receiver_leases leases;  // frees held while other processes map the memory
  std::atomic<std::uint64_t> out_of_memory{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> frees_deferred{0};
};

struct library_state {
  std::array<device_state, max_devices> devices;
  std::mutex settings_mutex;  // the settings below, and making any resource
  bool host_memory = false;
  bool any_made = false;
  resource_settings settings;
  std::atomic<vmm::cleanup_failure_handler> previous_handler{nullptr};
};

// Never destroyed (see the file comment).
library_state& library() {
  static auto* const state = new library_state();
  return *state;
}

thread_local std::uint32_t thread_tag = 0;

// The history (record_history). `recording` is read on every allocation and free without
// the mutex: only a recording process pays for the lock.
struct history_book {
  std::atomic<bool> recording{false};
  std::mutex mutex;
  std::deque<history_event> events;
  std::size_t max_entries = 0;
  history_context_hook hook = nullptr;
};

history_book& book() {
  static auto* const kept = new history_book();  // never destroyed, as the resources
  return *kept;
}

void record(bool allocate, int device, std::uintptr_t ptr, std::size_t size, CUstream_st* stream) noexcept {
  history_book& history = book();
  if (!history.recording.load(std::memory_order_relaxed)) return;
  try {
    history_event event;
    event.allocate = allocate;
    event.device = device;
    event.tag = thread_tag;
    event.ptr = ptr;
    event.size = size;
    event.stream = reinterpret_cast<std::uintptr_t>(stream);
    event.time_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                   std::chrono::system_clock::now().time_since_epoch())
                                                   .count());
    std::lock_guard lock(history.mutex);
    if (!history.recording.load(std::memory_order_relaxed)) return;
    if (history.hook != nullptr) event.context = history.hook();
    if (history.events.size() == history.max_entries) history.events.pop_front();
    history.events.push_back(std::move(event));
  } catch (...) {
    // No memory for the event: the history misses it, the allocation or free stands.
  }
}

// vmm reports what its noexcept paths could not do (a refused free, say) through this
// handler: the message is kept (last_error.hpp) and passed on.
void keep_cleanup_failure(const char* what) noexcept {
  keep_last_error(what);
  const vmm::cleanup_failure_handler previous = library().previous_handler.load();
  if (previous != nullptr) {
    previous(what);
  } else {
    std::fprintf(stderr, "vmm: %s\n", what);
  }
}

device_state& device_at(int device) {
  if (device < 0 || device >= max_devices)
    throw vmm::invalid_argument(fmt::format("device {} is out of range [0, {})", device, max_devices));
  return library().devices[static_cast<std::size_t>(device)];
}

vmm::memory_resource& resource_of(int device, device_state& state) {
  if (vmm::memory_resource* made = state.resource.load(std::memory_order_acquire)) return *made;
  std::lock_guard lock(state.mutex);
  if (vmm::memory_resource* made = state.resource.load(std::memory_order_acquire)) return *made;
  library_state& shared = library();
  std::lock_guard settings(shared.settings_mutex);
  const vmm::location where = shared.host_memory ? vmm::location::os_host() : vmm::location::device(device);
  const std::shared_ptr<vmm::memory_provider> provider = vmm::provider_for(where);
  vmm::memory_resource_properties properties;
  properties.max_size = shared.settings.max_size;
  properties.release_threshold = shared.settings.release_threshold;
  properties.headroom = shared.settings.headroom;
  // Exportable pages where the memory allows it: NCCL registration and vmm::ipc need them.
  // The driver provider already creates every GPU chunk with POSIX-fd handles when the
  // device supports them; this states it, and checks it.
  properties.handle_type = provider->capabilities().export_kind == vmm::handle_kind::none
                               ? vmm::handle_kind::none
                               : vmm::handle_kind::posix_fd;
  // Large pages for large tensors, exportable or not: training with changing shapes moves
  // their memory every step (docs/GPU-FACTS.md, "Fragmentation of live training"). vmm::ipc's
  // pointer export (resource_exporter) refuses such a resource; exporting the pages under
  // an allocation (pages_of, vmm::ipc::exporter) works.
  properties.large_page_size =
      shared.settings.large_page_size != 0
          ? shared.settings.large_page_size
          : provider->capabilities().granularity * vmm::memory_resource::default_large_page_granules;
  auto* made = new vmm::memory_resource(where, properties);  // never destroyed
  if (!shared.any_made)
    shared.previous_handler.store(vmm::set_cleanup_failure_handler(&keep_cleanup_failure));
  shared.any_made = true;
  state.resource.store(made, std::memory_order_release);
  return *made;
}

// A call inside a device's resource, counted while it lasts (see the gate, file comment).
class gate_pass {
 public:
  explicit gate_pass(device_state& state) noexcept : state_(state) {
    state_.in_flight.fetch_add(1);
    open_ = !state_.gated.load();
    if (!open_) state_.in_flight.fetch_sub(1);
  }
  gate_pass(const gate_pass&) = delete;
  gate_pass& operator=(const gate_pass&) = delete;
  ~gate_pass() {
    if (open_) state_.in_flight.fetch_sub(1);
  }
  [[nodiscard]] bool open() const noexcept { return open_; }

 private:
  device_state& state_;
  bool open_ = false;
};

// Closes a device's gate for a sleep: waits until no call is inside the resource, and
// opens it again unless keep_closed() (the sleep succeeded). Held with the device's mutex.
class gate_closed {
 public:
  explicit gate_closed(device_state& state) noexcept : state_(state) {
    state_.gated.store(true);
    // Calls inside the resource return within microseconds (an allocation that maps pages
    // takes the longest): yielding until they have is cheaper than any signalling.
    while (state_.in_flight.load() != 0) std::this_thread::yield();
  }
  gate_closed(const gate_closed&) = delete;
  gate_closed& operator=(const gate_closed&) = delete;
  ~gate_closed() {
    if (!keep_) state_.gated.store(false);
  }
  void keep_closed() noexcept { keep_ = true; }

 private:
  device_state& state_;
  bool keep_ = false;
};

void* allocate_uncounted(std::size_t size, int device, device_state& state, CUstream_st* stream) {
  vmm::memory_resource& resource = resource_of(device, state);
  const vmm::allocation_tag tag{thread_tag};
  {
    gate_pass pass(state);
    if (pass.open())
      return resource.allocate(vmm::stream_ref(stream), size, vmm::memory_resource::default_alignment, tag);
  }
  std::lock_guard lock(state.mutex);
  if (resource.asleep())
    throw vmm::invalid_argument(
        fmt::format("the allocator of {} is asleep: wake it first (vmm.torch.wake()); nothing was allocated",
                    name_of(device)));
  return resource.allocate(vmm::stream_ref(stream), size, vmm::memory_resource::default_alignment, tag);
}

std::vector<vmm::allocation_tag> tags_of(std::span<const std::uint32_t> tags) {
  std::vector<vmm::allocation_tag> result;
  result.reserve(tags.size());
  for (const std::uint32_t tag : tags) result.push_back(vmm::allocation_tag{tag});
  return result;
}

// A free through the gate (see the file comment): kept for the wake while the resource sleeps.
void free_now(device_state& state, vmm::memory_resource& resource, const pending_free& free) {
  {
    gate_pass pass(state);
    if (pass.open()) {
      resource.deallocate(free.stream, free.ptr, free.size);
      return;
    }
  }
  std::lock_guard lock(state.mutex);
  if (resource.asleep()) {
    state.deferred.push_back(free);
    state.frees_deferred.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  resource.deallocate(free.stream, free.ptr, free.size);
}

// The frees held for receivers whose receivers have all let go (receiver_leases.hpp).
void finish_released_frees(device_state& state) {
  if (!state.leases.any()) return;
  vmm::memory_resource* resource = state.resource.load(std::memory_order_acquire);
  if (resource == nullptr) return;
  for (const pending_free& free : state.leases.released()) free_now(state, *resource, free);
}

}  // namespace

void* allocate(std::size_t size, int device, CUstream_st* stream) {
  device_state& state = device_at(device);
  if (size == 0) return nullptr;
  finish_released_frees(state);
  try {
    void* ptr = allocate_uncounted(size, device, state, stream);
    record(true, device, reinterpret_cast<std::uintptr_t>(ptr), size, stream);
    return ptr;
  } catch (const std::bad_alloc&) {
    state.out_of_memory.fetch_add(1, std::memory_order_relaxed);
    throw;
  } catch (...) {
    state.failed.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
}

void deallocate(void* ptr, std::size_t size, int device, CUstream_st* stream) {
  if (ptr == nullptr) return;
  device_state& state = device_at(device);
  vmm::memory_resource* resource = state.resource.load(std::memory_order_acquire);
  if (resource == nullptr)
    throw vmm::invalid_argument("the device has no vmm resource, so the pointer is not vmm's; nothing freed");
  // A pointer that is not the resource's is refused by deallocate (and counted), not recorded.
  if (book().recording.load(std::memory_order_relaxed) && resource->owns(ptr))
    record(false, device, reinterpret_cast<std::uintptr_t>(ptr), size, stream);
  const pending_free free{ptr, size, vmm::stream_ref(stream)};
  if (state.leases.any() && state.leases.hold(free)) return;
  free_now(state, *resource, free);
  finish_released_frees(state);
}

void configure(const resource_settings& settings) {
  library_state& state = library();
  std::lock_guard lock(state.settings_mutex);
  if (!(settings.headroom >= 0 && settings.headroom <= 1))  // NaN too
    throw vmm::invalid_argument(fmt::format("headroom {} is not a share from 0 to 1", settings.headroom));
  check_large_page_size(settings.large_page_size, "configure");
  if (state.any_made)
    throw vmm::invalid_argument("a resource exists already; configure before the first allocation");
  state.settings = settings;
}

void use_host_memory() {
  library_state& state = library();
  std::lock_guard lock(state.settings_mutex);
  if (state.any_made) throw vmm::invalid_argument("a resource exists already");
  state.host_memory = true;
}

bool uses_host_memory() noexcept {
  library_state& state = library();
  std::lock_guard lock(state.settings_mutex);
  return state.host_memory;
}

std::uint32_t set_tag(std::uint32_t tag) noexcept {
  const std::uint32_t previous = thread_tag;
  thread_tag = tag;
  return previous;
}

std::uint32_t current_tag() noexcept {
  return thread_tag;
}

vmm_torch_statistics statistics_of(int device) {
  device_state& state = device_at(device);
  vmm::memory_resource& resource = resource_of(device, state);
  finish_released_frees(state);
  const vmm::memory_resource_statistics s = resource.statistics();
  vmm_torch_statistics out{};
  out.reserved_current = s.reserved_current;
  out.reserved_high = s.reserved_high;
  out.used_current = s.used_current;
  out.used_high = s.used_high;
  out.allocations = s.allocations;
  out.allocations_total = s.allocations_total;
  out.segments = s.segments;
  out.handles = s.handles;
  out.largest_free_block = s.largest_free_block;
  out.pages_stitched = s.pages_stitched;
  out.host_waits = s.host_waits;
  out.slow_path_ns = static_cast<std::uint64_t>(s.slow_path_time.count());
  out.host_wait_ns = static_cast<std::uint64_t>(s.host_wait_time.count());
  out.pages_created = s.pages_created;
  out.pages_released = s.pages_released;
  out.bad_deallocations = s.bad_deallocations;
  out.out_of_memory = state.out_of_memory.load(std::memory_order_relaxed);
  out.failed = state.failed.load(std::memory_order_relaxed);
  out.frees_deferred = state.frees_deferred.load(std::memory_order_relaxed);
  out.host_copy_bytes = s.host_copy_bytes;
  out.page_size = resource.pool()->granularity();
  out.asleep = resource.asleep() ? 1U : 0U;
  out.exportable = resource.properties().handle_type == vmm::handle_kind::none ? 0U : 1U;
  return out;
}

void reset_peak(int device) {
  device_state& state = device_at(device);
  resource_of(device, state).reset_high_water_marks();
}

void trim(int device, std::size_t bytes_to_keep) {
  device_state& state = device_at(device);
  vmm::memory_resource& resource = resource_of(device, state);
  finish_released_frees(state);
  // As torch.cuda.empty_cache(): what was freed on any stream has passed once the device
  // is idle, and its pages can go.
  resource.synchronize();
  resource.trim_to(bytes_to_keep);
  resource.pool()->trim_to(0);
}

void sleep(int device, std::span<const std::uint32_t> offload) {
  const std::vector<vmm::allocation_tag> offload_tags = tags_of(offload);
  device_state& state = device_at(device);
  vmm::memory_resource& resource = resource_of(device, state);
  std::lock_guard lock(state.mutex);
  if (resource.asleep())
    throw vmm::invalid_argument("it is asleep already: wake it first (vmm.torch.wake()); nothing changed");
  gate_closed gate(state);
  resource.sleep(offload_tags);
  gate.keep_closed();
}

void wake(int device, std::span<const std::uint32_t> tags, bool keep_host_copies) {
  const std::vector<vmm::allocation_tag> waking = tags_of(tags);
  device_state& state = device_at(device);
  vmm::memory_resource* resource = state.resource.load(std::memory_order_acquire);
  std::lock_guard lock(state.mutex);
  if (resource == nullptr || !resource->asleep())
    throw vmm::invalid_argument(
        "it is not asleep: nothing to wake (vmm.torch.sleep() first); nothing changed");
  resource->wake(
      waking, {},
      keep_host_copies ? vmm::after_wake::keep_host_copies : vmm::after_wake::give_back_host_copies);
  if (resource->asleep()) return;  // some tags still sleep
  // Every tag is awake: the frees that arrived meanwhile, in the order they came.
  for (const pending_free& free : state.deferred) resource->deallocate(free.stream, free.ptr, free.size);
  state.deferred.clear();
  state.gated.store(false);
}

bool asleep(int device) noexcept {
  if (device < 0 || device >= max_devices) return false;
  const vmm::memory_resource* resource =
      library().devices[static_cast<std::size_t>(device)].resource.load(std::memory_order_acquire);
  return resource != nullptr && resource->asleep();
}

std::vector<int> devices() {
  std::vector<int> result;
  for (int device = 0; device < max_devices; ++device) {
    if (library().devices[static_cast<std::size_t>(device)].resource.load(std::memory_order_acquire) !=
        nullptr)
      result.push_back(device);
  }
  return result;
}

vmm::memory_resource::allocation_pages pages_of(int device, const void* ptr, std::size_t bytes) {
  const vmm::memory_resource* resource = device_at(device).resource.load(std::memory_order_acquire);
  if (resource == nullptr)
    throw vmm::invalid_argument(
        fmt::format("{} has no vmm resource, so {} is not vmm's", name_of(device), ptr));
  return resource->pages_of(ptr, bytes);
}

vmm::unique_fd lease_allocation(int device, const void* ptr, std::size_t bytes) {
  (void)pages_of(device, ptr, bytes);  // refuses what is not a live allocation of `bytes`
  return device_at(device).leases.lease(ptr);
}

held_frees held_for_receivers(int device) {
  device_state& state = device_at(device);
  finish_released_frees(state);
  const receiver_leases::held_figures figures = state.leases.held();
  return {figures.frees, figures.bytes};
}

bool owns(int device, const void* ptr) noexcept {
  if (device < 0 || device >= max_devices) return false;
  const vmm::memory_resource* resource =
      library().devices[static_cast<std::size_t>(device)].resource.load(std::memory_order_acquire);
  return resource != nullptr && resource->owns(ptr);
}

void record_history(bool enabled, std::size_t max_entries, history_context_hook hook) {
  history_book& history = book();
  std::lock_guard lock(history.mutex);
  if (!enabled) {
    history.recording.store(false);
    return;
  }
  if (max_entries == 0) throw vmm::invalid_argument("max_entries is 0: a history keeps at least one event");
  history.events.clear();
  history.max_entries = max_entries;
  history.hook = hook;
  history.recording.store(true);
}

std::vector<history_event> history() {
  history_book& kept = book();
  std::lock_guard lock(kept.mutex);
  return {kept.events.begin(), kept.events.end()};
}

std::string name_of(int device) {
  return uses_host_memory() ? fmt::format("device {} (host memory, for tests)", device)
                            : fmt::format("gpu {}", device);
}

}  // namespace vmm_python
