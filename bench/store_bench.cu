// vmm_bench_store: the vmm-store daemon against the legacy path that Vineyard's GPU blobs use
// (cudaIpcGetMemHandle in a daemon, cudaIpcOpenMemHandle in the client, over the same kind
// of Unix socket), in one run.
//
// How: the benchmark spawns this same program as the server process ("serve"): it runs a
// vmm::store::server on one thread and a legacy daemon on another (one cudaMalloc per size,
// allocated on the first request; each request is answered with its cudaIpcMemHandle). The
// benchmark process is the client of both. Rows:
//   store_get_first/<MiB>     get + release of a sealed buffer with the client's import
//                             cache emptied before each (outside the time): the daemon
//                             sends its cached fds, the client imports, maps, sets access
//   store_get_repeated/<MiB>  get + release with the import cached and the buffer unchanged
//                             (the daemon's version table says so): a local get, that is
//                             a hold message and a release message, neither with a reply
//   store_get_kept/<MiB>      the same gets with every buffer kept until the row ends (its
//                             releases are sent after the time): what the release message
//                             that dropping a buffer sends costs the repeated get
//   store_get_asked/<MiB>     get + release with the import cached, of a buffer the version
//                             table does not vouch for (unsealed, of another client): one
//                             round trip, no fd
//   legacy_get_first/<MiB>    handle request + cudaIpcOpenMemHandle (closed outside the time)
//   legacy_get_repeated/<MiB> handle request, the pointer opened once before (the best a
//                             legacy client can do: a handle opens once per process)
//   store_create/<MiB>        create + release + remove, warm daemon pool
//   store_16_clients          16 processes get and release one buffer in a loop for 2 s,
//                             all started after each made its first get:
//                             gets/s (target >= 20,000) and the daemon's CPU seconds
//   mirror/<MiB>              host_mirror copy-in of a GPU buffer into pinned host memory
//   pinned_memcpy/<MiB>       cudaMemcpy from cudaMallocHost memory to cudaMalloc memory
// Targets (docs/store.md): repeated get at or below legacy; >= 20,000 gets/s; mirror >=
// 0.95x pinned cudaMemcpy. Without a GPU the legacy and mirror rows skip with the reason and
// the store rows run on the OS host-memory provider.

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/retirement.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/host_mirror.hpp"
#include "vmm/store/server.hpp"

extern char** environ;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
std::string program;  // argv[0]
std::string directory;

bool have_gpu() {
  static const bool gpu = vmm::gpu_available();
  return gpu;
}
vmm::location where() {
  return have_gpu() ? vmm::location::device(0) : vmm::location::os_host();
}
std::string store_socket() {
  return directory + "/store";
}
std::string legacy_socket() {
  return directory + "/legacy";
}

using vmm::bench::check;

// ---- the server process ------------------------------------------------------------------

void legacy_connection(vmm::unique_fd socket, std::map<std::uint64_t, void*>& buffers, std::mutex& mutex) {
  try {
    for (;;) {
      const vmm::ipc::message asked = vmm::ipc::receive_message(socket.get(), 0, vmm::ipc::no_timeout);
      std::uint64_t bytes = 0;
      if (asked.payload.size() != sizeof bytes) return;
      std::memcpy(&bytes, asked.payload.data(), sizeof bytes);
      cudaIpcMemHandle_t handle{};
      {
        std::lock_guard lock(mutex);
        void*& memory = buffers[bytes];
        if (memory == nullptr) check(cudaMalloc(&memory, bytes), "cudaMalloc");
        check(cudaIpcGetMemHandle(&handle, memory), "cudaIpcGetMemHandle");
      }
      vmm::ipc::send_message(socket.get(), std::as_bytes(std::span(&handle, 1)));
    }
  } catch (const std::exception&) {
    // The client went away.
  }
}

int serve() {
  vmm::store::server daemon({.socket_path = store_socket()});
  std::thread store_loop([&] { daemon.run(); });
  std::map<std::uint64_t, void*> buffers;
  std::mutex mutex;
  if (have_gpu()) {
    check(cudaSetDevice(0), "cudaSetDevice");
    const vmm::unique_fd listener = vmm::ipc::listen_unix(legacy_socket());
    std::thread([&] {
      for (;;)
        std::thread(legacy_connection, vmm::ipc::accept_unix(listener.get()), std::ref(buffers),
                    std::ref(mutex))
            .detach();
    }).detach();
    std::puts("ready");
    std::fflush(stdout);
    store_loop.join();
  } else {
    std::puts("ready");
    std::fflush(stdout);
    store_loop.join();
  }
  return 0;
}

// ---- the clients -------------------------------------------------------------------------

