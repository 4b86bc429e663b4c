// vmm_bench_ipc: handing GPU memory to another process, against what a user would use
// instead, in one run.
//
// What is measured: the hand-off latency, from "the exporter has the buffer" to "the
// importer can launch a kernel on it" (the pointer is mapped with access set), for 64 MiB
// and 4 GiB:
//   vmm_cold       a new buffer each iteration: the first cuMemExportToShareableHandle of
//                  its handle (many times a later export: docs/GPU-FACTS.md) is inside the time;
//   vmm_warm       one buffer, its fd already in the exporter's cache: a dup, no driver call;
//                  rows for one chunk (what a buffer grown in one step maps), for 2 MiB
//                  chunks (32 handles: the per-handle cost), and for a reservation of the
//                  whole GPU (what an importer that follows growth reserves);
//   vmm_handoff    the pattern vmm is built for: the importer maps the buffer once, and
//                  each hand-off is an interprocess event (vmm::ipc::handoff_producer /
//                  handoff_consumer): "ready" recorded after the writes, the importer's
//                  stream made to wait for it; no import, no mapping per hand-off;
//   legacy_first   cudaIpcGetMemHandle / cudaIpcOpenMemHandle on a new cudaMalloc each
//                  iteration;
//   legacy         the same on one cudaMalloc (what Vineyard does);
//   mempool_cold   a new IPC pool each iteration: cudaMemPoolExportToShareableHandle +
//                  cudaMemPoolExportPointer, cudaMemPoolImportFromShareableHandle +
//                  cudaMemPoolImportPointer;
//   mempool_warm   the pool imported once; per iteration export + import of the pointer;
//   round_trip     an empty message there and a reply back: the socket's share of every row.
//
// How: the benchmark spawns this same program as the importer once per benchmark
// (posix_spawn, a socket pair as its descriptor 3; CUDA is started in it before timing).
// Each iteration is one socket round trip timed on the exporter's side (manual time):
// export and send, then the importer receives, imports, reserves, maps and sets access,
// and replies "ready". So every row includes the transport, which any real use pays, and
// round_trip says how much of it that is. The importer also times its own part (from the
// arrival of the last message to "ready") and reports it: counter importer_us. Outside the
// time, the importer checks the first and last 4 KiB of what it mapped with a kernel (a
// wrong byte fails the benchmark), then unmaps, and the next iteration starts only once it
// has. first_us is the first iteration alone (first-time costs of the importing process:
// legacy's slow first open). A summary at the end gives each row's mean and its ratio to
// legacy at the same size.
// Without a GPU every benchmark is skipped with the reason.

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "importer_process.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/ipc/exporter.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/handoff.hpp"
#include "vmm/ipc/importer.hpp"

namespace {

using vmm::bench::bench_failure;
using vmm::bench::check;
using vmm::bench::importer_process;
using vmm::bench::peer_socket_fd;
using vmm::bench::receive_value;
using vmm::bench::send_value;

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr const char* peer_flag = "--ipc-bench-peer";
constexpr std::uint32_t fill_word = 0x5a5a5a5a;

#define CHECK(call) check((call), #call)

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

enum class method : std::uint32_t { round_trip, vmm, vmm_handoff, legacy, mempool_cold, mempool_warm };

// The wire, one host, host byte order.
struct setup_message {
  method kind;
  std::uint32_t reserved;
  std::uint64_t size;
};
struct ready_message {
  std::uint64_t importer_ns;
};
struct idle_message {
  std::uint64_t mismatches;
};

// ---- the importer ------------------------------------------------------------------------

__global__ void count_mismatches(const std::uint32_t* data, std::size_t words, std::uint32_t expected,
                                 unsigned long long* mismatches) {
  constexpr std::size_t edge = 1024;  // 4 KiB at each end
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < 2 * edge && i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t at = i < edge ? i : words - 2 * edge + i;
    if (data[at] != expected) atomicAdd(mismatches, 1ull);
  }
}

