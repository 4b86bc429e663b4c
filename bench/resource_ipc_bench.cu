// vmm_bench_resource_ipc: sharing one allocation of a stream-ordered pool with another
// process, vmm::memory_resource with vmm::ipc::resource_exporter / imported_resource against
// what a CUDA user would use instead, cudaMemPool IPC (cudaMemPoolExportPointer /
// cudaMemPoolImportPointer on a pool made with handleTypes = POSIX fd), in one run.
//
// What is measured: export-pointer + import-pointer latency, from "the exporter holds the
// allocation" to "the importer can launch a kernel on it" (pages mapped, access set), for
// 64 MiB and 4 GiB. Each pool is shared once, before timing (the resource message, or
// cudaMemPoolExportToShareableHandle + cudaMemPoolImportFromShareableHandle); each
// iteration then shares one pointer:
//   mempool_first     a new allocation each iteration, of memory the pool did not hold
//                     (the pool is trimmed between iterations): cudaMemPoolExportPointer,
//                     the 64-byte export data sent, cudaMemPoolImportPointer;
//   mempool_repeated  one allocation, exported and imported again each iteration (the
//                     importer cudaFree()s it between);
//   vmm_first         a new allocation each iteration, of fresh pages (the resource and its
//                     chunk pool give pages back between iterations): export_pointer (the
//                     first export of each page's handle), the pointer message and its
//                     manifest with one fd per page, import_pointer (import, map, set access);
//   vmm_repeated      one allocation; the exporter's cache serves each page's fd (a dup),
//                     the importer imports, maps and sets access again (it let go between);
//   vmm_cached        as vmm_repeated, the importer made with keep_mapped_bytes = the
//                     pointer's size: the pages it let go of stay mapped in its cache, and
//                     importing them again takes them back and closes the fds (no driver call);
//   vmm_still_mapped  one allocation the importer keeps imported: importing it again finds
//                     every page mapped and only closes the fds (no driver call);
//   round_trip        an empty message there and a reply back: the socket's share.
// Pages are the resource's granularity (2 MiB on the GPU): a pointer of n bytes travels as
// n / 2 MiB handles, which is what vmm pays per handle (docs/GPU-FACTS.md) and cudaMemPool
// does not show; the ratio says what that costs.
//
// How: as bench/ipc_bench.cu, the benchmark spawns this same program as the importer once
// per benchmark (posix_spawn, a socket pair as its descriptor 3; CUDA is started in it
// before timing). Each iteration is one socket round trip timed on the exporter's side
// (manual time): export and send, then the importer receives, imports and replies "ready".
// The importer times its own import (counter importer_us), the exporter its export
// (export_us, the send excluded), and arrival_us is when the importer had the message,
// from the start of the hand-off (steady_clock is one clock for both processes of a host).
// On a GPU the importer may be back at its receive only some time after the next hand-off
// began, for cudaMemPool and vmm alike (not for round_trip, whose importer runs no CUDA
// work): arrival_us shows it, and export_us + importer_us are each side's own cost. Outside the time the
// importer checks the first and last 4 KiB of what it mapped (a kernel on the GPU, memcmp on the host: a
// wrong byte fails the benchmark) and lets go; the exporter frees (and for the _first rows trims) once the
// importer said it let go. first_us is the first iteration alone. Each vmm row runs after the cudaMemPool row
// of its kind and size, and carries the ratio as counter x_mempool; a summary at the end prints every ratio
// again. Without a GPU, the vmm rows run on the OS host-memory provider (no cudaMemPool there).

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
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
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/resource_sharing.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/retirement.hpp"

