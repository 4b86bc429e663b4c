#include "providers/driver_provider.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <map>
#include <mutex>
#include <numeric>

#include "driver/driver_api.hpp"
#include "vmm/error.hpp"

namespace vmm::detail {
namespace {

void require_vmm(int ordinal) {
  if (driver::attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                        driver::device_at(ordinal)) == 0)
    throw driver_unavailable(CUDA_ERROR_NOT_SUPPORTED,
                             fmt::format("gpu {} does not support virtual memory management", ordinal));
}

// Fabric handles need more than the device attribute: the process must be able to use an
// IMEX channel, and only creating one tells: without a channel the driver reads the
// attribute as 1 and still refuses cuMemCreate with CUDA_ERROR_NOT_PERMITTED
// (docs/GPU-FACTS.md, "Capabilities"). Returns "" when fabric handles
// work, otherwise the reason; any failure falls back to POSIX fds, never throws for it.
std::string probe_fabric(int ordinal, CUcontext context, CUmemAllocationProp properties) {
  const CUdevice device = driver::device_at(ordinal);
  if (driver::attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, device) == 0)
    return fmt::format(
        "gpu {} does not support fabric handles "
        "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 0)",
        ordinal);
  properties.requestedHandleTypes =
      static_cast<CUmemAllocationHandleType>(properties.requestedHandleTypes | CU_MEM_HANDLE_TYPE_FABRIC);
  std::size_t size = 0;
  if (const CUresult result = driver::try_call(driver::api().cuMemGetAllocationGranularity, &size,
                                               &properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      result != CUDA_SUCCESS)
    return fmt::format(
        "cuMemGetAllocationGranularity with CU_MEM_HANDLE_TYPE_FABRIC on gpu {} "
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
  return fmt::format(
      "the device attribute allows fabric handles, but cuMemCreate of {} bytes "
      "with CU_MEM_HANDLE_TYPE_FABRIC on gpu {} returned {}{}",
      size, ordinal, driver::error_name(result), why);
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

// Whether host NUMA node `node` exists: listed in sysfs, or node 0 of a machine whose
// kernel has no NUMA support.
bool numa_node_exists(int node) {
  if (node < 0) return false;
  struct stat status {};
  if (::stat("/sys/devices/system/node", &status) != 0) return node == 0;
  return ::stat(fmt::format("/sys/devices/system/node/node{}", node).c_str(), &status) == 0;
}

// ---- the executor ------------------------------------------------------------------------

class driver_executor final : public stream_executor {
 public:
  driver_executor(int ordinal, bool pinned)
      : context_(ordinal), name_(fmt::format("gpu {}", ordinal)), pinned_(pinned) {}

  void copy(void* destination, const void* source, std::size_t n, stream_ref stream) override {
    driver::scoped_context current(context_.get());
    VMM_DRIVER_CHECK(
        cuMemcpyAsync, [&] { return fmt::format("cuMemcpyAsync(bytes={}) on {}", n, name_); },
        reinterpret_cast<CUdeviceptr>(destination), reinterpret_cast<CUdeviceptr>(source), n, stream.get());
  }

  void fill(void* destination, std::uint8_t value, std::size_t n, stream_ref stream) override {
    const auto start = reinterpret_cast<std::uintptr_t>(destination);
    std::vector<std::pair<std::uintptr_t, std::size_t>> pieces{{start, n}};
    if (pinned_) pieces = cuda_address_space()->mapped_pieces(start, n);
    driver::scoped_context current(context_.get());
    // A pair, not a structured binding: clang before 16 cannot capture bindings in a lambda.
    for (const std::pair<std::uintptr_t, std::size_t>& piece : pieces)
      VMM_DRIVER_CHECK(
          cuMemsetD8Async,
          [&] {
            return fmt::format("cuMemsetD8Async(address={:#x}, bytes={}) on {}", piece.first, piece.second,
                               name_);
          },
          CUdeviceptr{piece.first}, static_cast<unsigned char>(value), piece.second, stream.get());
  }

  void pin_host(void* p, std::size_t n) override {
    driver::scoped_context current(context_.get());
    VMM_DRIVER_CHECK(
        cuMemHostRegister,
        [&] { return fmt::format("cuMemHostRegister(bytes={}, PORTABLE) on {}", n, name_); }, p, n,
        static_cast<unsigned>(CU_MEMHOSTREGISTER_PORTABLE));
  }

  void unpin_host(void* p, std::size_t) noexcept override {
    if (driver::try_call(driver::api().cuMemHostUnregister, p) != CUDA_SUCCESS)
      report_cleanup_failure("cuMemHostUnregister failed");
  }

  void synchronize(stream_ref stream) override {
    driver::scoped_context current(context_.get());
    VMM_DRIVER_CHECK(
        cuStreamSynchronize, [&] { return fmt::format("cuStreamSynchronize() on {}", name_); }, stream.get());
  }

  void synchronize_device() override {
    driver::scoped_context current(context_.get());
    VMM_DRIVER_CHECK(cuCtxSynchronize, [&] { return fmt::format("cuCtxSynchronize() on {}", name_); });
  }

  event_handle create_event() override {
    driver::scoped_context current(context_.get());
    CUevent event = nullptr;
    VMM_DRIVER_CHECK(
        cuEventCreate, [&] { return fmt::format("cuEventCreate() on {}", name_); }, &event,
        static_cast<unsigned>(CU_EVENT_DISABLE_TIMING));
    return reinterpret_cast<event_handle>(event);
  }

  void destroy_event(event_handle event) noexcept override {
    if (event != 0 &&
        driver::try_call(driver::api().cuEventDestroy, reinterpret_cast<CUevent>(event)) != CUDA_SUCCESS)
      report_cleanup_failure("cuEventDestroy failed");
  }

  void record(event_handle event, stream_ref stream) override {
    if (event == 0) throw invalid_argument(fmt::format("{}: record of no event", name_));
    driver::scoped_context current(context_.get());
    VMM_DRIVER_CHECK(
        cuEventRecord, [&] { return fmt::format("cuEventRecord() on {}", name_); },
        reinterpret_cast<CUevent>(event), stream.get());
  }

  bool done(event_handle event) override {
    if (event == 0) return true;
    const CUresult result = driver::try_call(driver::api().cuEventQuery, reinterpret_cast<CUevent>(event));
    if (result == CUDA_SUCCESS) return true;
    if (result == CUDA_ERROR_NOT_READY) return false;
    driver::throw_error(result, fmt::format("cuEventQuery() on {}", name_));
  }

  void synchronize_event(event_handle event) override {
    if (event == 0) return;
    VMM_DRIVER_CHECK(
        cuEventSynchronize, [&] { return fmt::format("cuEventSynchronize() on {}", name_); },
        reinterpret_cast<CUevent>(event));
  }

  void enqueue_wait(stream_ref stream, event_handle event) override {
    if (event == 0) return;
    driver::scoped_context current(context_.get());
    VMM_DRIVER_CHECK(
        cuStreamWaitEvent, [&] { return fmt::format("cuStreamWaitEvent() on {}", name_); }, stream.get(),
        reinterpret_cast<CUevent>(event), 0u);
  }

  stream_ref create_stream() override {
    driver::scoped_context current(context_.get());
    CUstream stream = nullptr;
    VMM_DRIVER_CHECK(
        cuStreamCreate, [&] { return fmt::format("cuStreamCreate(NON_BLOCKING) on {}", name_); }, &stream,
        static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
    return stream_ref(stream);
  }

  void destroy_stream(stream_ref stream) noexcept override {
    if (stream.get() != nullptr &&
        driver::try_call(driver::api().cuStreamDestroy, stream.get()) != CUDA_SUCCESS)
      report_cleanup_failure("cuStreamDestroy failed");
  }

 private:
  driver::primary_context context_;
  std::string name_;
  bool pinned_;
};

provider_capabilities common_capabilities(location where, const CUmemAllocationProp& properties) {
  provider_capabilities result;
  result.where = where;
  result.granularity = driver::granularity(properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  result.recommended_granularity = driver::granularity(properties, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  return result;
}

}  // namespace

const std::shared_ptr<vmm::address_space>& cuda_address_space() {
  // Never destroyed: objects with static storage may still unmap memory at exit.
  static auto* const space =
      new std::shared_ptr<vmm::address_space>(std::make_shared<vmm::address_space>("the CUDA address space"));
  return *space;
}

stream_executor& driver_executor_for(int ordinal, bool pinned) {
  static auto* const executors = new std::map<std::pair<int, bool>, std::unique_ptr<driver_executor>>();
  static auto* const mutex = new std::mutex();
  (void)driver::device_at(ordinal);
  std::lock_guard lock(*mutex);
  auto& executor = (*executors)[{ordinal, pinned}];
  if (executor == nullptr) executor = std::make_unique<driver_executor>(ordinal, pinned);
  return *executor;
}

std::shared_ptr<memory_provider> make_device_provider(int ordinal) {
  require_vmm(ordinal);
  const CUdevice device = driver::device_at(ordinal);
  const bool posix_fd =
      driver::attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device) != 0;
  CUmemAllocationProp properties = driver::allocation_properties(location::device(ordinal), posix_fd);
  std::string fabric_reason;
  {
    driver::primary_context context(ordinal);
    fabric_reason = probe_fabric(ordinal, context.get(), properties);
  }
  if (fabric_reason.empty())
    properties.requestedHandleTypes =
        static_cast<CUmemAllocationHandleType>(properties.requestedHandleTypes | CU_MEM_HANDLE_TYPE_FABRIC);
  provider_capabilities capabilities = common_capabilities(location::device(ordinal), properties);
  VMM_DRIVER_CHECK(
      cuDeviceTotalMem, [&] { return fmt::format("cuDeviceTotalMem(device={})", ordinal); },
      &capabilities.physical_memory_size, device);
  capabilities.default_accessors = {accessor::device(ordinal)};
  capabilities.export_kind = fabric_reason.empty() ? handle_kind::fabric
                             : posix_fd            ? handle_kind::posix_fd
                                                   : handle_kind::none;
  capabilities.fabric_unavailable_reason = std::move(fabric_reason);
  return std::make_shared<driver_provider>(std::move(capabilities), ordinal, properties);
}

std::shared_ptr<memory_provider> make_pinned_host_provider(int node, std::vector<int> devices) {
  if (devices.empty())
    throw invalid_argument("pinned host memory: no GPU given to access it (name at least one)");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    (void)driver::device_at(devices[i]);  // invalid_argument for a device that does not exist
    for (std::size_t j = 0; j < i; ++j)
      if (devices[j] == devices[i])
        throw invalid_argument(fmt::format("pinned host memory: gpu {} is named twice", devices[i]));
  }
  if (!numa_node_exists(node))
    throw invalid_argument(fmt::format("pinned host memory: NUMA node {} does not exist on this host", node));
  for (int device : devices) {
    require_vmm(device);
    if (driver::attribute(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                          driver::device_at(device)) == 0)
      throw driver_unavailable(CUDA_ERROR_NOT_SUPPORTED,
                               fmt::format("gpu {} does not support host-NUMA virtual memory", device));
  }
  const CUmemAllocationProp properties = driver::allocation_properties(location::pinned_host(node), false);
  provider_capabilities capabilities = common_capabilities(location::pinned_host(node), properties);
  capabilities.physical_memory_size =
      static_cast<std::size_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  capabilities.default_accessors.push_back(accessor::host());
  for (int device : devices) capabilities.default_accessors.push_back(accessor::device(device));
  capabilities.export_kind = handle_kind::none;
  capabilities.fabric_unavailable_reason =
      "the driver exports device memory only (host-NUMA handles cannot be exported)";
  capabilities.host_accessible = true;
  return std::make_shared<driver_provider>(std::move(capabilities), devices.front(), properties);
}

std::shared_ptr<memory_provider> make_pinned_host_provider_for_all_devices(int node) {
  std::vector<int> devices(static_cast<std::size_t>(driver::device_count()));
  std::iota(devices.begin(), devices.end(), 0);
  return make_pinned_host_provider(node, std::move(devices));
}

driver_provider::driver_provider(provider_capabilities capabilities, int context_device,
                                 CUmemAllocationProp properties)
    : memory_provider(
          std::move(capabilities), cuda_address_space(),
          driver_executor_for(context_device, properties.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)),
      context_(context_device),
      properties_(properties),
      name_(to_string(memory_provider::capabilities().where)) {}

std::uintptr_t driver_provider::do_allocate_range(std::size_t size, std::size_t alignment) {
  driver::scoped_context current(context_.get());
  CUdeviceptr address = 0;
  VMM_DRIVER_CHECK(
      cuMemAddressReserve,
      [&] {
        return fmt::format("cuMemAddressReserve(size={}, alignment={}) for {}", size, alignment, name_);
      },
      &address, size, alignment, CUdeviceptr{0}, 0ULL);
  return address;
}

void driver_provider::do_free_range(std::uintptr_t address, std::size_t size) {
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuMemAddressFree,
      [&] { return fmt::format("cuMemAddressFree(address={:#x}, size={}) for {}", address, size, name_); },
      CUdeviceptr{address}, size);
}

physical_handle driver_provider::do_create(std::size_t size) {
  driver::scoped_context current(context_.get());
  CUmemGenericAllocationHandle handle = 0;
  VMM_DRIVER_CHECK(
      cuMemCreate, [&] { return fmt::format("cuMemCreate(size={}) on {}", size, name_); }, &handle, size,
      &properties_, 0ULL);
  return handle;
}

void driver_provider::do_destroy(physical_handle handle) {
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuMemRelease, [&] { return fmt::format("cuMemRelease(handle={:#x}) on {}", handle, name_); },
      CUmemGenericAllocationHandle{handle});
}

void driver_provider::do_map(std::uintptr_t address, std::size_t size, physical_handle handle) {
  driver::scoped_context current(context_.get());
  const CUresult result = driver::try_call(driver::api().cuMemMap, CUdeviceptr{address}, size, std::size_t{0},
                                           CUmemGenericAllocationHandle{handle}, 0ULL);
  if (result == CUDA_SUCCESS) return;
  // The driver cannot tell an imported handle's size at import: a handle that holds another
  // size than the exporter said is refused here, as the OS provider refuses it at import.
  if (result == CUDA_ERROR_NOT_SUPPORTED || result == CUDA_ERROR_INVALID_VALUE)
    throw invalid_argument(
        fmt::format("{}: cuMemMap of {} bytes at {:#x} failed with {}: the handle does not hold {} bytes "
                    "(an imported handle of another size than its exporter said?)",
                    name_, size, address, driver::error_name(result), size));
  driver::throw_error(result, fmt::format("cuMemMap(address={:#x}, size={}) on {}", address, size, name_));
}

void driver_provider::do_unmap(std::uintptr_t address, std::size_t size) {
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuMemUnmap,
      [&] { return fmt::format("cuMemUnmap(address={:#x}, size={}) on {}", address, size, name_); },
      CUdeviceptr{address}, size);
}

