#include "providers/driver_provider.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>

#include "driver/driver_api.hpp"
#include "vmm/error.hpp"

namespace vmm::detail {
namespace {

int context_device(const location& where) {
  if (where.kind == memory_kind::device) return where.id;
  if (where.kind == memory_kind::pinned_host) return 0;
  throw invalid_argument("the driver provider serves device and pinned host memory only");
}

void require_support(const location& where, int ordinal) {
  const CUdevice device = driver::device_at(ordinal);
  if (driver::attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) == 0)
    throw driver_unavailable(CUDA_ERROR_NOT_SUPPORTED,
                             fmt::format("gpu {} does not support virtual memory management", ordinal));
  if (where.kind == memory_kind::pinned_host &&
      driver::attribute(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) == 0)
    throw driver_unavailable(CUDA_ERROR_NOT_SUPPORTED,
                             fmt::format("gpu {} does not support host-NUMA virtual memory", ordinal));
}

bool exportable(const location& where, int ordinal) {
  return where.kind == memory_kind::device &&
         driver::attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                           driver::device_at(ordinal)) != 0;
}

// Fabric handles need more than the device attribute: the process must be able to use an
// IMEX channel, and only creating one tells. The lent H100/H200s read the attribute as 1
// and refuse cuMemCreate with CUDA_ERROR_NOT_PERMITTED. Returns "" when fabric handles
// work, otherwise the reason; any failure falls back to POSIX fds, never throws for it.
std::string probe_fabric(const location& where, int ordinal, CUcontext context, bool posix_fd) {
  if (where.kind != memory_kind::device)
    return "the driver exports device memory only (host-NUMA handles cannot be exported)";
  const CUdevice device = driver::device_at(ordinal);
  if (driver::attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, device) == 0)
    return fmt::format("gpu {} does not support fabric handles "
                       "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 0)",
                       ordinal);
  CUmemAllocationProp properties = driver::allocation_properties(where, posix_fd);
  properties.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(
      properties.requestedHandleTypes | CU_MEM_HANDLE_TYPE_FABRIC);
  std::size_t size = 0;
  if (const CUresult result = driver::try_call(driver::api().cuMemGetAllocationGranularity, &size,
                                               &properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      result != CUDA_SUCCESS)
    return fmt::format("cuMemGetAllocationGranularity with CU_MEM_HANDLE_TYPE_FABRIC on gpu {} "
                       "failed: {}",
                       ordinal, driver::error_name(result));
  driver::scoped_context current(context);
  CUmemGenericAllocationHandle handle = 0;
  const CUresult result = driver::try_call(driver::api().cuMemCreate, &handle, size, &properties, 0ULL);
  if (result == CUDA_SUCCESS) {
    if (driver::try_call(driver::api().cuMemRelease, handle) != CUDA_SUCCESS)
      report_cleanup_failure("cuMemRelease of the fabric-handle probe failed");
    return {};
  }
  const char* why = "";
  if (result == CUDA_ERROR_NOT_PERMITTED)
    why = ": no IMEX channel this process may use (/dev/nvidia-caps-imex-channels)";
  else if (result == CUDA_ERROR_NOT_SUPPORTED)
    why = ": this system does not support them";
  return fmt::format("the device attribute allows fabric handles, but cuMemCreate of {} bytes "
                     "with CU_MEM_HANDLE_TYPE_FABRIC on gpu {} returned {}{}",
                     size, ordinal, driver::error_name(result), why);
}

CUmemAllocationProp with_fabric(CUmemAllocationProp properties, bool fabric) {
  if (fabric)
    properties.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(
        properties.requestedHandleTypes | CU_MEM_HANDLE_TYPE_FABRIC);
  return properties;
}

