// resource_ipc: the flow of cuda-samples' streamOrderedAllocationIPC on vmm.
//
// The parent owns a stream-ordered memory_resource made shareable (handle_type posix_fd,
// as a cudaMemPool with cudaMemHandleTypePosixFileDescriptor). It starts child processes
// (this program again, with posix_spawn) and, for each, shares the resource once and then
// a pointer it allocated on its stream: vmm::ipc::resource_exporter::export_pointer sends
// (segment, offset, bytes) and the pointer's pages. Each child maps the pointer
// (imported_resource::receive_pointer), waits in stream order for the parent's work on it
// (vmm::ipc::handoff_consumer::acquire: an interprocess event, no host waits), fills it
// with its own value on its stream, lets go of it in stream order (before it tells the
// parent), and finishes the round. The parent's stream waits for each child's fill
// (handoff_producer::wait_consumed); the parent copies back, verifies and frees. A child
// also shows that it cannot allocate from the imported resource.
//
// Unlike a cudaMemPool IPC pool, the resource trims freely once its importers let go: at
// the end the parent gives every page back, and the memory is gone from every process.
// Runs on GPU 0 when there is one, otherwise on the OS host-memory provider.

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/handoff.hpp"
#include "vmm/ipc/resource_sharing.hpp"
#include "vmm/memory_resource.hpp"

extern char** environ;

namespace {

constexpr int child_socket_fd = 3;
constexpr int children = 3;

std::string mib(std::size_t bytes) {
  return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20));
}

std::uint8_t value_of(int child) {
  return static_cast<std::uint8_t>(0x31 + child);
}

// A child: map the parent's pointer, fill it in stream order, let go, finish.
int run_child(int index) {
  const int socket = child_socket_fd;
  vmm::ipc::imported_resource shared = vmm::ipc::imported_resource::receive(socket);
  const auto& provider = shared.provider();
  const vmm::owned_stream stream(provider->executor());
  vmm::ipc::imported_pointer pointer = shared.receive_pointer(socket, stream.get());
  if (index == 0) {
    try {
      (void)shared.allocate(stream.get(), 1 << 20);
    } catch (const vmm::invalid_argument& refused) {
      fmt::print("child {}: {}\n", index, refused.what());
    }
  }
  vmm::ipc::handoff_consumer handoff(socket, provider);
  handoff.acquire(stream.get());  // the stream waits for the parent's work on the pointer
  provider->executor().fill(pointer.data(), value_of(index), pointer.size(), stream.get());
  fmt::print("child {} (pid {}): filled {} at {} with {:#04x}, in stream order\n", index, ::getpid(),
             mib(pointer.size()), pointer.data(), value_of(index));
  std::fflush(stdout);
  pointer.reset();               // unmapped once the fill has passed
  handoff.finish(stream.get());  // the parent's stream waits for the fill
  provider->executor().synchronize(stream.get());
  // Stay until the parent is done with the hand-off's events (it closes the socket).
  try {
    (void)vmm::ipc::receive_message(socket, 0, vmm::ipc::no_timeout);
  } catch (const vmm::ipc::peer_closed&) {}
  return 0;
}

struct child_process {
  pid_t pid = -1;
  vmm::unique_fd socket;
};

child_process spawn_child(int index) {
  auto [mine, theirs] = vmm::ipc::make_socket_pair();
  const vmm::unique_fd child_end(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, 10));
  if (!child_end) throw vmm::os_error(errno, "fcntl(F_DUPFD_CLOEXEC)");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_end.get(), child_socket_fd);
  std::string self = "/proc/self/exe";
  std::string flag = "--child";
  std::string number = std::to_string(index);
  char* argv[] = {self.data(), flag.data(), number.data(), nullptr};
  child_process child;
  std::fflush(stdout);
  const int spawned = ::posix_spawn(&child.pid, self.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) throw vmm::os_error(spawned, "posix_spawn of a child");
  child.socket = std::move(mine);
  return child;
}

