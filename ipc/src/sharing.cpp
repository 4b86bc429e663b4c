// Interprocess events and fabric handles: the parts of sharing that call the driver
// directly. Memory whose executor is synchronous (host memory) has no driver to ask: its
// events are always done and named by a fixed token, and it has no fabric handles.

#include <vmm/ipc/fabric.hpp>
#include <vmm/ipc/interprocess_event.hpp>

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "driver/device.hpp"
#include "driver/driver_api.hpp"

namespace vmm::ipc {
namespace {

const std::shared_ptr<memory_provider>& require_provider(const std::shared_ptr<memory_provider>& provider,
                                                         const char* who) {
  if (provider == nullptr) throw invalid_argument(fmt::format("{}: the provider is null", who));
  return provider;
}

// The GPU whose context the memory's events and handles belong to.
int context_device(const memory_provider& provider) {
  for (const accessor& who : provider.capabilities().default_accessors)
    if (who.kind == accessor::kind_type::device) return who.device_ordinal;
  throw invalid_argument(
      fmt::format("{} memory is accessed by no GPU", to_string(provider.capabilities().where)));
}

// What a host-memory event handle holds: no process can mistake it for a GPU event's
// handle, nor open a GPU event's handle as it.
interprocess_event_handle host_event_token() noexcept {
  constexpr char text[] = "vmm host event: always passed";
  interprocess_event_handle token;
  for (std::size_t i = 0; i < sizeof text; ++i) token.bytes[i] = static_cast<std::byte>(text[i]);
  return token;
}

}  // namespace

// ---- interprocess_event -------------------------------------------------------------------

interprocess_event::interprocess_event(const std::shared_ptr<memory_provider>& provider) {
  require_provider(provider, "interprocess_event");
  executor_ = &provider->executor();
  created_ = true;
  if (provider->capabilities().synchronous) {
    handle_ = host_event_token();
    return;
  }
  const int device = context_device(*provider);
  driver::primary_context context(device);
  driver::scoped_context current(context.get());
  CUevent event = nullptr;
  VMM_DRIVER_CHECK(
      cuEventCreate,
      [&] { return fmt::format("cuEventCreate(INTERPROCESS | DISABLE_TIMING) on gpu {}", device); }, &event,
      static_cast<unsigned>(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
  CUipcEventHandle exported{};
  if (const CUresult result = driver::try_call(driver::api().cuIpcGetEventHandle, &exported, event);
      result != CUDA_SUCCESS) {
    (void)driver::try_call(driver::api().cuEventDestroy, event);
    driver::throw_error(result, fmt::format("cuIpcGetEventHandle() on gpu {}", device));
  }
  static_assert(sizeof exported == sizeof handle_.bytes);
  std::memcpy(handle_.bytes.data(), &exported, sizeof exported);
  event_ = reinterpret_cast<event_handle>(event);
}

interprocess_event::interprocess_event(stream_executor& executor, event_handle event,
                                       const interprocess_event_handle& handle, bool created) noexcept
    : executor_(&executor), event_(event), handle_(handle), created_(created) {}

interprocess_event interprocess_event::open(const std::shared_ptr<memory_provider>& provider,
                                            const interprocess_event_handle& handle) {
  require_provider(provider, "interprocess_event::open");
  const bool host_token = handle == host_event_token();
  if (provider->capabilities().synchronous) {
    if (!host_token)
      throw invalid_argument(
          "interprocess_event::open: the handle is not a host event's (a GPU event cannot be "
          "opened for host memory)");
    return interprocess_event(provider->executor(), 0, handle, false);
  }
  if (host_token)
    throw invalid_argument(
        fmt::format("interprocess_event::open: the handle is a host event's token, but {} memory needs a GPU "
                    "event",
                    to_string(provider->capabilities().where)));
  const int device = context_device(*provider);
  CUipcEventHandle opened{};
  std::memcpy(&opened, handle.bytes.data(), sizeof opened);
  driver::primary_context context(device);
  driver::scoped_context current(context.get());
  CUevent event = nullptr;
  VMM_DRIVER_CHECK(
      cuIpcOpenEventHandle, [&] { return fmt::format("cuIpcOpenEventHandle() on gpu {}", device); }, &event,
      opened);
  return interprocess_event(provider->executor(), reinterpret_cast<event_handle>(event), handle, false);
}

interprocess_event::interprocess_event(interprocess_event&& other) noexcept
    : executor_(std::exchange(other.executor_, nullptr)),
      event_(std::exchange(other.event_, 0)),
      handle_(other.handle_),
      created_(std::exchange(other.created_, false)) {}

interprocess_event& interprocess_event::operator=(interprocess_event&& other) noexcept {
  if (this != &other) {
    reset();
    executor_ = std::exchange(other.executor_, nullptr);
    event_ = std::exchange(other.event_, 0);
    handle_ = other.handle_;
    created_ = std::exchange(other.created_, false);
  }
  return *this;
}

interprocess_event::~interprocess_event() {
  reset();
}

void interprocess_event::reset() noexcept {
  if (executor_ != nullptr) executor_->destroy_event(event_);
  executor_ = nullptr;
  event_ = 0;
  handle_ = {};
  created_ = false;
}

void interprocess_event::require() const {
  if (executor_ == nullptr) throw invalid_argument("interprocess_event: there is no event");
}

void interprocess_event::record(stream_ref stream) {
  require();
  if (event_ != 0) executor_->record(event_, stream);
}

void interprocess_event::enqueue_wait(stream_ref stream) const {
  require();
  executor_->enqueue_wait(stream, event_);
}

bool interprocess_event::done() const {
  require();
  return executor_->done(event_);
}

void interprocess_event::synchronize() const {
  require();
  executor_->synchronize_event(event_);
}

// ---- fabric handles -----------------------------------------------------------------------

fabric_handle export_fabric(const physical_allocation& memory) {
  if (!memory) throw invalid_argument("export_fabric: the allocation is empty");
  const memory_provider& provider = *memory.provider();
  if (provider.capabilities().export_kind != handle_kind::fabric)
    throw invalid_argument(fmt::format("export_fabric: {} memory has no fabric handles: {}",
                                       to_string(provider.capabilities().where),
                                       provider.capabilities().fabric_unavailable_reason));
  const int device = context_device(provider);
  driver::primary_context context(device);
  driver::scoped_context current(context.get());
  CUmemFabricHandle exported{};
  VMM_DRIVER_CHECK(
      cuMemExportToShareableHandle,
      [&] {
        return fmt::format("cuMemExportToShareableHandle(size={}, fabric) on gpu {}", memory.size(), device);
      },
      static_cast<void*>(&exported), CUmemGenericAllocationHandle{memory.get()}, CU_MEM_HANDLE_TYPE_FABRIC,
      0ULL);
  fabric_handle result;
  static_assert(sizeof exported == sizeof result.bytes);
  std::memcpy(result.bytes.data(), &exported, sizeof exported);
  return result;
}

physical_allocation import_fabric(const std::shared_ptr<memory_provider>& provider,
                                  const fabric_handle& handle, std::size_t size) {
  require_provider(provider, "import_fabric");
  if (size == 0 || size % provider->capabilities().granularity != 0)
    throw invalid_argument(
        fmt::format("import_fabric: size {} is not a non-zero multiple of the "
                    "granularity {}",
                    size, provider->capabilities().granularity));
  if (provider->capabilities().export_kind != handle_kind::fabric)
    throw invalid_argument(fmt::format("import_fabric: {} memory cannot take fabric handles here: {}",
                                       to_string(provider->capabilities().where),
                                       provider->capabilities().fabric_unavailable_reason));
  const int device = context_device(*provider);
  CUmemFabricHandle imported_from{};
  std::memcpy(&imported_from, handle.bytes.data(), sizeof imported_from);
  driver::primary_context context(device);
  driver::scoped_context current(context.get());
  CUmemGenericAllocationHandle imported = 0;
  VMM_DRIVER_CHECK(
      cuMemImportFromShareableHandle,
      [&] { return fmt::format("cuMemImportFromShareableHandle(fabric, size={}) on gpu {}", size, device); },
      &imported, static_cast<void*>(&imported_from), CU_MEM_HANDLE_TYPE_FABRIC);
  try {
    return physical_allocation::adopt(provider, imported, size);
  } catch (...) {
    (void)driver::try_call(driver::api().cuMemRelease, imported);
    throw;
  }
}

}  // namespace vmm::ipc