CUmemAccess_flags access_flags(access_mode mode) {
  switch (mode) {
    case access_mode::none:
      return CU_MEM_ACCESS_FLAGS_PROT_NONE;
    case access_mode::read_only:
      return CU_MEM_ACCESS_FLAGS_PROT_READ;
    case access_mode::read_write:
      return CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  throw invalid_argument(fmt::format("unknown access mode {}", static_cast<int>(mode)));
}

struct address_space {
  std::mutex mutex;
  range_registry registry;
};

address_space& shared_address_space() {
  static auto* const space = new address_space();  // never destroyed: see provider_for
  return *space;
}

}  // namespace

driver_provider::driver_provider(location where)
    : where_(where),
      device_ordinal_(context_device(where)),
      context_((require_support(where, device_ordinal_), device_ordinal_)),
      exportable_(exportable(where, device_ordinal_)),
      fabric_reason_(probe_fabric(where, device_ordinal_, context_.get(), exportable_)),
      properties_(with_fabric(driver::allocation_properties(where, exportable_), fabric_reason_.empty())),
      granularity_(driver::granularity(properties_, CU_MEM_ALLOC_GRANULARITY_MINIMUM)),
      recommended_granularity_(driver::granularity(properties_, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)),
      name_(to_string(where)),
      rules_{granularity_, name_.c_str()},
      mutex_(shared_address_space().mutex),
      registry_(shared_address_space().registry) {
  default_accessors_.push_back(location::device(device_ordinal_));
  if (where.kind == memory_kind::pinned_host) default_accessors_.push_back(where);
}

std::uintptr_t driver_provider::reserve(std::size_t size, std::size_t alignment) {
  rules_.check_size(size, "reserve");
  alignment = rules_.check_alignment(alignment);
  driver::scoped_context current(context_.get());
  CUdeviceptr address = 0;
  VMM_DRIVER_CHECK(
      cuMemAddressReserve,
      [&] { return fmt::format("cuMemAddressReserve(size={}, alignment={}) for {}", size, alignment, name_); },
      &address, size, alignment, CUdeviceptr{0}, 0ULL);
  std::lock_guard lock(mutex_);
  registry_.add_reservation(address, size);
  return address;
}

void driver_provider::free_range(std::uintptr_t address, std::size_t size) {
  std::lock_guard lock(mutex_);
  registry_.check_free(rules_, address, size);
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuMemAddressFree,
      [&] { return fmt::format("cuMemAddressFree(address={:#x}, size={}) for {}", address, size, name_); },
      CUdeviceptr{address}, size);
  registry_.remove_reservation(address);
}

physical_handle driver_provider::create(std::size_t size) {
  rules_.check_size(size, "create");
  driver::scoped_context current(context_.get());
  CUmemGenericAllocationHandle handle = 0;
  VMM_DRIVER_CHECK(
      cuMemCreate, [&] { return fmt::format("cuMemCreate(size={}) on {}", size, name_); },
      &handle, size, &properties_, 0ULL);
  std::lock_guard lock(mutex_);
  registry_.add_handle(handle, size);
  return handle;
}

void driver_provider::release(physical_handle handle) {
  std::lock_guard lock(mutex_);
  const std::size_t size = registry_.handle_size(rules_, handle);
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuMemRelease,
      [&] { return fmt::format("cuMemRelease(handle={:#x}, size={}) on {}", handle, size, name_); },
      CUmemGenericAllocationHandle{handle});
  registry_.remove_handle(handle);
}

std::size_t driver_provider::size_of(physical_handle handle) const {
  std::lock_guard lock(mutex_);
  return registry_.handle_size(rules_, handle);
}

void driver_provider::map(std::uintptr_t address, std::size_t size, physical_handle handle) {
  std::lock_guard lock(mutex_);
  registry_.check_map(rules_, address, size, handle);
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuMemMap,
      [&] { return fmt::format("cuMemMap(address={:#x}, size={}) on {}", address, size, name_); },
      CUdeviceptr{address}, size, std::size_t{0}, CUmemGenericAllocationHandle{handle}, 0ULL);
  registry_.add_mapping(address, size, handle);
}

