// libvmm_torch_allocator.so: the C interface of vmm_torch.h over one vmm::memory_resource
// per device.
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
//
// Errors. Every entry point catches everything: no exception reaches a C caller or a
// ctypes call. vmm_alloc_throwing is the one entry point that throws on purpose, for
// PyTorch's change_current_allocator, which calls it from C++ and does not check for NULL
// (torch/csrc/cuda/CUDAPluggableAllocator.cpp, CUDAPluggableAllocator::malloc): a NULL
// there becomes a tensor at address 0 and the next kernel faults, poisoning the CUDA
// context, while an exception becomes a Python RuntimeError carrying vmm's message.

#include "vmm_torch.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/location.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/provider.hpp"
#include "vmm/stream_ref.hpp"

namespace {

constexpr int max_devices = 64;

struct deferred_free {
  void* ptr;
  std::size_t size;
  vmm::stream_ref stream;
};

struct device_state {
  std::atomic<vmm::memory_resource*> resource{nullptr};
  std::atomic<int> in_flight{0};
  std::atomic<bool> gated{false};
  std::mutex mutex;  // making the resource, sleep, wake, the gated path, deferred
  std::vector<deferred_free> deferred;
  std::atomic<std::uint64_t> out_of_memory{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> frees_deferred{0};
};

struct library_state {
  std::array<device_state, max_devices> devices;
  std::mutex settings_mutex;  // the settings below, and making any resource
  bool host_memory = false;
  bool any_made = false;
  std::size_t max_size = 0;
  std::size_t release_threshold = std::numeric_limits<std::size_t>::max();
  double headroom = 0;  // vmm::memory_resource_properties::headroom
  std::atomic<vmm::cleanup_failure_handler> previous_handler{nullptr};
  std::mutex error_mutex;
  std::string last_error;
};

// Never destroyed (see the file comment).
library_state& library() {
  static auto* const state = new library_state();
  return *state;
}

thread_local std::uint32_t current_tag = 0;

void set_last_error(const char* message) noexcept {
  try {
    library_state& state = library();
    std::lock_guard lock(state.error_mutex);
    state.last_error = message;
  } catch (...) {
    // No memory for the message: the caller's status still says that it failed.
  }
}

// vmm reports what its noexcept paths could not do (a refused free, say) through this
// handler: the message is kept for vmm_torch_last_error() and passed on.
void keep_cleanup_failure(const char* what) noexcept {
  set_last_error(what);
  const vmm::cleanup_failure_handler previous = library().previous_handler.load();
  if (previous != nullptr) {
    previous(what);
  } else {
    std::fprintf(stderr, "vmm: %s\n", what);
  }
}

enum class outcome { ok, out_of_memory, failed };

// Runs `fn`, turning any exception into a kept message (also stored in *message when
// given). `context` is called only on failure, to name what failed.
template <class Fn, class Context>
outcome guarded(Fn&& fn, Context&& context, std::string* message = nullptr) noexcept {
  const auto keep = [&](const char* what) noexcept {
    try {
      std::string text = fmt::format("{}: {}", context(), what);
      set_last_error(text.c_str());
      if (message != nullptr) *message = std::move(text);
    } catch (...) {
      set_last_error(what);
    }
  };
  try {
    fn();
    return outcome::ok;
  } catch (const std::bad_alloc& error) {
    keep(error.what());
    return outcome::out_of_memory;
  } catch (const std::exception& error) {
    keep(error.what());
    return outcome::failed;
  } catch (...) {
    keep("an unknown exception");
    return outcome::failed;
  }
}

int status_of(outcome result) noexcept {
  switch (result) {
    case outcome::ok:
      return 0;
    case outcome::out_of_memory:
      return 1;
    case outcome::failed:
      break;
  }
  return -1;
}

device_state& device_at(int device) {
  if (device < 0 || device >= max_devices)
    throw vmm::invalid_argument(
        fmt::format("vmm_torch: device {} is out of range [0, {})", device, max_devices));
  return library().devices[static_cast<std::size_t>(device)];
}

std::string name_of(int device) {
  return library().host_memory ? fmt::format("device {} (host memory, for tests)", device)
                               : fmt::format("gpu {}", device);
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
  properties.max_size = shared.max_size;
  properties.release_threshold = shared.release_threshold;
  properties.headroom = shared.headroom;
  // Exportable pages where the memory allows it: NCCL registration and vmm::ipc need them.
  // The driver provider already creates every GPU chunk with POSIX-fd handles when the
  // device supports them; this states it, and checks it.
  properties.handle_type = provider->capabilities().export_kind == vmm::handle_kind::none
                               ? vmm::handle_kind::none
                               : vmm::handle_kind::posix_fd;
  // Large pages for large tensors, exportable or not: training with changing shapes moves
  // their memory every step (docs/design/memory_resource.md, "Two page sizes"). vmm::ipc's
  // pointer export (resource_exporter) refuses such a resource; exporting the pages under
  // an allocation (pages_of, vmm::ipc::exporter) works.
  properties.large_page_size =
      provider->capabilities().granularity * vmm::memory_resource::default_large_page_granules;
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

// Throws what vmm throws, or vmm::invalid_argument while the resource sleeps.
void* allocate(std::size_t size, int device, CUstream_st* stream) {
  device_state& state = device_at(device);
  if (size == 0) return nullptr;
  vmm::memory_resource& resource = resource_of(device, state);
  const vmm::allocation_tag tag{current_tag};
  {
    gate_pass pass(state);
    if (pass.open())
      return resource.allocate(vmm::stream_ref(stream), size, vmm::memory_resource::default_alignment, tag);
  }
  std::lock_guard lock(state.mutex);
  if (resource.asleep())
    throw vmm::invalid_argument(
        fmt::format("the allocator of {} is asleep: wake it first (vmm_torch.wake()); nothing was allocated",
                    name_of(device)));
  return resource.allocate(vmm::stream_ref(stream), size, vmm::memory_resource::default_alignment, tag);
}

void count_failure(int device, outcome result) noexcept {
  if (device < 0 || device >= max_devices || result == outcome::ok) return;
  device_state& state = library().devices[static_cast<std::size_t>(device)];
  (result == outcome::out_of_memory ? state.out_of_memory : state.failed)
      .fetch_add(1, std::memory_order_relaxed);
}

std::vector<vmm::allocation_tag> tags_of(const std::uint32_t* tags, std::size_t count) {
  if (count != 0 && tags == nullptr)
    throw vmm::invalid_argument(fmt::format("vmm_torch: {} tags at NULL", count));
  std::vector<vmm::allocation_tag> result;
  result.reserve(count);
  for (std::size_t i = 0; i < count; ++i) result.push_back(vmm::allocation_tag{tags[i]});
  return result;
}

}  // namespace

extern "C" {

void* vmm_alloc(size_t size, int device, CUstream_st* stream) {
  void* result = nullptr;
  const outcome done = guarded([&] { result = allocate(size, device, stream); },
                               [&] { return fmt::format("vmm_alloc({} bytes, {})", size, name_of(device)); });
  count_failure(device, done);
  return result;
}

void* vmm_alloc_throwing(size_t size, int device, CUstream_st* stream) {
  void* result = nullptr;
  std::string message;
  const outcome done =
      guarded([&] { result = allocate(size, device, stream); },
              [&] { return fmt::format("vmm_alloc({} bytes, {})", size, name_of(device)); }, &message);
  count_failure(device, done);
  if (done == outcome::ok) return result;
  // The prefix is PyTorch's own, which code that retries with less memory looks for.
  if (done == outcome::out_of_memory) throw vmm::out_of_memory("CUDA out of memory. " + message);
  throw std::runtime_error(message);
}

void vmm_free(void* ptr, size_t size, int device, CUstream_st* stream) {
  if (ptr == nullptr) return;
  guarded(
      [&] {
        device_state& state = device_at(device);
        vmm::memory_resource* resource = state.resource.load(std::memory_order_acquire);
        if (resource == nullptr)
          throw vmm::invalid_argument(
              "the device has no vmm resource, so the pointer is not vmm's; nothing freed");
        {
          gate_pass pass(state);
          if (pass.open()) {
            resource->deallocate(vmm::stream_ref(stream), ptr, size);
            return;
          }
        }
        std::lock_guard lock(state.mutex);
        if (resource->asleep()) {
          state.deferred.push_back({ptr, size, vmm::stream_ref(stream)});
          state.frees_deferred.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        resource->deallocate(vmm::stream_ref(stream), ptr, size);
      },
      [&] { return fmt::format("vmm_free({}, {} bytes, {})", ptr, size, name_of(device)); });
}

int vmm_torch_allocate(int device, CUstream_st* stream, size_t size, void** out) {
  if (out == nullptr) {
    set_last_error("vmm_torch_allocate: out is NULL");
    return -1;
  }
  *out = nullptr;
  const outcome done =
      guarded([&] { *out = allocate(size, device, stream); },
              [&] { return fmt::format("vmm_torch_allocate({} bytes, {})", size, name_of(device)); });
  count_failure(device, done);
  return status_of(done);
}

int vmm_torch_configure(size_t max_size, size_t release_threshold, double headroom) {
  return status_of(guarded(
      [&] {
        library_state& state = library();
        std::lock_guard lock(state.settings_mutex);
        if (!(headroom >= 0 && headroom <= 1))  // NaN too
          throw vmm::invalid_argument(fmt::format("headroom {} is not a share from 0 to 1", headroom));
        if (state.any_made)
          throw vmm::invalid_argument("a resource exists already; configure before the first allocation");
        state.max_size = max_size;
        state.release_threshold = release_threshold;
        state.headroom = headroom;
      },
      [] { return std::string("vmm_torch_configure"); }));
}

uint32_t vmm_torch_set_tag(uint32_t tag) {
  const std::uint32_t previous = current_tag;
  current_tag = tag;
  return previous;
}

uint32_t vmm_torch_tag(void) {
  return current_tag;
}

int vmm_torch_statistics_of(int device, vmm_torch_statistics* out) {
  return status_of(guarded(
      [&] {
        if (out == nullptr) throw vmm::invalid_argument("out is NULL");
        device_state& state = device_at(device);
        vmm::memory_resource& resource = resource_of(device, state);
        const vmm::memory_resource_statistics s = resource.statistics();
        *out = vmm_torch_statistics{};
        out->reserved_current = s.reserved_current;
        out->reserved_high = s.reserved_high;
        out->used_current = s.used_current;
        out->used_high = s.used_high;
        out->allocations = s.allocations;
        out->allocations_total = s.allocations_total;
        out->segments = s.segments;
        out->handles = s.handles;
        out->largest_free_block = s.largest_free_block;
        out->pages_stitched = s.pages_stitched;
        out->host_waits = s.host_waits;
        out->slow_path_ns = static_cast<std::uint64_t>(s.slow_path_time.count());
        out->host_wait_ns = static_cast<std::uint64_t>(s.host_wait_time.count());
        out->pages_created = s.pages_created;
        out->pages_released = s.pages_released;
        out->bad_deallocations = s.bad_deallocations;
        out->out_of_memory = state.out_of_memory.load(std::memory_order_relaxed);
        out->failed = state.failed.load(std::memory_order_relaxed);
        out->frees_deferred = state.frees_deferred.load(std::memory_order_relaxed);
        out->host_copy_bytes = s.host_copy_bytes;
        out->page_size = resource.pool()->granularity();
        out->asleep = resource.asleep() ? 1U : 0U;
        out->exportable = resource.properties().handle_type == vmm::handle_kind::none ? 0U : 1U;
      },
      [&] { return fmt::format("vmm_torch_statistics_of({})", name_of(device)); }));
}

int vmm_torch_reset_peak(int device) {
  return status_of(guarded(
      [&] {
        device_state& state = device_at(device);
        resource_of(device, state).reset_high_water_marks();
      },
      [&] { return fmt::format("vmm_torch_reset_peak({})", name_of(device)); }));
}

int vmm_torch_trim(int device, size_t bytes_to_keep) {
  return status_of(guarded(
      [&] {
        device_state& state = device_at(device);
        vmm::memory_resource& resource = resource_of(device, state);
        // As torch.cuda.empty_cache(): what was freed on any stream has passed once the
        // device is idle, and its pages can go.
        resource.synchronize();
        resource.trim_to(bytes_to_keep);
        resource.pool()->trim_to(0);
      },
      [&] { return fmt::format("vmm_torch_trim({}, keep {} bytes)", name_of(device), bytes_to_keep); }));
}

int vmm_torch_sleep(int device, const uint32_t* offload_tags, size_t count) {
  return status_of(guarded(
      [&] {
        const std::vector<vmm::allocation_tag> offload = tags_of(offload_tags, count);
        device_state& state = device_at(device);
        vmm::memory_resource& resource = resource_of(device, state);
        std::lock_guard lock(state.mutex);
        if (resource.asleep())
          throw vmm::invalid_argument(
              "it is asleep already: wake it first (vmm_torch.wake()); nothing changed");
        gate_closed gate(state);
        resource.sleep(offload);
        gate.keep_closed();
      },
      [&] { return fmt::format("vmm_torch_sleep({})", name_of(device)); }));
}

int vmm_torch_wake(int device, const uint32_t* tags, size_t count, int keep_host_copies) {
  return status_of(guarded(
      [&] {
        const std::vector<vmm::allocation_tag> waking = tags_of(tags, count);
        device_state& state = device_at(device);
        vmm::memory_resource* resource = state.resource.load(std::memory_order_acquire);
        std::lock_guard lock(state.mutex);
        if (resource == nullptr || !resource->asleep())
          throw vmm::invalid_argument(
              "it is not asleep: nothing to wake (vmm_torch.sleep() first); nothing changed");
        resource->wake(waking, {},
                       keep_host_copies != 0 ? vmm::after_wake::keep_host_copies
                                             : vmm::after_wake::give_back_host_copies);
        if (resource->asleep()) return;  // some tags still sleep
        // Every tag is awake: the frees that arrived meanwhile, in the order they came.
        for (const deferred_free& free : state.deferred)
          resource->deallocate(free.stream, free.ptr, free.size);
        state.deferred.clear();
        state.gated.store(false);
      },
      [&] { return fmt::format("vmm_torch_wake({})", name_of(device)); }));
}

int vmm_torch_asleep(int device) {
  if (device < 0 || device >= max_devices) return 0;
  const vmm::memory_resource* resource =
      library().devices[static_cast<std::size_t>(device)].resource.load(std::memory_order_acquire);
  return resource != nullptr && resource->asleep() ? 1 : 0;
}

size_t vmm_torch_devices(int* out, size_t capacity) {
  std::size_t count = 0;
  for (int device = 0; device < max_devices; ++device) {
    if (library().devices[static_cast<std::size_t>(device)].resource.load(std::memory_order_acquire) ==
        nullptr)
      continue;
    if (out != nullptr && count < capacity) out[count] = device;
    ++count;
  }
  return count;
}

size_t vmm_torch_last_error(char* buffer, size_t size) {
  library_state& state = library();
  std::lock_guard lock(state.error_mutex);
  const std::string& message = state.last_error;
  if (buffer != nullptr && size != 0) {
    const std::size_t copied = std::min(size - 1, message.size());
    std::copy_n(message.data(), copied, buffer);
    buffer[copied] = '\0';
  }
  return message.size();
}

void vmm_torch_clear_last_error(void) {
  library_state& state = library();
  std::lock_guard lock(state.error_mutex);
  state.last_error.clear();
}

int vmm_torch_testing_use_host_memory(void) {
  return status_of(guarded(
      [] {
        library_state& state = library();
        std::lock_guard lock(state.settings_mutex);
        if (state.any_made) throw vmm::invalid_argument("a resource exists already");
        state.host_memory = true;
      },
      [] { return std::string("vmm_torch_testing_use_host_memory"); }));
}

}  // extern "C"
