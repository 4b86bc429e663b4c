#pragma once
// The one narrow layer between vmm and the OS (as mimalloc's src/prim/): every system call
// the libraries make goes through a function here, with the libc call's signature and
// result (-1 and errno on failure). Nothing else in vmm calls these functions of libc
// directly, so a test can make the Nth of them fail (fault_injection.hpp), and the rest of
// the code never sees a platform #ifdef.
//
// Internal (vmm/detail/): installed for vmm::ipc and vmm::store, which build on it, and
// not part of vmm's interface: it may change in any release without notice.

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>

namespace vmm::os {

int memfd_create(const char* name, unsigned int flags) noexcept;
int fallocate(int fd, int mode, off_t offset, off_t length) noexcept;
int ftruncate(int fd, off_t length) noexcept;  // counted as the fallocate site
void* mmap(void* address, std::size_t length, int protection, int flags, int fd, off_t offset) noexcept;
int munmap(void* address, std::size_t length) noexcept;
int mprotect(void* address, std::size_t length, int protection) noexcept;
int madvise(void* address, std::size_t length, int advice) noexcept;  // not a fault site: advice
// fcntl with an int argument (F_DUPFD_CLOEXEC, F_ADD_SEALS, F_GET_SEALS, F_GETFL, ...).
int fcntl(int fd, int command, int argument = 0) noexcept;
int fstat(int fd, struct stat* status) noexcept;
ssize_t sendmsg(int socket, const msghdr* message, int flags) noexcept;
ssize_t recvmsg(int socket, msghdr* message, int flags) noexcept;
int poll(pollfd* fds, nfds_t count, int timeout_ms) noexcept;

}  // namespace vmm::os