void driver_provider::unmap(std::uintptr_t address, std::size_t size) {
  std::lock_guard lock(mutex_);
  registry_.check_covered(rules_, address, size, "unmap");
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuMemUnmap,
      [&] { return fmt::format("cuMemUnmap(address={:#x}, size={}) on {}", address, size, name_); },
      CUdeviceptr{address}, size);
  registry_.remove_mappings(address, size);
}

void driver_provider::set_access(std::uintptr_t address, std::size_t size,
                                 std::span<const access_grant> grants) {
  std::vector<CUmemAccessDesc> descriptors;
  descriptors.reserve(grants.size());
  for (const access_grant& grant : grants) {
    const location& who = grant.accessor;
    if (who.kind == memory_kind::device) {
      (void)driver::device_at(who.id);
    } else if (who.kind == memory_kind::os_host || where_.kind == memory_kind::device) {
      throw invalid_argument(fmt::format("{}: {} cannot be given access to this memory", name_,
                                         to_string(who)));
    }
    descriptors.push_back(CUmemAccessDesc{driver::memory_location(who), access_flags(grant.mode)});
  }
  if (descriptors.empty()) throw invalid_argument(fmt::format("{}: set_access with no grants", name_));
  std::lock_guard lock(mutex_);
  registry_.check_covered(rules_, address, size, "set_access");
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuMemSetAccess,
      [&] {
        return fmt::format("cuMemSetAccess(address={:#x}, size={}, {} grant(s), first {} {}) on {}",
                           address, size, grants.size(), to_string(grants[0].accessor),
                           to_string(grants[0].mode), name_);
      },
      CUdeviceptr{address}, size, descriptors.data(), descriptors.size());
}

int driver_provider::export_fd(physical_handle handle) {
  if (!exportable_)
    throw invalid_argument(fmt::format(
        "{}: this memory cannot be exported as a file descriptor{}", name_,
        where_.kind == memory_kind::pinned_host ? " (the driver does not export host-NUMA handles)"
                                                : " (the device lacks POSIX-fd handles)"));
  std::lock_guard lock(mutex_);
  const std::size_t size = registry_.handle_size(rules_, handle);
  driver::scoped_context current(context_.get());
  int fd = -1;
  VMM_DRIVER_CHECK(
      cuMemExportToShareableHandle,
      [&] { return fmt::format("cuMemExportToShareableHandle(size={}, POSIX fd) on {}", size, name_); },
      static_cast<void*>(&fd), CUmemGenericAllocationHandle{handle},
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0ULL);
  return fd;
}

