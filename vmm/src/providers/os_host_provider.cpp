#include "providers/os_host_provider.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <limits>
#include <string>

#include "vmm/detail/system.hpp"
#include "vmm/error.hpp"

namespace vmm::detail {

void throw_errno(int error, const std::string& call) {
  if (error == ENOMEM || error == ENOSPC)
    throw out_of_memory(fmt::format("{} failed: {}", call, std::strerror(error)));
  throw os_error(error, fmt::format("{} failed", call));
}

namespace {

constexpr const char* provider_name = "os host";
constexpr int required_seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

int fd_of(physical_handle handle) {
  return static_cast<int>(handle);
}

std::size_t page_size() {
  return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

std::size_t checked_granularity(std::size_t granularity) {
  if (!std::has_single_bit(granularity) || granularity < page_size())
    throw invalid_argument(
        fmt::format("os host: granularity {} is not a power-of-two multiple of the page size {}", granularity,
                    page_size()));
  return granularity;
}

// The first number in `path` (a cgroup file such as memory.max), or nullopt ("max", absent).
std::optional<std::size_t> read_number(const char* path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  try {
    return static_cast<std::size_t>(std::stoull(word));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<std::size_t> mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return std::nullopt;
}

// What the memory cgroup still allows: v2 memory.max - memory.current, else v1.
std::optional<std::size_t> cgroup_room() {
  const std::pair<const char*, const char*> files[] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (const auto& [limit_file, usage_file] : files) {
    const auto limit = read_number(limit_file);
    if (!limit || *limit >= (std::size_t{1} << 60)) continue;  // "max", or v1's huge "no limit"
    const std::size_t used = read_number(usage_file).value_or(0);
    return *limit > used ? *limit - used : 0;
  }
  return std::nullopt;
}

// Duplicates `fd` close-on-exec.
unique_fd duplicate(int fd, const char* what) {
  unique_fd copy(os::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy) throw_errno(errno, fmt::format("os host: {} (fcntl F_DUPFD_CLOEXEC of fd {})", what, fd));
  return copy;
}

}  // namespace

std::size_t safe_commit_budget(std::size_t floor) {
  std::size_t room =
      mem_available().value_or(static_cast<std::size_t>(::sysconf(_SC_PHYS_PAGES)) * page_size());
  if (const auto cgroup = cgroup_room()) room = std::min(room, *cgroup);
  const std::size_t headroom = std::max<std::size_t>(room / 8, std::size_t{256} << 20);
  return std::max(floor, room > headroom ? room - headroom : 0);
}

namespace {

provider_capabilities os_capabilities(const os_host_options& options) {
  provider_capabilities result;
  if (options.id < 0) throw invalid_argument(fmt::format("os host: location id {} is negative", options.id));
  result.where = location{memory_kind::os_host, options.id};
  result.granularity = checked_granularity(options.granularity);
  result.recommended_granularity = result.granularity;
  const std::size_t budget =
      options.commit_budget != 0 ? options.commit_budget : safe_commit_budget(result.granularity);
  result.physical_memory_size = budget / result.granularity * result.granularity;
  result.default_accessors = {accessor::host()};
  result.export_kind = handle_kind::posix_fd;
  result.fabric_unavailable_reason = "os host memory has no fabric handles (only GPU memory does)";
  result.host_accessible = true;
  result.synchronous = options.executor == nullptr;
  return result;
}

}  // namespace

os_host_provider::os_host_provider(os_host_options options)
    : memory_provider(os_capabilities(options), std::make_shared<vmm::address_space>(provider_name),
                      options.executor != nullptr ? *options.executor : host_executor()),
      commit_on_create_(options.commit_on_create) {}

std::uintptr_t os_host_provider::do_allocate_range(std::size_t size, std::size_t alignment) {
  // Over-allocate by the alignment, then give back the unaligned head and the tail. mmap
  // only promises page alignment, so the worst head to skip is alignment - page.
  const std::size_t padded = size + alignment - page_size();
  if (padded < size)
    throw invalid_argument(fmt::format("os host: an address range of {} bytes overflows", size));
  void* base = os::mmap(nullptr, padded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED)
    throw_errno(errno, fmt::format("os host: mmap(PROT_NONE) of a {}-byte address range", size));
  const auto start = reinterpret_cast<std::uintptr_t>(base);
  const std::uintptr_t aligned = (start + alignment - 1) & ~(alignment - 1);
  const std::uintptr_t end = start + padded;
  // Trim the tail first: if the head's munmap fails after it, the whole padded range is
  // still one piece to give back.
  if (end > aligned + size &&
      os::munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size)) != 0) {
    const int error = errno;
    (void)os::munmap(base, padded);
    throw_errno(error, fmt::format("os host: munmap of the {}-byte tail padding", end - aligned - size));
  }
  if (aligned > start && os::munmap(base, aligned - start) != 0) {
    const int error = errno;
    (void)os::munmap(base, aligned + size - start);
    throw_errno(error, fmt::format("os host: munmap of the {}-byte head padding", aligned - start));
  }
  return aligned;
}

void os_host_provider::do_free_range(std::uintptr_t address, std::size_t size) {
  if (os::munmap(reinterpret_cast<void*>(address), size) != 0)
    throw_errno(errno, fmt::format("os host: munmap({:#x}, {})", address, size));
}

physical_handle os_host_provider::do_create(std::size_t size) {
  const std::size_t budget = capabilities().physical_memory_size;
  const std::size_t committed = committed_.load();
  if (size > budget || committed > budget - size)
    throw out_of_memory(
        fmt::format("os host: creating {} bytes would pass the commit budget of {} bytes ({} committed); "
                    "set os_host_options::commit_budget to change it",
                    size, budget, committed));
  unique_fd fd(os::memfd_create("vmm", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw_errno(errno, "os host: memfd_create");
  // fallocate commits the pages now, so that running out is an error here, not a SIGBUS on
  // first touch; ftruncate only sizes the file (os_host_options::commit_on_create false).
  int result = 0;
  do {
    result = commit_on_create_ ? os::fallocate(fd.get(), 0, 0, static_cast<off_t>(size))
                               : os::ftruncate(fd.get(), static_cast<off_t>(size));
  } while (result != 0 && errno == EINTR);
  if (result != 0)
    throw_errno(errno,
                fmt::format("os host: {} of {} bytes", commit_on_create_ ? "fallocate" : "ftruncate", size));
  if (os::fcntl(fd.get(), F_ADD_SEALS, required_seals) != 0)
    throw_errno(errno, "os host: sealing the memfd (F_ADD_SEALS shrink, grow, seal)");
  created_.emplace(static_cast<physical_handle>(fd.get()), size);
  committed_ += size;
  return static_cast<physical_handle>(fd.release());
}

void os_host_provider::do_destroy(physical_handle handle) {
  if (auto it = created_.find(handle); it != created_.end()) {
    committed_ -= it->second;
    created_.erase(it);
  }
  ::close(fd_of(handle));
}

void os_host_provider::do_map(std::uintptr_t address, std::size_t size, physical_handle handle) {
  if (os::mmap(reinterpret_cast<void*>(address), size, PROT_NONE, MAP_SHARED | MAP_FIXED, fd_of(handle), 0) ==
      MAP_FAILED)
    throw_errno(errno, fmt::format("os host: mmap(MAP_FIXED) of {} bytes at {:#x}", size, address));
}

void os_host_provider::do_unmap(std::uintptr_t address, std::size_t size) {
  if (os::mmap(reinterpret_cast<void*>(address), size, PROT_NONE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
    throw_errno(errno, fmt::format("os host: unmap of {} bytes at {:#x}", size, address));
}

void os_host_provider::do_set_access(std::uintptr_t address, std::size_t size,
                                     std::span<const access_grant> grants) {
  int protection = PROT_NONE;
  for (const access_grant& grant : grants) {
    if (grant.who != accessor::host())
      throw invalid_argument(
          fmt::format("os host: {} cannot be given access to OS host memory", to_string(grant.who)));
    if (grant.mode == access_mode::read_only) protection = PROT_READ;
    if (grant.mode == access_mode::read_write) protection = PROT_READ | PROT_WRITE;
  }
  if (os::mprotect(reinterpret_cast<void*>(address), size, protection) != 0)
    throw_errno(errno, fmt::format("os host: mprotect of {} bytes at {:#x}", size, address));
}

int os_host_provider::do_export_fd(physical_handle handle) {
  return duplicate(fd_of(handle), "export").release();
}

physical_handle os_host_provider::do_import_fd(int fd, std::size_t size) {
  struct stat status {};
  if (os::fstat(fd, &status) != 0) {
    if (errno == EBADF)
      throw invalid_argument(fmt::format("os host: import of fd {}: not an open descriptor", fd));
    throw_errno(errno, fmt::format("os host: fstat of fd {} for import", fd));
  }
  if (!S_ISREG(status.st_mode))
    throw invalid_argument(fmt::format("os host: import of fd {}: not a memory file", fd));
  const int seals = os::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    if (errno == EINVAL)
      throw invalid_argument(
          fmt::format("os host: import of fd {}: not a sealable memory file (F_GET_SEALS refused)", fd));
    throw_errno(errno, fmt::format("os host: F_GET_SEALS of fd {} for import", fd));
  }
  if ((seals & required_seals) != required_seals) {
    std::string missing;
    for (const auto& [seal, name] :
         {std::pair{F_SEAL_SHRINK, "F_SEAL_SHRINK"}, std::pair{F_SEAL_GROW, "F_SEAL_GROW"},
          std::pair{F_SEAL_SEAL, "F_SEAL_SEAL"}})
      if ((seals & seal) == 0) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", name);
    throw invalid_argument(
        fmt::format("os host: import of fd {}: the memory file lacks the seal(s) {} (a peer could resize it "
                    "under the mapping)",
                    fd, missing));
  }
  if (static_cast<std::size_t>(status.st_size) != size)
    throw invalid_argument(
        fmt::format("os host: import of fd {}: it holds {} bytes, not {}", fd, status.st_size, size));
  return static_cast<physical_handle>(duplicate(fd, "import").release());
}

}  // namespace vmm::detail
