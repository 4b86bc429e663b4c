// The second process of the sharing tests: connects to the Unix socket given on its command
// line, receives a physical memory fd and its size, imports it through the provider for
// the location named, maps it read-only, and sends back the checksum of the bytes it sees.
// Usage: import_peer <os_host|device|pinned_host> <socket path>
// Exit status: 0 when the reply was sent, 2 on bad usage, 1 on any error (printed).

#include <cstdio>
#include <cstring>
#include <exception>

#include "../memory_io.hpp"
#include "vmm/address_range.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/mapping.hpp"
#include "vmm/physical_allocation.hpp"

namespace {

vmm::location parse_location(const char* name) {
  if (std::strcmp(name, "os_host") == 0) return vmm::location::os_host();
  if (std::strcmp(name, "device") == 0) return vmm::location::device(0);
  if (std::strcmp(name, "pinned_host") == 0) return vmm::location::pinned_host(0);
  throw vmm::invalid_argument(std::string("unknown location ") + name);
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <os_host|device|pinned_host> <socket path>\n", argv[0]);
    return 2;
  }
  const auto provider = vmm::provider_for(parse_location(argv[1]));
  vmm::unique_fd socket = vmm::ipc::connect_unix(argv[2]);
  vmm::ipc::message request = vmm::ipc::receive_message(socket.get(), 1);
  std::uint64_t size = 0;
  if (request.payload.size() != sizeof size) throw vmm::invalid_argument("request is not one size");
  std::memcpy(&size, request.payload.data(), sizeof size);

  auto memory = vmm::physical_allocation::import_fd(provider, request.fds[0].get(), size);
  vmm::address_range range(provider, size);
  vmm::mapping mapped(memory, range.address(), vmm::access_mode::read_only);
  const auto bytes = vmm::testing::read_bytes(*provider, range.address(), size);
  const std::uint64_t sum = vmm::testing::checksum(bytes.data(), bytes.size());
  vmm::ipc::send_message(socket.get(), std::as_bytes(std::span(&sum, 1)));
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "import_peer: %s\n", error.what());
  return 1;
}