physical_handle driver_provider::import_fd(int fd, std::size_t size) {
  rules_.check_size(size, "import");
  if (!exportable_)
    throw invalid_argument(fmt::format("{}: this memory cannot be imported from a file descriptor", name_));
  driver::scoped_context current(context_.get());
  CUmemGenericAllocationHandle handle = 0;
  VMM_DRIVER_CHECK(
      cuMemImportFromShareableHandle,
      [&] { return fmt::format("cuMemImportFromShareableHandle(fd={}, size={}) on {}", fd, size, name_); },
      &handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  std::lock_guard lock(mutex_);
  registry_.add_handle(handle, size);
  return handle;
}

handle_kind driver_provider::export_handle_kind() const noexcept {
  if (fabric_reason_.empty()) return handle_kind::fabric;
  return exportable_ ? handle_kind::posix_fd : handle_kind::none;
}

fabric_handle driver_provider::export_fabric(physical_handle handle) {
  if (!fabric_reason_.empty())
    throw invalid_argument(fmt::format("{}: fabric handles are not available: {}", name_, fabric_reason_));
  std::lock_guard lock(mutex_);
  const std::size_t size = registry_.handle_size(rules_, handle);
  driver::scoped_context current(context_.get());
  CUmemFabricHandle exported{};
  VMM_DRIVER_CHECK(
      cuMemExportToShareableHandle,
      [&] { return fmt::format("cuMemExportToShareableHandle(size={}, fabric) on {}", size, name_); },
      static_cast<void*>(&exported), CUmemGenericAllocationHandle{handle}, CU_MEM_HANDLE_TYPE_FABRIC, 0ULL);
  fabric_handle result;
  static_assert(sizeof exported == sizeof result.bytes);
  std::memcpy(result.bytes.data(), &exported, sizeof exported);
  return result;
}

physical_handle driver_provider::import_fabric(const fabric_handle& handle, std::size_t size) {
  rules_.check_size(size, "import");
  if (!fabric_reason_.empty())
    throw invalid_argument(fmt::format("{}: fabric handles cannot be imported here: {}", name_, fabric_reason_));
  CUmemFabricHandle imported_from{};
  std::memcpy(&imported_from, handle.bytes.data(), sizeof imported_from);
  driver::scoped_context current(context_.get());
  CUmemGenericAllocationHandle imported = 0;
  VMM_DRIVER_CHECK(
      cuMemImportFromShareableHandle,
      [&] { return fmt::format("cuMemImportFromShareableHandle(fabric, size={}) on {}", size, name_); },
      &imported, static_cast<void*>(&imported_from), CU_MEM_HANDLE_TYPE_FABRIC);
  std::lock_guard lock(mutex_);
  registry_.add_handle(imported, size);
  return imported;
}

void driver_provider::copy(void* destination, const void* source, std::size_t n, stream_handle stream) {
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuMemcpyAsync, [&] { return fmt::format("cuMemcpyAsync(bytes={}) on {}", n, name_); },
      reinterpret_cast<CUdeviceptr>(destination), reinterpret_cast<CUdeviceptr>(source), n,
      static_cast<CUstream>(stream));
}

void driver_provider::fill(void* destination, std::uint8_t value, std::size_t n, stream_handle stream) {
  // cuMemsetD8 refuses (CUDA_ERROR_INVALID_VALUE) a range of host-NUMA memory that spans two
  // allocations, though copies over it work: fill pinned host memory one mapping at a time.
  const auto start = reinterpret_cast<std::uintptr_t>(destination);
  std::vector<std::pair<std::uintptr_t, std::size_t>> pieces{{start, n}};
  if (where_.kind == memory_kind::pinned_host) {
    std::lock_guard lock(mutex_);
    pieces = registry_.split_at_mappings(start, n);
  }
  driver::scoped_context current(context_.get());
  for (const auto& [address, bytes] : pieces)
    VMM_DRIVER_CHECK(
        cuMemsetD8Async,
        [&] { return fmt::format("cuMemsetD8Async(address={:#x}, bytes={}) on {}", address, bytes, name_); },
        CUdeviceptr{address}, static_cast<unsigned char>(value), bytes, static_cast<CUstream>(stream));
}

void driver_provider::synchronize(stream_handle stream) {
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuStreamSynchronize, [&] { return fmt::format("cuStreamSynchronize() on {}", name_); },
      static_cast<CUstream>(stream));
}

}  // namespace vmm::detail