namespace {

using vmm::bench::bench_failure;
using vmm::bench::check;
using vmm::bench::importer_process;
using vmm::bench::peer_socket_fd;
using vmm::bench::receive_value;
using vmm::bench::send_value;

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr const char* peer_flag = "--resource-ipc-bench-peer";
constexpr std::uint8_t fill_byte = 0x5a;
constexpr std::size_t edge_bytes = 4096;

#define CHECK(call) check((call), #call)

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

enum class method : std::uint32_t {
  round_trip,
  vmm_first,
  vmm_repeated,
  vmm_still_mapped,
  mempool_first,
  mempool_repeated,
  vmm_cached
};

const char* name_of(method m) {
  switch (m) {
    case method::round_trip:
      return "round_trip";
    case method::vmm_first:
      return "vmm_first";
    case method::vmm_repeated:
      return "vmm_repeated";
    case method::vmm_still_mapped:
      return "vmm_still_mapped";
    case method::mempool_first:
      return "mempool_first";
    case method::mempool_repeated:
      return "mempool_repeated";
    case method::vmm_cached:
      return "vmm_cached";
  }
  return "?";
}

bool is_vmm(method m) {
  return m == method::vmm_first || m == method::vmm_repeated || m == method::vmm_cached ||
         m == method::vmm_still_mapped;
}

// The wire between the two processes of this program: one host, host byte order.
struct setup_message {
  method kind;
  std::uint32_t on_gpu;  // 1: device 0, 0: the OS host-memory provider
  std::uint64_t size;
};
struct ready_message {
  std::uint64_t importer_ns;
  std::int64_t arrived_ns;  // steady_clock, the same clock in both processes of one host
};
struct idle_message {
  std::uint64_t mismatches;
};

vmm::location location_of(bool on_gpu) {
  return on_gpu ? vmm::location::device(0) : vmm::location::os_host();
}

// ---- the importer ------------------------------------------------------------------------

__global__ void count_wrong_bytes(const unsigned char* data, std::size_t bytes, unsigned char expected,
                                  unsigned long long* wrong) {
  const std::size_t edge = bytes < 2 * edge_bytes ? bytes : 2 * edge_bytes;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < edge;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t at = i < edge / 2 ? i : bytes - edge + i;
    if (data[at] != expected) atomicAdd(wrong, 1ull);
  }
}

// Bytes of the first and last 4 KiB of [data, data + bytes) that are not fill_byte.
std::uint64_t wrong_edges(const void* data, std::size_t bytes, bool on_gpu,
                          unsigned long long* device_counter) {
  if (on_gpu) {
    CHECK(cudaMemset(device_counter, 0, sizeof *device_counter));
    count_wrong_bytes<<<8, 256>>>(static_cast<const unsigned char*>(data), bytes, fill_byte, device_counter);
    CHECK(cudaGetLastError());
    unsigned long long wrong = 0;
    CHECK(cudaMemcpy(&wrong, device_counter, sizeof wrong, cudaMemcpyDeviceToHost));
    return wrong;
  }
  const auto* p = static_cast<const unsigned char*>(data);
  const std::size_t edge = std::min(bytes, edge_bytes);
  std::uint64_t wrong = 0;
  for (std::size_t i = 0; i < edge; ++i) wrong += (p[i] != fill_byte) + (p[bytes - 1 - i] != fill_byte);
  return wrong;
}

int run_peer() {
  const int socket = peer_socket_fd;
  vmm::ipc::message setup_raw = vmm::ipc::receive_message(socket);
  setup_message setup{};
  if (setup_raw.payload.size() != sizeof setup) throw bench_failure("a setup message of the wrong size");
  std::memcpy(&setup, setup_raw.payload.data(), sizeof setup);
  const bool on_gpu = setup.on_gpu != 0;
  unsigned long long* device_counter = nullptr;
  if (on_gpu) {
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(nullptr));
    cudaFuncAttributes attributes{};
    CHECK(cudaFuncGetAttributes(&attributes, count_wrong_bytes));
    CHECK(cudaMalloc(&device_counter, sizeof *device_counter));
  }

  std::optional<vmm::ipc::imported_resource> shared;
  vmm::ipc::imported_pointer kept;  // vmm_still_mapped
  cudaMemPool_t pool = nullptr;
  if (is_vmm(setup.kind)) {
    const std::size_t keep = setup.kind == method::vmm_cached ? setup.size : 0;
    shared.emplace(vmm::ipc::imported_resource::receive(
        socket, {.provider = vmm::provider_for(location_of(on_gpu)), .keep_mapped_bytes = keep}));
    if (setup.kind == method::vmm_still_mapped) kept = shared->receive_pointer(socket);
  } else if (setup.kind != method::round_trip) {
    if (setup_raw.fds.size() != 1) throw bench_failure("the pool's fd is missing");
    CHECK(cudaMemPoolImportFromShareableHandle(
        &pool, reinterpret_cast<void*>(static_cast<std::uintptr_t>(setup_raw.fds[0].get())),
        cudaMemHandleTypePosixFileDescriptor, 0));
  }

  for (;;) {
    vmm::ipc::imported_pointer imported;
    void* pointer = nullptr;
    clock_type::time_point arrived;
    try {
      if (setup.kind == method::round_trip) {
        (void)vmm::ipc::receive_message(socket, 0);
        arrived = clock_type::now();
      } else if (is_vmm(setup.kind)) {
        vmm::ipc::received_pointer received =
            vmm::ipc::receive_pointer(socket, shared->description().granularity);
        arrived = clock_type::now();
        imported = shared->import_pointer(std::move(received));
        pointer = imported.data();
      } else {
        auto data = receive_value<cudaMemPoolPtrExportData>(socket);
        arrived = clock_type::now();
        CHECK(cudaMemPoolImportPointer(&pointer, pool, &data));
      }
    } catch (const vmm::ipc::peer_closed&) {
      break;  // the benchmark is over
    }
    const auto importer_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - arrived).count();
    send_value(socket,
               ready_message{
                   static_cast<std::uint64_t>(importer_ns),
                   std::chrono::duration_cast<std::chrono::nanoseconds>(arrived.time_since_epoch()).count()});

    (void)receive_value<std::uint32_t>(socket);  // the exporter's "let go"
    idle_message idle{0};
    if (pointer != nullptr) idle.mismatches = wrong_edges(pointer, setup.size, on_gpu, device_counter);
    if (imported) {
      imported.reset();
      vmm::collect_retired(true);  // unmapped before the exporter frees
    } else if (pointer != nullptr) {
      CHECK(cudaFree(pointer));
    }
    send_value(socket, idle);
  }
  kept.reset();
  if (pool != nullptr) CHECK(cudaMemPoolDestroy(pool));
  if (device_counter != nullptr) CHECK(cudaFree(device_counter));
  return 0;
}

