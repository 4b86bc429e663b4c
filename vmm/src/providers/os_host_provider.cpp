#include "providers/os_host_provider.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "vmm/error.hpp"
#include "vmm/unique_fd.hpp"

namespace vmm::detail {
namespace {

constexpr const char* provider_name = "os host";

[[noreturn]] void throw_errno(int error, const std::string& call) {
  if (error == ENOMEM || error == ENOSPC)
    throw out_of_memory(fmt::format("{} failed: {}", call, std::strerror(error)));
  throw os_error(error, fmt::format("{} failed", call));
}

int fd_of(physical_handle handle) { return static_cast<int>(handle); }

std::size_t checked_granularity(std::size_t granularity) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (!std::has_single_bit(granularity) || granularity < page)
    throw invalid_argument(fmt::format(
        "os host: granularity {} is not a power-of-two multiple of the page size {}", granularity,
        page));
  return granularity;
}

}  // namespace

os_host_provider::os_host_provider(std::size_t granularity)
    : granularity_(checked_granularity(granularity)), rules_{granularity_, provider_name} {}

std::span<const location> os_host_provider::default_accessors() const noexcept {
  static constexpr location host[] = {location::os_host()};
  return host;
}

std::uintptr_t os_host_provider::reserve(std::size_t size, std::size_t alignment) {
  rules_.check_size(size, "reserve");
  alignment = rules_.check_alignment(alignment);
  // Over-reserve by the alignment, then give back the unaligned head and the tail. mmap
  // only promises page alignment, so the worst head to skip is alignment - page.
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t padded = size + alignment - page;
  if (padded < size) throw out_of_memory(fmt::format("os host: reserve of {} bytes overflows", size));
  void* base = ::mmap(nullptr, padded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED)
    throw_errno(errno, fmt::format("os host: mmap(PROT_NONE) reserve of {} bytes", size));
  const auto start = reinterpret_cast<std::uintptr_t>(base);
  const std::uintptr_t aligned = (start + alignment - 1) & ~(alignment - 1);
  if (aligned > start) ::munmap(base, aligned - start);
  if (const std::uintptr_t end = start + padded; end > aligned + size)
    ::munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  std::lock_guard lock(mutex_);
  registry_.add_reservation(aligned, size);
  return aligned;
}

void os_host_provider::free_range(std::uintptr_t address, std::size_t size) {
  std::lock_guard lock(mutex_);
  registry_.check_free(rules_, address, size);
  if (::munmap(reinterpret_cast<void*>(address), size) != 0)
    throw_errno(errno, fmt::format("os host: munmap({:#x}, {})", address, size));
  registry_.remove_reservation(address);
}

physical_handle os_host_provider::create(std::size_t size) {
  rules_.check_size(size, "create");
  unique_fd fd(::memfd_create("vmm", MFD_CLOEXEC));
  if (!fd) throw_errno(errno, "os host: memfd_create");
  // fallocate commits the pages now, so that running out is an error here, not a SIGBUS on
  // first touch.
  int result = 0;
  do {
    result = ::fallocate(fd.get(), 0, 0, static_cast<off_t>(size));
  } while (result != 0 && errno == EINTR);
  if (result != 0) throw_errno(errno, fmt::format("os host: fallocate of {} bytes", size));
  std::lock_guard lock(mutex_);
  registry_.add_handle(static_cast<physical_handle>(fd.get()), size);
  return static_cast<physical_handle>(fd.release());
}

void os_host_provider::release(physical_handle handle) {
  std::lock_guard lock(mutex_);
  (void)registry_.handle_size(rules_, handle);
  registry_.remove_handle(handle);
  ::close(fd_of(handle));
}

std::size_t os_host_provider::size_of(physical_handle handle) const {
  std::lock_guard lock(mutex_);
  return registry_.handle_size(rules_, handle);
}

void os_host_provider::map(std::uintptr_t address, std::size_t size, physical_handle handle) {
  std::lock_guard lock(mutex_);
  registry_.check_map(rules_, address, size, handle);
  if (::mmap(reinterpret_cast<void*>(address), size, PROT_NONE, MAP_SHARED | MAP_FIXED,
             fd_of(handle), 0) == MAP_FAILED)
    throw_errno(errno, fmt::format("os host: mmap(MAP_FIXED) of {} bytes at {:#x}", size, address));
  registry_.add_mapping(address, size, handle);
}

