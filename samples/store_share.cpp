// store_share: one producer process fills a named buffer in a vmm-store daemon, two consumer
// processes read it read-only. The producer grows the buffer while a consumer holds it: the
// consumer maps the new tail at the same address (refresh), nothing is copied.
//
// The sample runs the daemon itself (vmm::store::server on a thread of this process, as
// `vmm-store serve` does) and starts itself three times with posix_spawn: "producer",
// "consumer 0", "consumer 1". On a GPU the buffer lives on GPU 0 and the producer fills it
// with a kernel (store_share_kernels.cu, when built with CUDA C++); each consumer reads it
// on its own GPU when there are two. Without a GPU everything runs on the OS host-memory
// provider and the CPU fills and checks.

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/host_mirror.hpp"
#include "vmm/store/server.hpp"

extern char** environ;

#ifdef VMM_SAMPLE_HAVE_CUDA
// store_share_kernels.cu: value(i) into every uint32 of [data, data + n) on the current GPU.
void fill_on_gpu(std::uint32_t* data, std::size_t n, std::uint32_t seed);
// The number of uint32 of [data, data + n) that differ from value(i), counted on GPU `device`.
std::size_t mismatches_on_gpu(const std::uint32_t* data, std::size_t n, std::uint32_t seed, int device);
#endif

namespace {

constexpr const char* name = "store_share/frames";
constexpr std::uint32_t seed = 0x5eed;

std::uint32_t value(std::size_t i) {
  return static_cast<std::uint32_t>(i * 2654435761u) ^ seed;
}

// Fills [0, n) of `held` with value(i): a kernel on a GPU, the CPU on host memory.
void fill(const vmm::store::buffer& held, std::size_t from, std::size_t to) {
  auto* words = static_cast<std::uint32_t*>(held.data());
  if (held.where().kind == vmm::memory_kind::os_host) {
    for (std::size_t i = from; i < to; ++i) words[i] = value(i);
    return;
  }
#ifdef VMM_SAMPLE_HAVE_CUDA
  (void)from;
  fill_on_gpu(words, to, seed);
#else
  // Built without CUDA C++: fill through a host mirror (one copy) instead of a kernel.
  vmm::store::host_mirror host(held, {}, {.copy_in = false});
  auto* staged = static_cast<std::uint32_t*>(host.data());
  for (std::size_t i = 0; i < to; ++i) staged[i] = value(i);
#endif
}

// The words of [0, n) of `held` that differ from value(i), read on GPU `device` or the CPU.
std::size_t mismatches(const vmm::store::buffer& held, std::size_t n, int device) {
#ifdef VMM_SAMPLE_HAVE_CUDA
  if (held.where().kind != vmm::memory_kind::os_host)
    return mismatches_on_gpu(static_cast<const std::uint32_t*>(held.data()), n, seed, device);
#endif
  (void)device;
  vmm::store::host_mirror host(held);  // OS memory: a plain copy; GPU memory: pinned host
  host.synchronize();
  const auto* words = static_cast<const std::uint32_t*>(host.data());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += words[i] != value(i) ? 1 : 0;
  return wrong;
}

int producer(const std::string& socket, vmm::location where) {
  vmm::store::client store({.socket_path = socket});
  const std::size_t g = vmm::provider_for(where)->capabilities().granularity;
  vmm::store::buffer out = store.create(name, 4 * g, where, {.max_size = 64 * g});
  fill(out, 0, 4 * g / 4);
  store.grow(name, 8 * g);  // in place: a consumer holding it would refresh and see it
  out.refresh();
  fill(out, 4 * g / 4, 8 * g / 4);
  store.seal(name);  // committed: it outlives this process
  fmt::print("producer (pid {}): filled {} MiB on {}, sealed\n", ::getpid(), (8 * g) >> 20,
             vmm::to_string(where));
  return 0;
}

int consumer(const std::string& socket, int index) {
  vmm::store::client store({.socket_path = socket});
  vmm::store::buffer in = store.get(name);  // read-only: the mapping itself forbids writes
  int device = 0;
  if (in.where().kind == vmm::memory_kind::device) {
    const int count = vmm::device_count();
    device = count >= 2 ? index % count : 0;
    if (device != 0) {
      // The import grants the memory's own GPU; this consumer reads on another one. Access
      // is the mapping's business (cuMemSetAccess), read-only here as well.
      const vmm::access_grant grants[] = {{vmm::accessor::device(0), vmm::access_mode::read_only},
                                          {vmm::accessor::device(device), vmm::access_mode::read_only}};
      in.provider()->set_access(reinterpret_cast<std::uintptr_t>(in.data()), in.capacity(), grants);
    }
  }
  const std::size_t wrong = mismatches(in, in.size() / 4, device);
  fmt::print("consumer {} (pid {}): {} MiB read-only on {}{}: {} wrong words\n", index, ::getpid(),
             in.size() >> 20, vmm::to_string(in.where()),
             in.where().kind == vmm::memory_kind::device ? fmt::format(", read on GPU {}", device) : "",
             wrong);
  return wrong == 0 && in.access() == vmm::access_mode::read_only ? 0 : 1;
}

int spawn_and_wait(std::vector<std::string> argv) {
  std::vector<char*> pointers;
  for (std::string& word : argv) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, pointers.data(), environ) != 0) return 1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::vector<std::string> args(argv, argv + argc);
  if (args.size() >= 4 && args[1] == "producer")
    return producer(args[2], args[3] == "device" ? vmm::location::device(0) : vmm::location::os_host());
  if (args.size() >= 4 && args[1] == "consumer") return consumer(args[2], std::stoi(args[3]));

  std::string why;
  const bool gpu = vmm::gpu_available(&why);
  if (!gpu) fmt::print("no GPU ({}): using the OS host-memory provider\n", why);
  std::fflush(stdout);  // before the children print
  char directory[] = "/tmp/vmm-store-sample-XXXXXX";
  if (::mkdtemp(directory) == nullptr) throw vmm::os_error(errno, "mkdtemp");
  const std::string socket = std::string(directory) + "/socket";
  int status = 1;
  {
    vmm::store::server daemon({.socket_path = socket});
    std::thread loop([&] { daemon.run(); });
    status = spawn_and_wait({args[0], "producer", socket, gpu ? "device" : "os_host"});
    // Both consumers at once, each its own process.
    int second_status = 1;
    std::thread second([&] { second_status = spawn_and_wait({args[0], "consumer", socket, "1"}); });
    status |= spawn_and_wait({args[0], "consumer", socket, "0"});
    second.join();
    status |= second_status;
    {
      vmm::store::client store({.socket_path = socket});
      const vmm::store::buffer_info info = store.stat(name);
      fmt::print("daemon: \"{}\" {} MiB, {} holders now, {}\n", info.name, info.size >> 20, info.holders,
                 info.sealed ? "sealed" : "open");
      store.remove(name);
    }
    daemon.stop();
    loop.join();
  }
  ::rmdir(directory);
  fmt::print("{}\n", status == 0 ? "every consumer read what the producer wrote" : "FAILED");
  return status;
} catch (const std::exception& error) {
  fmt::print(stderr, "store_share: {}\n", error.what());
  return 1;
}