pid_t spawn(std::vector<std::string> argv, int stdout_fd = -1, int stdin_fd = -1) {
  std::vector<char*> pointers;
  for (std::string& word : argv) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (stdout_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stdout_fd, 1);
  if (stdin_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stdin_fd, 0);
  pid_t pid = 0;
  const int result = ::posix_spawn(&pid, pointers[0], &actions, nullptr, pointers.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (result != 0) throw vmm::os_error(result, "posix_spawn");
  return pid;
}

struct server_process {
  pid_t pid = -1;
  server_process() {
    int ends[2];
    if (::pipe(ends) != 0) throw vmm::os_error(errno, "pipe");
    pid = spawn({program, "serve", directory}, ends[1]);
    ::close(ends[1]);
    char line[16] = {};
    if (::read(ends[0], line, sizeof line) <= 0) throw std::runtime_error("the server did not start");
    ::close(ends[0]);
  }
  ~server_process() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  // utime + stime of the server process, in seconds.
  [[nodiscard]] double cpu_seconds() const {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    std::istringstream fields(text.substr(text.rfind(')') + 2));
    std::string skip;
    for (int i = 0; i < 11; ++i) fields >> skip;
    double utime = 0, stime = 0;
    fields >> utime >> stime;
    return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }
};

server_process* server = nullptr;
vmm::store::client* store = nullptr;
vmm::store::client* other = nullptr;     // a second client: not the creator of any buffer
std::vector<vmm::store::buffer> sealed;  // the creator's holds on the shared buffers

std::string buffer_name(std::size_t bytes) {
  return "bench-" + std::to_string(bytes / mib);
}

void ensure_buffer(std::size_t bytes) {
  const std::string name = buffer_name(bytes);
  for (const auto& held : sealed)
    if (held.name() == name) return;
  sealed.push_back(store->create(name, bytes, where()));
  store->seal(name);
}

void store_get(benchmark::State& state, bool repeated) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * mib;
  ensure_buffer(bytes);
  for (auto _ : state) {
    if (!repeated) {
      state.PauseTiming();
      store->drop_cache();
      vmm::collect_retired(true);
      state.ResumeTiming();
    }
    vmm::store::buffer got = store->get(buffer_name(bytes));
    benchmark::DoNotOptimize(got.data());
  }
}

// The repeated get that asks the daemon: of an unsealed buffer, by a client that did not
// create it (its creator's exit would take the name, which no request orders).
void BM_store_get_asked(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * mib;
  const std::string name = "open-" + std::to_string(bytes / mib);
  sealed.push_back(store->create(name, bytes, where()));
  { benchmark::DoNotOptimize(other->get(name).data()); }  // the first get: imports, untimed
  for (auto _ : state) {
    vmm::store::buffer got = other->get(name);
    benchmark::DoNotOptimize(got.data());
  }
  sealed.pop_back();
  store->remove(name);
}

void BM_store_get_kept(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * mib;
  ensure_buffer(bytes);
  std::vector<vmm::store::buffer> kept;
  kept.reserve(1 << 20);
  for (auto _ : state) {
    kept.push_back(store->get(buffer_name(bytes)));
    benchmark::DoNotOptimize(kept.back().data());
  }
  kept.clear();  // after the loop: not timed
}

void BM_store_get_first(benchmark::State& state) {
  store_get(state, false);
}
void BM_store_get_repeated(benchmark::State& state) {
  store_get(state, true);
}

cudaIpcMemHandle_t legacy_handle(int socket, std::uint64_t bytes) {
  vmm::ipc::send_message(socket, std::as_bytes(std::span(&bytes, 1)));
  const vmm::ipc::message got = vmm::ipc::receive_message(socket, 0);
  cudaIpcMemHandle_t handle{};
  std::memcpy(&handle, got.payload.data(), sizeof handle);
  return handle;
}

