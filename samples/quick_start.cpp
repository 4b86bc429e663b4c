// quick_start: the README's C++ quick starts, compiled and run as a test (sample.quick_start).
//
// The regions between "// [readme:NAME]" and "// [/readme:NAME]" are the README's code
// blocks; tests/tools/readme_check.py fails when the two differ. Everything outside them is
// what a real program needs around them (choosing the memory, starting the other process,
// checking the results).
//
// 1. A vector that grows in place: the address never changes, nothing is copied twice.
// 2. A buffer shared with another process through a vmm-store daemon: this program runs the
//    daemon on a thread (as `vmm-store serve` does), then starts itself twice with
//    posix_spawn, once as the producer and once as the consumer.
// Runs on GPU 0 when there is one, otherwise on the OS host-memory provider: same code.

#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/host_mirror.hpp"
#include "vmm/store/server.hpp"

extern char** environ;

namespace {

constexpr std::size_t words = std::size_t{1} << 20;

bool grow_a_vector() {
  // [readme:vector]
  const vmm::location where = vmm::gpu_available() ? vmm::location::device(0) : vmm::location::os_host();
  vmm::device_vector<float> v(where, {.max_size = std::size_t{1} << 30});  // reserves 1 GiB, maps nothing
  const float* const address = v.data();

  std::vector<float> batch(1 << 18, 1.0f);       // 1 MiB
  for (int i = 0; i < 64; ++i) v.append(batch);  // maps a chunk only when full, copies nothing twice
  v.resize(v.size() + batch.size(), vmm::element_init::zeroed);

  // v.data() == address still: kernels and captured CUDA graphs keep their pointers.
  std::vector<float> back = v.to_host();  // waits for the vector's stream
  // [/readme:vector]
  const float sum = std::accumulate(back.begin(), back.end(), 0.0f);
  fmt::print("vector: {} MiB in {} chunks on {}, data() {}, sum {}\n", v.size() * sizeof(float) >> 20,
             v.chunk_count(), vmm::to_string(where), v.data() == address ? "never moved" : "MOVED", sum);
  return v.data() == address && sum == 64.0f * static_cast<float>(batch.size());
}

int producer(const std::string& socket) {
  // [readme:share-producer]
  const vmm::location where = vmm::gpu_available() ? vmm::location::device(0) : vmm::location::os_host();
  vmm::store::client store({.socket_path = socket});
  vmm::store::buffer out = store.create("squares", words * sizeof(std::uint32_t), where);

  std::vector<std::uint32_t> squares(words);
  for (std::size_t i = 0; i < words; ++i) squares[i] = static_cast<std::uint32_t>(i * i);
  out.provider()->executor().copy(out.data(), squares.data(), out.size(), {});  // or a kernel of yours
  out.provider()->executor().synchronize({});
  store.seal("squares");  // committed: it outlives this process, and nobody writes any more
  // [/readme:share-producer]
  fmt::print("producer (pid {}): {} MiB on {}, sealed\n", ::getpid(), out.size() >> 20,
             vmm::to_string(where));
  return 0;
}

int consumer(const std::string& socket) {
  // [readme:share-consumer]
  vmm::store::client store({.socket_path = socket});
  vmm::store::buffer in = store.get("squares");  // mapped read-only: a write faults
  vmm::store::host_mirror host(in);              // a host copy, to look at it here
  host.synchronize();
  const auto* squares = static_cast<const std::uint32_t*>(host.data());
  // [/readme:share-consumer]
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < in.size() / sizeof(std::uint32_t); ++i)
    wrong += squares[i] != static_cast<std::uint32_t>(i * i) ? 1 : 0;
  fmt::print("consumer (pid {}): {} MiB read-only at {}, {} wrong words\n", ::getpid(), in.size() >> 20,
             in.data(), wrong);
  return wrong == 0 && in.size() == words * sizeof(std::uint32_t) &&
                 in.access() == vmm::access_mode::read_only
             ? 0
             : 1;
}

int spawn_and_wait(std::vector<std::string> argv) {
  std::vector<char*> pointers;
  for (std::string& word : argv) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  pid_t pid = 0;
  std::fflush(stdout);
  if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, pointers.data(), environ) != 0) return 1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

bool share_with_another_process(const std::string& self) {
  char directory[] = "/tmp/vmm-quick-start-XXXXXX";
  if (::mkdtemp(directory) == nullptr) throw vmm::os_error(errno, "mkdtemp");
  const std::string socket = std::string(directory) + "/socket";
  int status = 1;
  {
    vmm::store::server daemon({.socket_path = socket});
    std::thread loop([&] { daemon.run(); });
    status = spawn_and_wait({self, "producer", socket});
    if (status == 0) status = spawn_and_wait({self, "consumer", socket});
    daemon.stop();
    loop.join();
  }
  ::unlink(socket.c_str());
  ::rmdir(directory);
  return status == 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::vector<std::string> args(argv, argv + argc);
  if (args.size() == 3 && args[1] == "producer") return producer(args[2]);
  if (args.size() == 3 && args[1] == "consumer") return consumer(args[2]);
  std::string why;
  if (!vmm::gpu_available(&why)) fmt::print("no GPU ({}): using the OS host-memory provider\n", why);
  const bool ok = grow_a_vector() && share_with_another_process(args[0]);
  fmt::print("{}\n", ok ? "quick start: ok" : "quick start: FAILED");
  return ok ? 0 : 1;
} catch (const std::exception& error) {
  fmt::print(stderr, "quick_start: {}\n", error.what());
  return 1;
}