int run_parent() {
  std::string why;
  const bool gpu = vmm::gpu_available(&why);
  const vmm::location where = gpu ? vmm::location::device(0) : vmm::location::os_host();
  if (!gpu) fmt::print("no GPU ({}): using the OS host-memory provider\n", why);
  vmm::memory_resource resource(where, {.handle_type = vmm::handle_kind::posix_fd});
  vmm::ipc::resource_exporter exporter(resource);
  const auto& provider = resource.provider();
  const vmm::owned_stream stream(provider->executor());
  fmt::print("parent {}: a shareable memory resource of {} memory\n", ::getpid(), vmm::to_string(where));

  struct share {
    child_process child;
    void* data = nullptr;
    std::size_t bytes = 0;
    std::optional<vmm::ipc::handoff_producer> handoff;
  };
  std::vector<share> shares(children);
  bool all_match = true;
  {
    for (int i = 0; i < children; ++i) {
      share& s = shares[static_cast<std::size_t>(i)];
      s.child = spawn_child(i);
      // Sizes off page boundaries: the pointers share pages with their neighbours.
      s.bytes = static_cast<std::size_t>(i + 1) * (3 << 20) / 2 + 4096 * static_cast<std::size_t>(i) + 100;
      s.data = resource.allocate(stream.get(), s.bytes);
      provider->executor().fill(s.data, 0, s.bytes, stream.get());  // the parent's own work on it
      vmm::ipc::send_resource(s.child.socket.get(), exporter.export_resource());
      const vmm::ipc::exported_pointer exported = exporter.export_pointer(s.data, s.bytes);
      vmm::ipc::send_pointer(s.child.socket.get(), exported);
      fmt::print("parent: pointer {} of {} (segment {}, offset {:#x}, {} page(s)) shared with child {}\n",
                 s.data, mib(s.bytes), exported.description.segment, exported.description.offset,
                 exported.description.page_ids.size(), i);
      s.handoff.emplace(s.child.socket.get(), provider);
      s.handoff->publish(stream.get());  // after the fill above, in stream order
    }
    for (int i = 0; i < children; ++i) {
      share& s = shares[static_cast<std::size_t>(i)];
      s.handoff->wait_consumed(stream.get());  // the stream waits for the child's fill
      std::vector<std::uint8_t> seen(s.bytes);
      provider->executor().copy(seen.data(), s.data, s.bytes, stream.get());
      provider->executor().synchronize(stream.get());
      const bool match =
          std::all_of(seen.begin(), seen.end(), [&](std::uint8_t b) { return b == value_of(i); });
      all_match = all_match && match;
      fmt::print("parent: child {}'s {} read back {}\n", i, mib(s.bytes), match ? "as written" : "WRONG");
      resource.deallocate(stream.get(), s.data, s.bytes);  // the child let go already
    }
    for (share& s : shares) {
      s.handoff.reset();
      s.child.socket.reset();  // the child sees the end and exits
      int status = 0;
      ::waitpid(s.child.pid, &status, 0);
      all_match = all_match && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
  }
  // Every free has passed once the device is idle: then everything can go back.
  resource.synchronize();
  const vmm::memory_resource_statistics before = resource.statistics();
  resource.trim_to(0);
  resource.pool()->trim_to(0);
  exporter.purge();
  const vmm::memory_resource_statistics after = resource.statistics();
  fmt::print("parent: trimmed from {} reserved to {}; the pool holds {}; the export cache holds {} fds\n",
             mib(before.reserved_current), mib(after.reserved_current),
             mib(resource.pool()->statistics().reserved_current), exporter.statistics().cached_chunks);
  fmt::print("{}\n", all_match ? "every child's bytes arrived, in stream order" : "MISMATCH");
  return all_match && after.reserved_current == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc == 3 && std::strcmp(argv[1], "--child") == 0) return run_child(std::atoi(argv[2]));
  return run_parent();
} catch (const std::exception& error) {
  fmt::print(stderr, "resource_ipc: {}\n", error.what());
  return 1;
}