// ---- the exporter ------------------------------------------------------------------------

// One way of sharing a pointer. hand_off() is timed; the rest is not.
class contender {
 public:
  virtual ~contender() = default;
  virtual void setup(int socket) = 0;
  virtual void before_each() {}
  // Exports and sends; returns the seconds the export took (the send excluded).
  virtual double hand_off(int socket) = 0;
  // After the importer let go.
  virtual void after_each() {}
};

class round_trip final : public contender {
 public:
  void setup(int socket) override { send_value(socket, setup_message{method::round_trip, 0, 0}); }
  double hand_off(int socket) override {
    vmm::ipc::send_message(socket, {});
    return 0;
  }
};

class vmm_pointer final : public contender {
 public:
  vmm_pointer(method kind, bool on_gpu, std::size_t size) : kind_(kind), on_gpu_(on_gpu), size_(size) {
    // Pages go back to the driver (or the OS) when the resource gives them up: each _first
    // allocation is new memory, whose handles were never exported.
    pool_ = vmm::chunk_pool::create(vmm::provider_for(location_of(on_gpu)), {.release_threshold = 0});
    resource_.emplace(pool_, vmm::memory_resource_properties{.handle_type = vmm::handle_kind::posix_fd});
    exporter_.emplace(*resource_);
  }
  ~vmm_pointer() override {
    if (data_ != nullptr) resource_->deallocate_sync(data_, size_);
    exporter_.reset();
  }
  void setup(int socket) override {
    send_value(socket, setup_message{kind_, on_gpu_ ? 1u : 0u, size_});
    vmm::ipc::send_resource(socket, exporter_->export_resource());
    if (kind_ == method::vmm_first) return;
    allocate();
    (void)exporter_->export_pointer(data_, size_);  // the cache is warm from here on
    if (kind_ == method::vmm_still_mapped)
      vmm::ipc::send_pointer(socket, exporter_->export_pointer(data_, size_));
  }
  void before_each() override {
    if (kind_ == method::vmm_first) allocate();
  }
  double hand_off(int socket) override {
    const auto start = clock_type::now();
    const auto pointer = exporter_->export_pointer(data_, size_);
    const double seconds = seconds_since(start);
    vmm::ipc::send_pointer(socket, pointer);
    return seconds;
  }
  void after_each() override {
    if (kind_ != method::vmm_first) return;
    resource_->deallocate_sync(data_, size_);
    data_ = nullptr;
    resource_->trim_to(0);
    exporter_->purge();
  }

 private:
  void allocate() {
    data_ = resource_->allocate_sync(size_);
    if (on_gpu_) {
      CHECK(cudaMemset(data_, fill_byte, size_));
      CHECK(cudaDeviceSynchronize());
    } else {
      std::memset(data_, fill_byte, size_);
    }
  }
  method kind_;
  bool on_gpu_;
  std::size_t size_;
  std::shared_ptr<vmm::chunk_pool> pool_;
  std::optional<vmm::memory_resource> resource_;
  std::optional<vmm::ipc::resource_exporter> exporter_;
  void* data_ = nullptr;
};