int run_peer() {
  const int socket = peer_socket_fd;
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  cudaFuncAttributes attributes{};
  CHECK(cudaFuncGetAttributes(&attributes, count_mismatches));
  unsigned long long* mismatches = nullptr;
  CHECK(cudaMalloc(&mismatches, sizeof *mismatches));
  const auto provider = vmm::provider_for(vmm::location::device(0));

  vmm::ipc::message setup_raw = vmm::ipc::receive_message(socket);
  setup_message setup{};
  if (setup_raw.payload.size() != sizeof setup) throw bench_failure("a setup message of the wrong size");
  std::memcpy(&setup, setup_raw.payload.data(), sizeof setup);
  // vmm_handoff: the buffer is imported once, then handed over with events.
  std::optional<vmm::ipc::imported_buffer> kept;
  std::optional<vmm::ipc::handoff_consumer> consumer;
  if (setup.kind == method::vmm_handoff) {
    kept.emplace(vmm::ipc::imported_buffer::receive(socket, {.provider = provider}));
    consumer.emplace(socket, provider);
  }
  cudaMemPool_t shared_pool = nullptr;
  if (setup.kind == method::mempool_warm) {
    if (setup_raw.fds.size() != 1) throw bench_failure("the pool's fd is missing");
    CHECK(cudaMemPoolImportFromShareableHandle(
        &shared_pool, reinterpret_cast<void*>(static_cast<std::uintptr_t>(setup_raw.fds[0].get())),
        cudaMemHandleTypePosixFileDescriptor, 0));
  }

  for (;;) {
    void* pointer = nullptr;
    std::optional<vmm::ipc::imported_buffer> imported;
    cudaMemPool_t pool = nullptr;
    clock_type::time_point arrived;
    try {
      switch (setup.kind) {
        case method::round_trip:
          (void)vmm::ipc::receive_message(socket, 0);
          arrived = clock_type::now();
          break;
        case method::vmm: {
          vmm::ipc::received_manifest received = vmm::ipc::receive_manifest(socket);
          arrived = clock_type::now();
          imported.emplace(received.description, std::move(received.fds),
                           vmm::ipc::import_options{.provider = provider});
          pointer = imported->data();
          break;
        }
        case method::vmm_handoff:
          consumer->acquire(nullptr);  // receives "ready"; the stream waits for the writes
          arrived = clock_type::now();
          pointer = kept->data();
          break;
        case method::legacy: {
          const auto handle = receive_value<cudaIpcMemHandle_t>(socket);
          arrived = clock_type::now();
          CHECK(cudaIpcOpenMemHandle(&pointer, handle, cudaIpcMemLazyEnablePeerAccess));
          break;
        }
        case method::mempool_cold: {
          std::vector<vmm::unique_fd> fds;
          auto data = receive_value<cudaMemPoolPtrExportData>(socket, 1, &fds);
          arrived = clock_type::now();
          CHECK(cudaMemPoolImportFromShareableHandle(
              &pool, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fds[0].get())),
              cudaMemHandleTypePosixFileDescriptor, 0));
          CHECK(cudaMemPoolImportPointer(&pointer, pool, &data));
          break;
        }
        case method::mempool_warm: {
          auto data = receive_value<cudaMemPoolPtrExportData>(socket);
          arrived = clock_type::now();
          CHECK(cudaMemPoolImportPointer(&pointer, shared_pool, &data));
          break;
        }
      }
    } catch (const vmm::ipc::peer_closed&) {
      break;  // the benchmark is over
    }
    const auto importer_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - arrived).count();
    send_value(socket, ready_message{static_cast<std::uint64_t>(importer_ns)});

    (void)receive_value<std::uint32_t>(socket);  // the exporter's "release"
    idle_message idle{0};
    if (pointer != nullptr) {
      CHECK(cudaMemset(mismatches, 0, sizeof *mismatches));
      count_mismatches<<<8, 256>>>(static_cast<const std::uint32_t*>(pointer), setup.size / 4, fill_word,
                                   mismatches);
      CHECK(cudaGetLastError());
      unsigned long long seen = 0;
      CHECK(cudaMemcpy(&seen, mismatches, sizeof seen, cudaMemcpyDeviceToHost));
      idle.mismatches = seen;
    }
    imported.reset();
    if (setup.kind == method::vmm_handoff) consumer->finish(nullptr);  // "done", after the check
    if (setup.kind == method::legacy) CHECK(cudaIpcCloseMemHandle(pointer));
    if (setup.kind == method::mempool_cold || setup.kind == method::mempool_warm) CHECK(cudaFree(pointer));
    if (pool != nullptr) CHECK(cudaMemPoolDestroy(pool));
    send_value(socket, idle);
  }
  if (shared_pool != nullptr) CHECK(cudaMemPoolDestroy(shared_pool));
  CHECK(cudaFree(mismatches));
  return 0;
}

