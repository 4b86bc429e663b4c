#include "version_table.hpp"

#include <vmm/error.hpp>
#include <vmm/ipc/protocol_error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <memory>
#include <utility>

#include "vmm/detail/system.hpp"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1; older C libraries lack the name
#endif

namespace vmm::store::detail {
namespace {

constexpr int table_seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;

std::atomic_ref<std::uint64_t> word(std::uint64_t* words, std::uint32_t slot) noexcept {
  return std::atomic_ref<std::uint64_t>(words[slot]);
}

}  // namespace

void table_unmap::operator()(std::uint64_t* words) const noexcept {
  (void)os::munmap(words, bytes);
}

std::unique_ptr<std::uint64_t[], table_unmap> version_table::map(int fd, std::size_t slots, int protection) {
  const std::size_t bytes = slots * sizeof(std::uint64_t);
  void* mapped = os::mmap(nullptr, bytes, protection, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) throw os_error(errno, "vmm-store: mmap of the version table");
  return {static_cast<std::uint64_t*>(mapped), table_unmap{bytes}};
}

version_table version_table::create(std::size_t slots) {
  if (slots >= no_slot)
    throw invalid_argument(
        fmt::format("vmm-store: {} version slots asked for; at most {}", slots, no_slot - 1));
  if (slots == 0) return {};
  const std::size_t bytes = slots * sizeof(std::uint64_t);
  unique_fd fd(os::memfd_create("vmm-store-versions", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw os_error(errno, "vmm-store: memfd_create of the version table");
  if (os::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    throw os_error(errno, fmt::format("vmm-store: ftruncate of the version table to {} bytes", bytes));
  version_table table;
  table.words_ = map(fd.get(), slots, PROT_READ | PROT_WRITE);
  if (os::fcntl(fd.get(), F_ADD_SEALS, table_seals) != 0) {
    if (errno == EINVAL) return {};  // a kernel before 5.1: no table, every get asks the daemon
    throw os_error(errno, "vmm-store: sealing the version table");
  }
  table.fd_ = std::move(fd);
  return table;
}

version_table version_table::open(unique_fd fd, std::size_t slots) {
  const std::size_t bytes = slots * sizeof(std::uint64_t);
  struct stat status {};
  if (os::fstat(fd.get(), &status) != 0) throw os_error(errno, "vmm-store: fstat of the version table");
  const int seals = os::fcntl(fd.get(), F_GET_SEALS);
  if (static_cast<std::size_t>(status.st_size) != bytes || seals < 0 || (seals & table_seals) != table_seals)
    throw ipc::protocol_error(
        fmt::format("vmm-store: the daemon's version table is {} bytes with seals {:#x}; expected {} bytes "
                    "({} slots) with seals {:#x}",
                    status.st_size, seals, bytes, slots, table_seals));
  version_table table;
  table.words_ = map(fd.get(), slots, PROT_READ);
  table.fd_ = std::move(fd);
  return table;
}

std::uint32_t version_table::take() noexcept {
  if (!returned_.empty()) {
    const std::uint32_t slot = returned_.back();
    returned_.pop_back();
    return slot;
  }
  if (never_used_ >= slots()) return no_slot;
  // Room to give every slot taken back without allocating (give_back cannot fail).
  try {
    if (returned_.capacity() <= never_used_)
      returned_.reserve(std::max<std::size_t>(64, 2 * returned_.capacity()));
  } catch (const std::bad_alloc&) {
    return no_slot;
  }
  return never_used_++;
}

void version_table::bump(std::uint32_t slot) noexcept {
  if (slot >= slots()) return;
  // One writer (the daemon's thread): a load and a store; release, so that a client that
  // reads the new word reads it after the change.
  const auto w = word(words_.get(), slot);
  w.store(w.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

void version_table::give_back(std::uint32_t slot) noexcept {
  if (slot >= slots()) return;
  bump(slot);  // whoever cached the old entry sees a change
  returned_.push_back(slot);
}

std::uint64_t version_table::read(std::uint32_t slot) const noexcept {
  if (slot >= slots()) return ~std::uint64_t{0};
  return word(words_.get(), slot).load(std::memory_order_acquire);
}

}  // namespace vmm::store::detail
