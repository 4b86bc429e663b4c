#include "vmm/provider.hpp"

#include <fmt/format.h>

#include <bit>
#include <map>
#include <mutex>
#include <vector>

#include "fault_injection.hpp"
#include "vmm/detail/enum_names.hpp"
#include "providers/driver_provider.hpp"
#include "providers/os_host_provider.hpp"
#include "vmm/error.hpp"

namespace vmm {

memory_provider::memory_provider(provider_capabilities capabilities,
                                 std::shared_ptr<vmm::address_space> space, stream_executor& executor)
    : capabilities_(std::move(capabilities)),
      name_(to_string(capabilities_.where)),
      space_(std::move(space)),
      executor_(&executor) {}

std::uintptr_t memory_provider::allocate_range(std::size_t size, std::size_t alignment) {
  const std::size_t granularity = capabilities_.granularity;
  space_->check_size(size, granularity, name_.c_str(), "address range");
  if (alignment == 0) alignment = granularity;
  if (!std::has_single_bit(alignment) || alignment % granularity != 0)
    throw invalid_argument(
        fmt::format("{}: alignment {} is not a power of two multiple of the granularity {}", name_, alignment,
                    granularity));
  std::lock_guard lock(space_->mutex_);
  const std::uintptr_t address = do_allocate_range(size, alignment);
  space_->add_range(address, size);
  return address;
}

void memory_provider::free_range(std::uintptr_t address, std::size_t size) {
  std::lock_guard lock(space_->mutex_);
  space_->check_free(name_.c_str(), address, size);
  do_free_range(address, size);
  space_->remove_range(address);
}

physical_handle memory_provider::create(std::size_t size) {
  space_->check_size(size, capabilities_.granularity, name_.c_str(), "create");
  std::lock_guard lock(space_->mutex_);
  const physical_handle handle = do_create(size);
  space_->add_handle(name_.c_str(), handle, size);
  return handle;
}

void memory_provider::destroy(physical_handle handle) {
  std::lock_guard lock(space_->mutex_);
  (void)space_->handle_size(name_.c_str(), handle);
  do_destroy(handle);
  space_->remove_handle(handle);
}

void memory_provider::map(std::uintptr_t address, std::size_t size, physical_handle handle) {
  std::lock_guard lock(space_->mutex_);
  space_->check_map(name_.c_str(), address, size, handle, capabilities_.granularity);
  do_map(address, size, handle);
  space_->add_mapping(address, size, handle);
}

void memory_provider::unmap(std::uintptr_t address, std::size_t size) {
  std::lock_guard lock(space_->mutex_);
  space_->check_covered(name_.c_str(), address, size, capabilities_.granularity, "unmap");
  do_unmap(address, size);
  space_->remove_mappings(address, size);
}

void memory_provider::set_access(std::uintptr_t address, std::size_t size,
                                 std::span<const access_grant> grants) {
  if (grants.empty()) throw invalid_argument(fmt::format("{}: set_access with no grants", name_));
  for (const access_grant& grant : grants)
    if (grant.mode != access_mode::none && grant.mode != access_mode::read_only &&
        grant.mode != access_mode::read_write)
      throw invalid_argument(fmt::format("{}: unknown access mode {} for {}", name_,
                                         static_cast<int>(grant.mode), to_string(grant.who)));
  std::lock_guard lock(space_->mutex_);
  space_->check_covered(name_.c_str(), address, size, capabilities_.granularity, "set_access");
  do_set_access(address, size, grants);
}

std::vector<access_grant> provider_capabilities::grants(access_mode mode) const {
  std::vector<access_grant> result;
  for (const accessor& who : default_accessors) result.push_back({who, mode});
  return result;
}

unique_fd memory_provider::export_fd(physical_handle handle) {
  if (capabilities_.export_kind == handle_kind::none)
    throw invalid_argument(fmt::format("{}: this memory cannot be exported ({})", name_,
                                       capabilities_.where.kind == memory_kind::pinned_host
                                           ? "the driver does not export host-NUMA handles"
                                           : "the device has no shareable handle type"));
  std::lock_guard lock(space_->mutex_);
  (void)space_->handle_size(name_.c_str(), handle);
  if (int injected = 0; detail::fault::fail_here(detail::fault::provider_export, injected))
    throw os_error(injected, fmt::format("{}: export of handle {} (an injected fault)", name_, handle));
  return unique_fd(do_export_fd(handle));
}

physical_handle memory_provider::import_fd(int fd, std::size_t size) {
  space_->check_size(size, capabilities_.granularity, name_.c_str(), "import");
  if (capabilities_.export_kind == handle_kind::none)
    throw invalid_argument(fmt::format("{}: this memory cannot be imported from a file descriptor", name_));
  if (fd < 0) throw invalid_argument(fmt::format("{}: import of fd {}: not a descriptor", name_, fd));
  std::lock_guard lock(space_->mutex_);
  const physical_handle handle = do_import_fd(fd, size);
  space_->add_handle(name_.c_str(), handle, size);
  return handle;
}

void memory_provider::adopt(physical_handle handle, std::size_t size) {
  space_->check_size(size, capabilities_.granularity, name_.c_str(), "adopt");
  std::lock_guard lock(space_->mutex_);
  space_->add_handle(name_.c_str(), handle, size);
}

const char* to_string(handle_kind kind) noexcept {
  static constexpr detail::enum_name<handle_kind> names[] = {
      {handle_kind::none, "none"}, {handle_kind::posix_fd, "posix fd"}, {handle_kind::fabric, "fabric"}};
  return detail::name_of(kind, names, "unknown handle kind");
}

std::shared_ptr<memory_provider> provider_for(location where) {
  // Never destroyed: objects with static storage may still release memory at exit.
  static auto* const providers = new std::map<location, std::shared_ptr<memory_provider>>();
  static auto* const mutex = new std::mutex();
  std::lock_guard lock(*mutex);
  if (auto it = providers->find(where); it != providers->end()) return it->second;
  std::shared_ptr<memory_provider> created;
  switch (where.kind) {
    case memory_kind::os_host:
      if (where.id != 0)
        throw invalid_argument(fmt::format("os host memory has no location id {}", where.id));
      created = make_os_host_provider();
      break;
    case memory_kind::device:
      created = detail::make_device_provider(where.id);
      break;
    case memory_kind::pinned_host:
      created = detail::make_pinned_host_provider_for_all_devices(where.id);
      break;
    default:
      throw invalid_argument(fmt::format("unknown memory kind {}", static_cast<int>(where.kind)));
  }
  providers->emplace(where, created);
  return created;
}

std::shared_ptr<memory_provider> make_os_host_provider(os_host_options options) {
  return std::make_shared<detail::os_host_provider>(options);
}

std::shared_ptr<memory_provider> make_pinned_host_provider(int node, std::vector<int> devices) {
  return detail::make_pinned_host_provider(node, std::move(devices));
}

std::size_t round_up(std::size_t size, std::size_t granularity) {
  const std::size_t rounded = (size + granularity - 1) & ~(granularity - 1);
  if (rounded < size)
    throw invalid_argument(fmt::format("size {} overflows when rounded up to {}", size, granularity));
  return rounded;
}

}  // namespace vmm
