// grow_and_share: the main demo. Reserves a large address range, maps physical chunks into
// it as it grows (the address never changes, the bytes already there stay), then shares the
// memory with a child process: each chunk is exported as a file descriptor, sent over a Unix
// socket, imported and mapped read-only by the child, which sends back a checksum.
// Runs on GPU 0 when there is one, otherwise on the OS host-memory provider.

#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "vmm/address_range.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/error.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/mapping.hpp"
#include "vmm/physical_allocation.hpp"

extern char** environ;

namespace {

struct share_request {
  std::uint32_t location_kind;
  std::uint32_t chunk_count;
  std::uint64_t chunk_size;
};

std::uint64_t checksum(const std::vector<std::uint8_t>& bytes) {
  std::uint64_t hash = 14695981039346656037ull;
  for (std::uint8_t byte : bytes) hash = (hash ^ byte) * 1099511628211ull;
  return hash;
}

std::vector<std::uint8_t> read_back(vmm::memory_provider& provider, std::uintptr_t address, std::size_t n) {
  std::vector<std::uint8_t> bytes(n);
  provider.executor().copy(bytes.data(), reinterpret_cast<const void*>(address), n, {});
  provider.executor().synchronize({});
  return bytes;
}

// The child: import every chunk into one new range, read-only, and reply with a checksum.
int run_child(const char* socket_path) {
  vmm::unique_fd socket = vmm::ipc::connect_unix(socket_path);
  vmm::ipc::message message = vmm::ipc::receive_message(socket.get());
  share_request request{};
  if (message.payload.size() != sizeof request) throw vmm::invalid_argument("malformed request");
  std::memcpy(&request, message.payload.data(), sizeof request);
  if (message.fds.size() != request.chunk_count) throw vmm::invalid_argument("fd count mismatch");
  const auto provider =
      vmm::provider_for(request.location_kind == 0 ? vmm::location::device(0) : vmm::location::os_host());
  vmm::address_range range(provider, request.chunk_count * request.chunk_size);
  std::vector<vmm::mapping> mappings;
  for (std::size_t i = 0; i < message.fds.size(); ++i) {
    auto chunk = vmm::physical_allocation::import_fd(provider, message.fds[i].get(), request.chunk_size);
    mappings.emplace_back(chunk, range.address() + i * request.chunk_size, vmm::access_mode::read_only);
  }
  const std::uint64_t sum = checksum(read_back(*provider, range.address(), range.size()));
  fmt::print("  child {}: imported {} chunks at {:#x} (read-only), checksum {:016x}\n", ::getpid(),
             request.chunk_count, range.address(), sum);
  vmm::ipc::send_message(socket.get(), std::as_bytes(std::span(&sum, 1)));
  return 0;
}

int run_parent(const char* self) {
  std::string why;
  const bool gpu = vmm::gpu_available(&why);
  const vmm::location where = gpu ? vmm::location::device(0) : vmm::location::os_host();
  if (!gpu) fmt::print("no GPU ({}): using the OS host-memory provider\n", why);
  const auto provider = vmm::provider_for(where);
  const std::size_t chunk = provider->capabilities().granularity;
  fmt::print("memory: {}, chunk {} MiB\n", vmm::to_string(where), chunk >> 20);

  // Reserve room for 64 chunks; map them as the buffer grows.
  vmm::address_range range(provider, 64 * chunk);
  std::vector<vmm::physical_allocation> chunks;
  std::vector<vmm::mapping> mappings;
  auto grow_to = [&](std::size_t count) {
    const std::size_t first = chunks.size();
    for (std::size_t i = first; i < count; ++i) {
      chunks.emplace_back(provider, chunk);
      mappings.emplace_back(chunks.back(), range.address() + i * chunk, std::span<const vmm::access_grant>{});
    }
    // One access call over the whole new range: the driver's cost is per handle, not per call.
    provider->set_access(range.address() + first * chunk, (count - first) * chunk,
                         provider->capabilities().grants(vmm::access_mode::read_write));
  };

  grow_to(1);
  provider->executor().fill(range.data(), 0x5a, chunk, {});
  const auto before = read_back(*provider, range.address(), chunk);
  grow_to(8);
  provider->executor().fill(reinterpret_cast<void*>(range.address() + chunk), 0xa5, 7 * chunk, {});
  const bool kept = read_back(*provider, range.address(), chunk) == before;
  fmt::print("grew from 1 to 8 chunks at the same address {:#x}; first chunk intact: {}\n", range.address(),
             kept ? "yes" : "NO");
  if (!kept) return 1;

  const std::uint64_t expected = checksum(read_back(*provider, range.address(), 8 * chunk));
  const auto directory = std::filesystem::temp_directory_path() / fmt::format("vmm-demo-{}", ::getpid());
  std::filesystem::create_directories(directory);
  const std::string socket_path = (directory / "share.sock").string();
  vmm::unique_fd listener = vmm::ipc::listen_unix(socket_path);

  char child_flag[] = "--child";
  char* argv[] = {const_cast<char*>(self), child_flag, const_cast<char*>(socket_path.c_str()), nullptr};
  pid_t child = -1;
  std::fflush(stdout);  // the child writes to the same stdout
  if (::posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv, environ) != 0)
    throw vmm::os_error(errno, "posix_spawn of the child");
  vmm::unique_fd connection = vmm::ipc::accept_unix(listener.get());
  std::vector<vmm::unique_fd> exported;
  std::vector<int> fds;
  for (const auto& c : chunks) {
    exported.push_back(c.export_fd());
    fds.push_back(exported.back().get());
  }
  const share_request request{gpu ? 0u : 1u, static_cast<std::uint32_t>(chunks.size()), chunk};
  vmm::ipc::send_message(connection.get(), std::as_bytes(std::span(&request, 1)), fds);
  vmm::ipc::message reply = vmm::ipc::receive_message(connection.get(), 0);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::filesystem::remove_all(directory);
  std::uint64_t seen = 0;
  if (reply.payload.size() == sizeof seen) std::memcpy(&seen, reply.payload.data(), sizeof seen);
  const bool same = WIFEXITED(status) && WEXITSTATUS(status) == 0 && seen == expected;
  fmt::print("shared {} chunks with child {}: it saw {} bytes {}\n", chunks.size(), child, 8 * chunk,
             same ? "identical to ours" : "DIFFERENT");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc == 3 && std::strcmp(argv[1], "--child") == 0) return run_child(argv[2]);
  return run_parent(argv[0]);
} catch (const std::exception& error) {
  fmt::print(stderr, "grow_and_share: {}\n", error.what());
  return 1;
}