// ---- the exporter ------------------------------------------------------------------------

// One way of handing memory over. hand_off() is timed; the rest is not.
class contender {
 public:
  virtual ~contender() = default;
  [[nodiscard]] virtual method kind() const = 0;
  virtual void setup(int socket, std::size_t size) { send_value(socket, setup_message{kind(), 0, size}); }
  virtual void before_each() {}
  virtual void hand_off(int socket) = 0;
  // After the importer was told to let go, before its "idle" arrives.
  virtual void released(int /*socket*/) {}
  virtual void after_each() {}
};

class round_trip final : public contender {
 public:
  [[nodiscard]] method kind() const override { return method::round_trip; }
  void hand_off(int socket) override { vmm::ipc::send_message(socket, {}); }
};

class vmm_share final : public contender {
 public:
  vmm_share(std::size_t size, std::size_t chunk, bool cold, bool reserve_whole_gpu)
      : size_(size), chunk_(chunk == 0 ? size : chunk), cold_(cold), reserve_whole_gpu_(reserve_whole_gpu) {
    // Chunks go back to the driver when a buffer lets go: each cold buffer is new memory.
    pool_ = vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0)), {.release_threshold = 0});
  }
  [[nodiscard]] method kind() const override { return method::vmm; }
  void setup(int socket, std::size_t size) override {
    contender::setup(socket, size);
    if (!cold_) {
      make_buffer();
      (void)exporter_.export_buffer(*buffer_);  // the cache is warm from here on
    }
  }
  void before_each() override {
    if (cold_) make_buffer();
  }
  void hand_off(int socket) override { vmm::ipc::send_manifest(socket, exporter_.export_buffer(*buffer_)); }
  void after_each() override {
    if (cold_) buffer_.reset();
  }

 private:
  void make_buffer() {
    buffer_.reset();
    buffer_.emplace(pool_, vmm::growable_buffer_options{.max_size = reserve_whole_gpu_ ? 0 : size_,
                                                        .policy = vmm::chunk_policy::fixed(chunk_)});
    buffer_->resize(size_);
    CHECK(cudaMemset(buffer_->data(), 0x5a, size_));
    CHECK(cudaDeviceSynchronize());
  }
  std::size_t size_;
  std::size_t chunk_;
  bool cold_;
  bool reserve_whole_gpu_;
  std::shared_ptr<vmm::chunk_pool> pool_;
  vmm::ipc::exporter exporter_;
  std::optional<vmm::growable_buffer> buffer_;
};

// The buffer is shared once; each hand-off is an interprocess event.
class vmm_handoff final : public contender {
 public:
  explicit vmm_handoff(std::size_t size) : size_(size) {
    pool_ = vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0)), {.release_threshold = 0});
  }
  [[nodiscard]] method kind() const override { return method::vmm_handoff; }
  void setup(int socket, std::size_t size) override {
    contender::setup(socket, size);
    buffer_.emplace(
        pool_, vmm::growable_buffer_options{.max_size = size_, .policy = vmm::chunk_policy::fixed(size_)});
    buffer_->resize(size_);
    CHECK(cudaMemset(buffer_->data(), 0x5a, size_));
    CHECK(cudaDeviceSynchronize());
    vmm::ipc::send_manifest(socket, exporter_.export_buffer(*buffer_));
    producer_.emplace(socket, pool_->provider());
  }
  void hand_off(int) override { producer_->publish(nullptr); }
  void released(int) override { producer_->wait_consumed(nullptr); }

 private:
  std::size_t size_;
  std::shared_ptr<vmm::chunk_pool> pool_;
  vmm::ipc::exporter exporter_;
  std::optional<vmm::growable_buffer> buffer_;
  std::optional<vmm::ipc::handoff_producer> producer_;
};