namespace vmm::detail {

event_handle driver_provider::record_event(stream_handle stream) {
  driver::scoped_context current(context_.get());
  CUevent event = nullptr;
  VMM_DRIVER_CHECK(cuEventCreate, [&] { return fmt::format("cuEventCreate() on {}", name_); },
                   &event, static_cast<unsigned>(CU_EVENT_DISABLE_TIMING));
  if (CUresult result = driver::try_call(driver::api().cuEventRecord, event, static_cast<CUstream>(stream));
      result != CUDA_SUCCESS) {
    driver::try_call(driver::api().cuEventDestroy, event);
    driver::throw_error(result, fmt::format("cuEventRecord() on {}", name_));
  }
  return reinterpret_cast<event_handle>(event);
}

bool driver_provider::event_done(event_handle event) {
  const CUresult result = driver::try_call(driver::api().cuEventQuery, reinterpret_cast<CUevent>(event));
  if (result == CUDA_SUCCESS) return true;
  if (result == CUDA_ERROR_NOT_READY) return false;
  driver::throw_error(result, fmt::format("cuEventQuery() on {}", name_));
}

void driver_provider::wait_event(event_handle event) {
  VMM_DRIVER_CHECK(cuEventSynchronize, [&] { return fmt::format("cuEventSynchronize() on {}", name_); },
                   reinterpret_cast<CUevent>(event));
}

void driver_provider::destroy_event(event_handle event) noexcept {
  if (event != 0 && driver::try_call(driver::api().cuEventDestroy, reinterpret_cast<CUevent>(event)) != CUDA_SUCCESS)
    report_cleanup_failure("cuEventDestroy failed");
}

event_handle driver_provider::create_interprocess_event(interprocess_event_handle* exported) {
  if (exported == nullptr) throw invalid_argument(fmt::format("{}: create_interprocess_event(nullptr)", name_));
  if (driver::api().cuIpcGetEventHandle == nullptr) driver::throw_missing("cuIpcGetEventHandle");
  driver::scoped_context current(context_.get());
  CUevent event = nullptr;
  VMM_DRIVER_CHECK(
      cuEventCreate,
      [&] { return fmt::format("cuEventCreate(INTERPROCESS | DISABLE_TIMING) on {}", name_); }, &event,
      static_cast<unsigned>(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
  CUipcEventHandle handle{};
  if (const CUresult result = driver::try_call(driver::api().cuIpcGetEventHandle, &handle, event);
      result != CUDA_SUCCESS) {
    driver::try_call(driver::api().cuEventDestroy, event);
    driver::throw_error(result, fmt::format("cuIpcGetEventHandle() on {}", name_));
  }
  static_assert(sizeof handle == sizeof exported->bytes);
  std::memcpy(exported->bytes.data(), &handle, sizeof handle);
  return reinterpret_cast<event_handle>(event);
}

event_handle driver_provider::open_interprocess_event(const interprocess_event_handle& exported) {
  CUipcEventHandle handle{};
  std::memcpy(&handle, exported.bytes.data(), sizeof handle);
  driver::scoped_context current(context_.get());
  CUevent event = nullptr;
  VMM_DRIVER_CHECK(cuIpcOpenEventHandle, [&] { return fmt::format("cuIpcOpenEventHandle() on {}", name_); },
                   &event, handle);
  return reinterpret_cast<event_handle>(event);
}

void driver_provider::record_event_at(event_handle event, stream_handle stream) {
  if (event == 0) throw invalid_argument(fmt::format("{}: record_event_at of no event", name_));
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(cuEventRecord, [&] { return fmt::format("cuEventRecord() on {}", name_); },
                   reinterpret_cast<CUevent>(event), static_cast<CUstream>(stream));
}

void driver_provider::stream_wait_event(stream_handle stream, event_handle event) {
  if (event == 0) throw invalid_argument(fmt::format("{}: stream_wait_event on no event", name_));
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(cuStreamWaitEvent, [&] { return fmt::format("cuStreamWaitEvent() on {}", name_); },
                   static_cast<CUstream>(stream), reinterpret_cast<CUevent>(event), 0u);
}

std::size_t driver_provider::physical_memory_size() const {
  if (where_.kind == memory_kind::pinned_host)
    return static_cast<std::size_t>(::sysconf(_SC_PHYS_PAGES)) *
           static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t bytes = 0;
  VMM_DRIVER_CHECK(cuDeviceTotalMem, [&] { return fmt::format("cuDeviceTotalMem() for {}", name_); },
                   &bytes, driver::device_at(where_.id));
  return bytes;
}

}  // namespace vmm::detail