void legacy_get(benchmark::State& state, bool repeated) {
  if (!have_gpu()) {
    state.SkipWithError("no GPU: the legacy path needs cudaIpc");
    return;
  }
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * mib;
  const vmm::unique_fd socket = vmm::ipc::connect_unix(legacy_socket());
  void* opened = nullptr;
  if (repeated)
    check(cudaIpcOpenMemHandle(&opened, legacy_handle(socket.get(), bytes), cudaIpcMemLazyEnablePeerAccess),
          "open");
  for (auto _ : state) {
    const cudaIpcMemHandle_t handle = legacy_handle(socket.get(), bytes);
    if (!repeated) {
      check(cudaIpcOpenMemHandle(&opened, handle, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      state.PauseTiming();
      check(cudaIpcCloseMemHandle(opened), "cudaIpcCloseMemHandle");
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(opened);
  }
  if (repeated) check(cudaIpcCloseMemHandle(opened), "cudaIpcCloseMemHandle");
}

void BM_legacy_get_first(benchmark::State& state) {
  legacy_get(state, false);
}
void BM_legacy_get_repeated(benchmark::State& state) {
  legacy_get(state, true);
}

void BM_store_create(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * mib;
  for (auto _ : state) {
    vmm::store::buffer made = store->create("bench-create", bytes, where());
    made.release();
    store->remove("bench-create");
  }
}

// One client of store_16_clients: connects and gets once (the driver's start and the first
// import are not what is measured), says "ready", waits for the go byte on stdin, then gets
// and releases for `seconds`.
int get_loop(const std::string& socket_path, const std::string& name, double seconds) {
  vmm::store::client mine({.socket_path = socket_path});
  { benchmark::DoNotOptimize(mine.get(name).data()); }
  std::printf("ready\n");
  std::fflush(stdout);
  char go = 0;
  if (::read(0, &go, 1) != 1) return 1;
  std::uint64_t gets = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 64; ++i) {
      vmm::store::buffer got = mine.get(name);
      benchmark::DoNotOptimize(got.data());
    }
    gets += 64;
  }
  std::printf("%llu\n", static_cast<unsigned long long>(gets));
  return 0;
}

void BM_store_16_clients(benchmark::State& state) {
  constexpr int clients = 16;
  constexpr double seconds = 2.0;
  ensure_buffer(64 * mib);
  for (auto _ : state) {
    int go[2];
    if (::pipe(go) != 0) throw vmm::os_error(errno, "pipe");
    std::vector<std::pair<pid_t, int>> children;
    for (int i = 0; i < clients; ++i) {
      int ends[2];
      if (::pipe(ends) != 0) throw vmm::os_error(errno, "pipe");
      children.emplace_back(
          spawn({program, "getloop", store_socket(), buffer_name(64 * mib), std::to_string(seconds)}, ends[1],
                go[0]),
          ends[0]);
      ::close(ends[1]);
    }
    ::close(go[0]);
    // Every client started and made its first get: then all start at once.
    for (auto& [pid, out] : children) {
      char c = 0;
      while (::read(out, &c, 1) == 1 && c != '\n') {}
    }
    const double cpu_before = server->cpu_seconds();
    const std::string bytes(clients, 'g');
    if (::write(go[1], bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()))
      throw vmm::os_error(errno, "write");
    ::close(go[1]);
    std::uint64_t gets = 0;
    for (auto& [pid, out] : children) {
      char text[64] = {};
      const ssize_t n = ::read(out, text, sizeof text - 1);
      ::close(out);
      ::waitpid(pid, nullptr, 0);
      if (n > 0) gets += std::strtoull(text, nullptr, 10);
    }
    state.SetIterationTime(seconds);
    state.counters["gets_per_s"] = static_cast<double>(gets) / seconds;
    state.counters["daemon_cpu_s"] = server->cpu_seconds() - cpu_before;
  }
}

void BM_mirror(benchmark::State& state) {
  if (!have_gpu()) {
    state.SkipWithError("no GPU: the mirror is compared with cudaMemcpy");
    return;
  }
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * mib;
  ensure_buffer(bytes);
  vmm::store::buffer got = store->get(buffer_name(bytes));
  vmm::store::host_mirror host(got, {}, {.copy_in = false});
  for (auto _ : state) {
    host.copy_in();
    host.synchronize();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void BM_pinned_memcpy(benchmark::State& state) {
  if (!have_gpu()) {
    state.SkipWithError("no GPU");
    return;
  }
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * mib;
  void* device = nullptr;
  void* host = nullptr;
  check(cudaMalloc(&device, bytes), "cudaMalloc");
  check(cudaMallocHost(&host, bytes), "cudaMallocHost");
  for (auto _ : state) check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaFreeHost(host), "cudaFreeHost");
  check(cudaFree(device), "cudaFree");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

BENCHMARK(BM_store_get_first)->Arg(64)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_legacy_get_first)->Arg(64)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_store_get_repeated)->Arg(64)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_store_get_kept)->Arg(64)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_store_get_asked)->Arg(64)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_legacy_get_repeated)->Arg(64)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_store_create)->Arg(64)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_store_16_clients)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);
BENCHMARK(BM_mirror)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_pinned_memcpy)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) try {
  program = argv[0];
  if (argc >= 3 && std::string(argv[1]) == "serve") {
    directory = argv[2];
    return serve();
  }
  if (argc >= 5 && std::string(argv[1]) == "getloop") return get_loop(argv[2], argv[3], std::stod(argv[4]));
  ::signal(SIGPIPE, SIG_IGN);
  char temporary[] = "/tmp/vmm-store-bench-XXXXXX";
  if (::mkdtemp(temporary) == nullptr) throw vmm::os_error(errno, "mkdtemp");
  directory = temporary;
  int status = 0;
  {
    server_process daemon;
    server = &daemon;
    vmm::store::client client({.socket_path = store_socket()});
    vmm::store::client second({.socket_path = store_socket()});
    store = &client;
    other = &second;
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    sealed.clear();
    store = nullptr;
    other = nullptr;
  }
  std::remove(store_socket().c_str());
  std::remove(legacy_socket().c_str());
  ::rmdir(directory.c_str());
  return status;
} catch (const std::exception& error) {
  std::fprintf(stderr, "vmm_bench_store: %s\n", error.what());
  return 1;
}