class legacy_ipc final : public contender {
 public:
  legacy_ipc(std::size_t size, bool fresh_each) : size_(size), fresh_each_(fresh_each) {}
  ~legacy_ipc() override { release(); }
  [[nodiscard]] method kind() const override { return method::legacy; }
  void before_each() override {
    if (data_ != nullptr && !fresh_each_) return;
    release();
    CHECK(cudaMalloc(&data_, size_));
    CHECK(cudaMemset(data_, 0x5a, size_));
    CHECK(cudaDeviceSynchronize());
  }
  void hand_off(int socket) override {
    cudaIpcMemHandle_t handle{};
    CHECK(cudaIpcGetMemHandle(&handle, data_));
    send_value(socket, handle);
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
  }
  std::size_t size_;
  bool fresh_each_;
  void* data_ = nullptr;
};

class mempool_ipc final : public contender {
 public:
  mempool_ipc(std::size_t size, bool cold) : size_(size), cold_(cold) {}
  ~mempool_ipc() override { release(); }
  [[nodiscard]] method kind() const override { return cold_ ? method::mempool_cold : method::mempool_warm; }
  void setup(int socket, std::size_t size) override {
    if (cold_) return contender::setup(socket, size);
    allocate();
    const vmm::unique_fd fd = export_pool();
    const int fds[] = {fd.get()};
    send_value(socket, setup_message{kind(), 0, size}, fds);
  }
  void before_each() override {
    if (cold_) allocate();
  }
  void hand_off(int socket) override {
    cudaMemPoolPtrExportData data{};
    if (cold_) {
      const vmm::unique_fd fd = export_pool();
      CHECK(cudaMemPoolExportPointer(&data, pointer_));
      const int fds[] = {fd.get()};
      send_value(socket, data, fds);
    } else {
      CHECK(cudaMemPoolExportPointer(&data, pointer_));
      send_value(socket, data);
    }
  }
  void after_each() override {
    if (cold_) release();
  }

 private:
  void allocate() {
    cudaMemPoolProps properties{};
    properties.allocType = cudaMemAllocationTypePinned;
    properties.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    properties.location.type = cudaMemLocationTypeDevice;
    properties.location.id = 0;
    CHECK(cudaMemPoolCreate(&pool_, &properties));
    CHECK(cudaMallocFromPoolAsync(&pointer_, size_, pool_, nullptr));
    CHECK(cudaMemsetAsync(pointer_, 0x5a, size_, nullptr));
    CHECK(cudaStreamSynchronize(nullptr));
  }
  vmm::unique_fd export_pool() {
    int fd = -1;
    CHECK(cudaMemPoolExportToShareableHandle(&fd, pool_, cudaMemHandleTypePosixFileDescriptor, 0));
    return vmm::unique_fd(fd);
  }
  void release() noexcept {
    if (pointer_ != nullptr) cudaFree(pointer_);
    if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
    pointer_ = nullptr;
    pool_ = nullptr;
  }
  std::size_t size_;
  bool cold_;
  cudaMemPool_t pool_ = nullptr;
  void* pointer_ = nullptr;
};

// Mean microseconds of each benchmark, for the summary.
std::map<std::string, double>& results() {
  static std::map<std::string, double> means;
  return means;
}

