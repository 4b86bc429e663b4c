#pragma once
// What the vmm-store daemon (server.cpp) asks of the OS apart from its sockets' traffic: its
// descriptor count, the time, a stale socket file, descriptors received with a request.

#include <vmm/unique_fd.hpp>

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vmm::store::detail {

// Entries of /proc/self/fd (0 when it cannot be read). Allocates nothing.
std::size_t open_fd_count();
// CLOCK_REALTIME in nanoseconds.
std::uint64_t realtime_ns();
// Replaces a socket file nothing listens at; refuses a live one (vmm::invalid_argument) and
// a path that is no socket; vmm::os_error when it cannot be removed.
void clear_stale_socket(const std::string& path);
// Appends the descriptors of `message`'s SCM_RIGHTS control data to `fds`, which owns them
// from then on. Throws nothing but std::bad_alloc (a descriptor that finds no room is closed).
void take_descriptors(const msghdr& message, std::vector<unique_fd>& fds);

}  // namespace vmm::store::detail