class mempool_pointer final : public contender {
 public:
  mempool_pointer(method kind, std::size_t size) : kind_(kind), size_(size) {
    cudaMemPoolProps properties{};
    properties.allocType = cudaMemAllocationTypePinned;
    properties.handleTypes = cudaMemHandleTypePosixFileDescriptor;  // cudaMemPoolExportPointer needs one
    properties.location.type = cudaMemLocationTypeDevice;
    properties.location.id = 0;
    CHECK(cudaMemPoolCreate(&pool_, &properties));
  }
  ~mempool_pointer() override {
    if (pointer_ != nullptr) cudaFree(pointer_);
    if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
  }
  void setup(int socket) override {
    int fd = -1;
    CHECK(cudaMemPoolExportToShareableHandle(&fd, pool_, cudaMemHandleTypePosixFileDescriptor, 0));
    const vmm::unique_fd owned(fd);
    const int fds[] = {owned.get()};
    send_value(socket, setup_message{kind_, 1, size_}, fds);
    if (kind_ == method::mempool_repeated) allocate();
  }
  void before_each() override {
    if (kind_ == method::mempool_first) allocate();
  }
  double hand_off(int socket) override {
    const auto start = clock_type::now();
    cudaMemPoolPtrExportData data{};
    CHECK(cudaMemPoolExportPointer(&data, pointer_));
    const double seconds = seconds_since(start);
    send_value(socket, data);
    return seconds;
  }
  void after_each() override {
    if (kind_ != method::mempool_first) return;
    CHECK(cudaFreeAsync(pointer_, nullptr));
    CHECK(cudaStreamSynchronize(nullptr));
    pointer_ = nullptr;
    CHECK(cudaMemPoolTrimTo(pool_, 0));  // the next allocation is new memory
  }

 private:
  void allocate() {
    CHECK(cudaMallocFromPoolAsync(&pointer_, size_, pool_, nullptr));
    CHECK(cudaMemsetAsync(pointer_, fill_byte, size_, nullptr));
    CHECK(cudaStreamSynchronize(nullptr));
  }
  method kind_;
  std::size_t size_;
  cudaMemPool_t pool_ = nullptr;
  void* pointer_ = nullptr;
};

std::string size_name(std::size_t size) {
  return size >= 1024 * mib ? std::to_string(size / (1024 * mib)) + "GiB"
                            : std::to_string(size / mib) + "MiB";
}

// Mean microseconds of each row, by (provider, method, size).
std::map<std::string, double>& results() {
  static std::map<std::string, double> means;
  return means;
}
std::string key_of(bool on_gpu, method kind, std::size_t size) {
  std::string key = std::string(on_gpu ? "gpu" : "os") + "/" + name_of(kind);
  return kind == method::round_trip ? key : key + "/" + size_name(size);
}

// The cudaMemPool row a vmm row is compared with.
method baseline_of(method kind) {
  return kind == method::vmm_first ? method::mempool_first : method::mempool_repeated;
}