void run_hand_off(benchmark::State& state, const std::string& name, std::size_t size,
                  const std::function<std::unique_ptr<contender>()>& make) {
  std::string why;
  if (!vmm::gpu_available(&why)) {
    state.SkipWithError(("no GPU: " + why).c_str());
    return;
  }
  try {
    CHECK(cudaSetDevice(0));
    std::unique_ptr<contender> way = make();
    importer_process importer(peer_flag);
    way->setup(importer.socket(), size);
    double total_seconds = 0;
    double first_seconds = -1;
    double importer_seconds = 0;
    std::uint64_t mismatches = 0;
    for (auto _ : state) {
      way->before_each();
      const auto start = clock_type::now();
      way->hand_off(importer.socket());
      const auto ready = receive_value<ready_message>(importer.socket());
      const double seconds = seconds_since(start);
      state.SetIterationTime(seconds);
      total_seconds += seconds;
      if (first_seconds < 0) first_seconds = seconds;
      importer_seconds += static_cast<double>(ready.importer_ns) * 1e-9;
      send_value(importer.socket(), std::uint32_t{1});  // release
      way->released(importer.socket());
      mismatches += receive_value<idle_message>(importer.socket()).mismatches;
      way->after_each();
    }
    if (mismatches != 0) {
      state.SkipWithError(("the importer saw " + std::to_string(mismatches) + " wrong words").c_str());
      return;
    }
    const auto iterations = static_cast<double>(state.iterations());
    state.counters["first_us"] = first_seconds * 1e6;
    state.counters["importer_us"] = importer_seconds / iterations * 1e6;
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(size));
    results()[name] = total_seconds / iterations * 1e6;
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

std::string size_name(std::size_t size) {
  return size >= 1024 * mib ? std::to_string(size / (1024 * mib)) + "GiB"
                            : std::to_string(size / mib) + "MiB";
}

void register_all() {
  const auto add = [](const std::string& method_name, std::size_t size, int iterations,
                      std::function<std::unique_ptr<contender>()> make) {
    const std::string name = "hand_off/" + method_name + "/" + size_name(size);
    benchmark::RegisterBenchmark(
        name.c_str(), [name, size, make](benchmark::State& state) { run_hand_off(state, name, size, make); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(iterations);
  };
  add("round_trip", 64 * mib, 500, [] { return std::make_unique<round_trip>(); });
  for (const std::size_t size : {64 * mib, 4096 * mib}) {
    add("vmm_cold", size, 30, [size] { return std::make_unique<vmm_share>(size, 0, true, false); });
    add("vmm_warm", size, 200, [size] { return std::make_unique<vmm_share>(size, 0, false, false); });
    add("vmm_handoff", size, 200, [size] { return std::make_unique<vmm_handoff>(size); });
    if (size == 64 * mib) {
      add("vmm_warm_2MiB_chunks", size, 200,
          [size] { return std::make_unique<vmm_share>(size, 2 * mib, false, false); });
      add("vmm_warm_reserve_whole_gpu", size, 200,
          [size] { return std::make_unique<vmm_share>(size, 0, false, true); });
    }
    add("legacy_first", size, 30, [size] { return std::make_unique<legacy_ipc>(size, true); });
    add("legacy", size, 200, [size] { return std::make_unique<legacy_ipc>(size, false); });
    add("mempool_cold", size, 30, [size] { return std::make_unique<mempool_ipc>(size, true); });
    add("mempool_warm", size, 200, [size] { return std::make_unique<mempool_ipc>(size, false); });
  }
}

void print_summary() {
  if (results().empty()) return;
  std::printf("\nhand-off latency, mean of the iterations (ratio: to legacy cudaIpc at the same size)\n");
  for (const std::size_t size : {64 * mib, 4096 * mib}) {
    std::string suffix(1, '/');
    suffix += size_name(size);
    const auto legacy = results().find("hand_off/legacy" + suffix);
    for (const auto& [name, mean] : results()) {
      if (name.size() < suffix.size() ||
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      if (legacy != results().end())
        std::printf("  %-44s %10.1f us   %5.2fx legacy\n", name.c_str(), mean, mean / legacy->second);
      else
        std::printf("  %-44s %10.1f us\n", name.c_str(), mean);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], peer_flag) == 0) {
    try {
      return run_peer();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "vmm_bench_ipc importer: %s\n", error.what());
      return 1;
    }
  }
  ::signal(SIGPIPE, SIG_IGN);
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary();
  return 0;
}