void os_host_provider::unmap(std::uintptr_t address, std::size_t size) {
  std::lock_guard lock(mutex_);
  registry_.check_covered(rules_, address, size, "unmap");
  if (::mmap(reinterpret_cast<void*>(address), size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
    throw_errno(errno, fmt::format("os host: unmap of {} bytes at {:#x}", size, address));
  registry_.remove_mappings(address, size);
}

void os_host_provider::set_access(std::uintptr_t address, std::size_t size,
                                  std::span<const access_grant> grants) {
  int protection = PROT_NONE;
  for (const access_grant& grant : grants) {
    if (grant.accessor.kind != memory_kind::os_host)
      throw invalid_argument(fmt::format("os host: {} cannot be given access to OS host memory",
                                         to_string(grant.accessor)));
    if (grant.mode == access_mode::read_only) protection = PROT_READ;
    if (grant.mode == access_mode::read_write) protection = PROT_READ | PROT_WRITE;
  }
  std::lock_guard lock(mutex_);
  registry_.check_covered(rules_, address, size, "set_access");
  if (::mprotect(reinterpret_cast<void*>(address), size, protection) != 0)
    throw_errno(errno, fmt::format("os host: mprotect of {} bytes at {:#x}", size, address));
}

int os_host_provider::export_fd(physical_handle handle) {
  std::lock_guard lock(mutex_);
  (void)registry_.handle_size(rules_, handle);
  const int fd = ::fcntl(fd_of(handle), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw_errno(errno, "os host: export (fcntl F_DUPFD_CLOEXEC)");
  return fd;
}

physical_handle os_host_provider::import_fd(int fd, std::size_t size) {
  rules_.check_size(size, "import");
  struct stat status {};
  if (::fstat(fd, &status) != 0)
    throw invalid_argument(fmt::format("os host: import of fd {}: not an open file ({})", fd,
                                       std::strerror(errno)));
  if (!S_ISREG(status.st_mode))
    throw invalid_argument(fmt::format("os host: import of fd {}: not a memory file", fd));
  if (static_cast<std::size_t>(status.st_size) != size)
    throw invalid_argument(fmt::format("os host: import of fd {}: it holds {} bytes, not {}", fd,
                                       status.st_size, size));
  unique_fd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy) throw_errno(errno, "os host: import (fcntl F_DUPFD_CLOEXEC)");
  std::lock_guard lock(mutex_);
  registry_.add_handle(static_cast<physical_handle>(copy.get()), size);
  return static_cast<physical_handle>(copy.release());
}

void os_host_provider::copy(void* destination, const void* source, std::size_t n, stream_handle) {
  std::memmove(destination, source, n);
}

void os_host_provider::fill(void* destination, std::uint8_t value, std::size_t n, stream_handle) {
  std::memset(destination, value, n);
}

void os_host_provider::synchronize(stream_handle) {}

// The OS provider works synchronously: every event has passed when it is made, and the
// interprocess form is a fixed token no GPU event handle can be mistaken for.
event_handle os_host_provider::record_event(stream_handle) { return 0; }
void os_host_provider::record_event_at(event_handle, stream_handle) {}
void os_host_provider::stream_wait_event(stream_handle, event_handle) {}

event_handle os_host_provider::create_interprocess_event(interprocess_event_handle* exported) {
  if (exported == nullptr) throw invalid_argument("os host: create_interprocess_event(nullptr)");
  *exported = host_event_token();
  return 0;
}

event_handle os_host_provider::open_interprocess_event(const interprocess_event_handle& handle) {
  if (handle != host_event_token())
    throw invalid_argument(
        "os host: the interprocess event handle is not a host event's (a GPU event cannot be "
        "opened through a host provider)");
  return 0;
}

std::string os_host_provider::fabric_unavailable_reason() const {
  return "os host memory has no fabric handles (only GPU memory does)";
}

fabric_handle os_host_provider::export_fabric(physical_handle) {
  throw invalid_argument("os host: fabric handles are not available: " + fabric_unavailable_reason());
}

physical_handle os_host_provider::import_fabric(const fabric_handle&, std::size_t) {
  throw invalid_argument("os host: fabric handles cannot be imported here: " + fabric_unavailable_reason());
}
bool os_host_provider::event_done(event_handle) { return true; }
void os_host_provider::wait_event(event_handle) {}
void os_host_provider::destroy_event(event_handle) noexcept {}

std::size_t os_host_provider::physical_memory_size() const {
  return static_cast<std::size_t>(::sysconf(_SC_PHYS_PAGES)) *
         static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace vmm::detail