void driver_provider::do_set_access(std::uintptr_t address, std::size_t size,
                                    std::span<const access_grant> grants) {
  std::vector<CUmemAccessDesc> descriptors;
  descriptors.reserve(grants.size());
  for (const access_grant& grant : grants) {
    CUmemLocation who{};
    if (grant.who.kind == accessor::kind_type::device) {
      (void)driver::device_at(grant.who.device_ordinal);
      who.type = CU_MEM_LOCATION_TYPE_DEVICE;
      who.id = grant.who.device_ordinal;
    } else if (capabilities().where.kind == memory_kind::pinned_host) {
      who.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      who.id = capabilities().where.id;
    } else {
      throw invalid_argument(fmt::format("{}: the host cannot be given access to GPU memory", name_));
    }
    descriptors.push_back(CUmemAccessDesc{who, access_flags(grant.mode)});
  }
  driver::scoped_context current(context_.get());
  VMM_DRIVER_CHECK(
      cuMemSetAccess,
      [&] {
        return fmt::format("cuMemSetAccess(address={:#x}, size={}, {} grant(s), first {} {}) on {}", address,
                           size, grants.size(), to_string(grants[0].who), to_string(grants[0].mode), name_);
      },
      CUdeviceptr{address}, size, descriptors.data(), descriptors.size());
}

