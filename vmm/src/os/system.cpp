#include "vmm/detail/system.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "fault_injection.hpp"

namespace vmm::os {
namespace {

// Returns true (with errno set) when this call must fail.
bool injected(detail::fault::site where) noexcept {
  int error = 0;
  if (!detail::fault::fail_here(where, error)) return false;
  errno = error;
  return true;
}

}  // namespace

int memfd_create(const char* name, unsigned int flags) noexcept {
  if (injected(detail::fault::memfd_create)) return -1;
  return ::memfd_create(name, flags);
}

int fallocate(int fd, int mode, off_t offset, off_t length) noexcept {
  if (injected(detail::fault::fallocate)) return -1;
  return ::fallocate(fd, mode, offset, length);
}

int ftruncate(int fd, off_t length) noexcept {
  if (injected(detail::fault::fallocate)) return -1;
  return ::ftruncate(fd, length);
}

void* mmap(void* address, std::size_t length, int protection, int flags, int fd, off_t offset) noexcept {
  if (injected(detail::fault::mmap)) return MAP_FAILED;
  return ::mmap(address, length, protection, flags, fd, offset);
}

int munmap(void* address, std::size_t length) noexcept {
  if (injected(detail::fault::munmap)) return -1;
  return ::munmap(address, length);
}

int mprotect(void* address, std::size_t length, int protection) noexcept {
  if (injected(detail::fault::mprotect)) return -1;
  return ::mprotect(address, length, protection);
}

int madvise(void* address, std::size_t length, int advice) noexcept {
  return ::madvise(address, length, advice);  // advice only: no fault site
}

int fcntl(int fd, int command, int argument) noexcept {
  if (injected(detail::fault::fcntl)) return -1;
  return ::fcntl(fd, command, argument);
}

int fstat(int fd, struct stat* status) noexcept {
  if (injected(detail::fault::fstat)) return -1;
  return ::fstat(fd, status);
}

ssize_t sendmsg(int socket, const msghdr* message, int flags) noexcept {
  if (injected(detail::fault::sendmsg)) return -1;
  return ::sendmsg(socket, message, flags);
}

ssize_t recvmsg(int socket, msghdr* message, int flags) noexcept {
  if (injected(detail::fault::recvmsg)) return -1;
  return ::recvmsg(socket, message, flags);
}

int poll(pollfd* fds, nfds_t count, int timeout_ms) noexcept {
  if (injected(detail::fault::poll)) return -1;
  return ::poll(fds, count, timeout_ms);
}

}  // namespace vmm::os