void run_pointer(benchmark::State& state, bool on_gpu, method kind, std::size_t size,
                 const std::function<std::unique_ptr<contender>()>& make) {
  std::string why;
  if (on_gpu && !vmm::gpu_available(&why)) {
    state.SkipWithError(("no GPU: " + why).c_str());
    return;
  }
  try {
    if (on_gpu) CHECK(cudaSetDevice(0));
    std::unique_ptr<contender> way = make();
    importer_process importer(peer_flag);
    way->setup(importer.socket());
    double total_seconds = 0;
    double first_seconds = -1;
    double importer_seconds = 0;
    double export_seconds = 0;
    double arrival_seconds = 0;
    std::uint64_t mismatches = 0;
    for (auto _ : state) {
      way->before_each();
      const auto start = clock_type::now();
      export_seconds += way->hand_off(importer.socket());
      const auto ready = receive_value<ready_message>(importer.socket());
      const double seconds = seconds_since(start);
      arrival_seconds +=
          static_cast<double>(
              ready.arrived_ns -
              std::chrono::duration_cast<std::chrono::nanoseconds>(start.time_since_epoch()).count()) *
          1e-9;
      state.SetIterationTime(seconds);
      total_seconds += seconds;
      if (first_seconds < 0) first_seconds = seconds;
      importer_seconds += static_cast<double>(ready.importer_ns) * 1e-9;
      send_value(importer.socket(), std::uint32_t{1});  // let go
      mismatches += receive_value<idle_message>(importer.socket()).mismatches;
      way->after_each();
    }
    if (mismatches != 0) {
      state.SkipWithError(("the importer saw " + std::to_string(mismatches) + " wrong bytes").c_str());
      return;
    }
    const auto iterations = static_cast<double>(state.iterations());
    const double mean_us = total_seconds / iterations * 1e6;
    state.counters["first_us"] = first_seconds * 1e6;
    state.counters["importer_us"] = importer_seconds / iterations * 1e6;
    state.counters["export_us"] = export_seconds / iterations * 1e6;
    state.counters["arrival_us"] = arrival_seconds / iterations * 1e6;

    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(size));
    results()[key_of(on_gpu, kind, size)] = mean_us;
    if (is_vmm(kind)) {
      const auto baseline = results().find(key_of(on_gpu, baseline_of(kind), size));
      if (baseline != results().end()) state.counters["x_mempool"] = mean_us / baseline->second;
    }
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

struct row {
  method kind;
  int iterations_64mib;
  int iterations_4gib;
};

void register_all() {
  std::string why;
  const bool on_gpu = vmm::gpu_available(&why);
  if (!on_gpu)
    std::printf("no GPU (%s): the vmm rows run on the OS host-memory provider, without cudaMemPool\n",
                why.c_str());
  const auto add = [on_gpu](method kind, std::size_t size, int iterations) {
    // Appended piece by piece: GCC 12 -O3 warns (-Wrestrict) at a chain of + on std::string.
    std::string name = on_gpu ? "pointer/" : "pointer/os/";
    name += name_of(kind);
    if (kind != method::round_trip) {
      name += '/';
      name += size_name(size);
    }
    std::function<std::unique_ptr<contender>()> make;
    if (kind == method::round_trip)
      make = [] { return std::make_unique<round_trip>(); };
    else if (is_vmm(kind))
      make = [=] { return std::make_unique<vmm_pointer>(kind, on_gpu, size); };
    else
      make = [=] { return std::make_unique<mempool_pointer>(kind, size); };
    benchmark::RegisterBenchmark(
        name.c_str(), [=](benchmark::State& state) { run_pointer(state, on_gpu, kind, size, make); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(iterations);
  };
  add(method::round_trip, 0, 500);
  // The cudaMemPool rows first: each vmm row reports its ratio to the one before it.
  std::vector<row> rows = {{method::vmm_first, 30, 5},
                           {method::vmm_repeated, 200, 20},
                           {method::vmm_cached, 200, 50},
                           {method::vmm_still_mapped, 200, 50}};
  if (on_gpu)
    rows.insert(rows.begin(), {{method::mempool_first, 30, 5}, {method::mempool_repeated, 200, 20}});
  for (const std::size_t size : {64 * mib, 4096 * mib})
    for (const row& r : rows) add(r.kind, size, size == 64 * mib ? r.iterations_64mib : r.iterations_4gib);
}

void print_summary() {
  if (results().empty()) return;
  std::printf(
      "\nexport-pointer + import-pointer latency, mean of the iterations (ratio: to cudaMemPool IPC, same "
      "size)\n");
  for (const auto& [key, mean] : results()) {
    std::string ratio;
    for (const method kind :
         {method::vmm_first, method::vmm_repeated, method::vmm_cached, method::vmm_still_mapped}) {
      const std::string tag = std::string("/") + name_of(kind) + "/";
      if (key.find(tag) == std::string::npos) continue;
      const std::string base = key.substr(0, key.find(tag)) + "/" + name_of(baseline_of(kind)) + "/" +
                               key.substr(key.find(tag) + tag.size());
      if (const auto found = results().find(base); found != results().end()) {
        char text[64];
        std::snprintf(text, sizeof text, "   %6.2fx %s", mean / found->second, name_of(baseline_of(kind)));
        ratio = text;
      }
    }
    std::printf("  %-36s %12.1f us%s\n", key.c_str(), mean, ratio.c_str());
  }
}

// Every page of a vmm pointer is a descriptor while it travels, and the OS provider keeps
// one per page besides: 4 GiB is 2048 of each.
void raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

int main(int argc, char** argv) {
  raise_descriptor_limit();
  if (argc == 2 && std::strcmp(argv[1], peer_flag) == 0) {
    try {
      return run_peer();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "vmm_bench_resource_ipc importer: %s\n", error.what());
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