int driver_provider::do_export_fd(physical_handle handle) {
  driver::scoped_context current(context_.get());
  int fd = -1;
  VMM_DRIVER_CHECK(
      cuMemExportToShareableHandle,
      [&] {
        return fmt::format("cuMemExportToShareableHandle(handle={:#x}, POSIX fd) on {}", handle, name_);
      },
      static_cast<void*>(&fd), CUmemGenericAllocationHandle{handle}, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
      0ULL);
  return fd;
}

physical_handle driver_provider::do_import_fd(int fd, std::size_t size) {
  driver::scoped_context current(context_.get());
  CUmemGenericAllocationHandle handle = 0;
  const CUresult result = driver::try_call(driver::api().cuMemImportFromShareableHandle, &handle,
                                           reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (result == CUDA_SUCCESS) return handle;
  // A descriptor that is not CUDA memory (a closed fd, /dev/null, a pipe) is refused by the
  // driver with an unspecific error: it is the caller's bad argument.
  if (result == CUDA_ERROR_UNKNOWN || result == CUDA_ERROR_INVALID_VALUE ||
      result == CUDA_ERROR_INVALID_HANDLE || result == CUDA_ERROR_NOT_SUPPORTED)
    throw invalid_argument(fmt::format(
        "{}: import of fd {} ({} bytes) failed with {}: the descriptor is not CUDA memory exported "
        "as a POSIX fd",
        name_, fd, size, driver::error_name(result)));
  driver::throw_error(result,
                      fmt::format("cuMemImportFromShareableHandle(fd={}, size={}) on {}", fd, size, name_));
}

}  // namespace vmm::detail
