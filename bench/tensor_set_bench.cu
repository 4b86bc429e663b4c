// vmm_bench_tensor_set: one copy of a model's weights for N processes (vmm-store tensor
// sets) against what serving engines do instead, in one run.
//
// The model: a 7B-parameter transformer's tensors (32 layers of q, k, v, o, gate, up, down
// and two norms; embedding, final norm, lm_head: 291 tensors) in BF16, with synthetic
// weights, written once as a safetensors file in a temporary directory (from the page cache
// afterwards). Without a GPU every dimension is divided by 64 (a few MiB: the rows run on the
// OS host-memory provider, the legacy rows skip with the reason); --scale=N divides them by
// N (scripts/bench.sh --quick passes 4). --layers=N sets the depth (default 32; 41 layers
// make 15.95 GiB, the 16 GiB set of the GPU run's issue).
//
// Rows, each for N = 1, 2, 4, 8 processes started together (this program again, "child"),
// each reporting when its first tensor is usable (its first element read back) and when
// every tensor is:
//   store/<N>          tensor_set::get of the set, loaded into the store once before
//   own_copy/<N>       each process reads the safetensors file into cudaMalloc'd tensors
//                      (pageable host buffer, cudaMemcpy per tensor: a framework's plain load)
//   legacy_tensor/<N>  cudaIpcOpenMemHandle of one handle per tensor (a daemon's cudaMalloc each)
//   legacy_buffer/<N>  cudaIpcOpenMemHandle of one handle of one cudaMalloc of every tensor
//   load/safetensors   load_safetensors of the file into a set on GPU 0: bytes per second
//   load/pinned_h2d    cudaMemcpy of the same bytes from cudaMallocHost memory, in 16 MiB
//                      chunks: the bound of the load's copies
//   read_file/<R>      pread of the file's bytes in 16 MiB pieces by R threads at once into
//                      host memory of their own (pinned with a GPU), no copy: the bound of
//                      the load's reads (R = 1 and the load's default readers)
// Counters: first_usable_us and all_usable_us (the slowest process's), gpu_bytes (the model's
// memory on the GPU with every process holding it: the sharer's allocation plus what the N
// processes added, measured with cudaMemGetInfo once each process has its CUDA context, so
// contexts are not counted), copies (gpu_bytes / the model's bytes). Targets (issue 50):
// store gpu_bytes <= 1.01 copies for every N; store first_usable_us <= 1.1x legacy_buffer's;
// load/safetensors >= 0.9x load/pinned_h2d. Nothing here enforces them.

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <new>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cuda_check.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/error.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/safetensors.hpp"
#include "vmm/store/server.hpp"
#include "vmm/store/tensor_set.hpp"

extern char** environ;

namespace {

using vmm::bench::check;
using clock_type = std::chrono::steady_clock;

constexpr const char* set_name = "bench/llama-7b";
std::string program;
std::string directory;
std::uint64_t scale = 0;    // every dimension divided by it (--scale=N); 0: 1 on a GPU, else 64
std::uint64_t layers = 32;  // the model's depth (--layers=N)

bool have_gpu() {
  static const bool gpu = vmm::gpu_available();
  return gpu;
}
std::string model_path() {
  return directory + "/model.safetensors";
}
std::string socket_path() {
  return directory + "/socket";
}
std::string handles_path() {
  return directory + "/handles";
}

// The tensors of the model, laid out as a tensor set lays them out.
std::vector<vmm::store::tensor_info> model_tensors() {
  if (scale == 0) scale = have_gpu() ? 1 : 64;
  const std::uint64_t hidden = 4096 / scale, inter = 11008 / scale, vocab = 32000 / scale;
  std::vector<vmm::store::tensor_info> t;
  const auto add = [&](std::string name, std::vector<std::uint64_t> shape) {
    t.push_back({.name = std::move(name), .type = vmm::store::dtype::bf16, .shape = std::move(shape)});
  };
  add("model.embed_tokens.weight", {vocab, hidden});
  for (std::uint64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
      add(p + "self_attn." + proj + ".weight", {hidden, hidden});
    add(p + "mlp.gate_proj.weight", {inter, hidden});
    add(p + "mlp.up_proj.weight", {inter, hidden});
    add(p + "mlp.down_proj.weight", {hidden, inter});
    add(p + "input_layernorm.weight", {hidden});
    add(p + "post_attention_layernorm.weight", {hidden});
  }
  add("model.norm.weight", {hidden});
  add("lm_head.weight", {vocab, hidden});
  (void)vmm::store::lay_out(t);
  return t;
}

std::uint64_t model_bytes() {
  std::uint64_t total = 0;
  for (const auto& t : model_tensors()) total += t.bytes;
  return total;
}

// The safetensors file: the tensors back to back, each filled with its index.
void write_model() {
  const auto tensors = model_tensors();
  std::string header = "{";
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    header += (at == 0 ? "\"" : ", \"") + t.name + "\": {\"dtype\": \"BF16\", \"shape\": [";
    for (std::size_t i = 0; i < t.shape.size(); ++i) header += (i ? ", " : "") + std::to_string(t.shape[i]);
    header += "], \"data_offsets\": [" + std::to_string(at) + ", " + std::to_string(at + t.bytes) + "]}";
    at += t.bytes;
  }
  header += "}";
  const int fd = ::open(model_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw vmm::os_error(errno, "open " + model_path());
  std::uint64_t length = header.size();
  std::vector<char> chunk(16 << 20);
  bool ok = ::write(fd, &length, 8) == 8 &&
            ::write(fd, header.data(), header.size()) == static_cast<ssize_t>(header.size());
  for (std::size_t i = 0; i < tensors.size() && ok; ++i) {
    std::fill(chunk.begin(), chunk.end(), static_cast<char>(i));
    for (std::uint64_t left = tensors[i].bytes; left != 0 && ok;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, chunk.size()));
      ok = ::write(fd, chunk.data(), n) == static_cast<ssize_t>(n);
      left -= n;
    }
  }
  ::close(fd);
  if (!ok) throw vmm::os_error(errno, "write " + model_path());
}

std::uint64_t gpu_used() {
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

// Reads the first byte of `p` (device or host memory): the tensor is usable.
void touch(const void* p) {
  unsigned char byte = 0;
  if (have_gpu()) {
    check(cudaMemcpy(&byte, p, 1, cudaMemcpyDefault), "cudaMemcpy");
  } else {
    byte = *static_cast<const volatile unsigned char*>(p);
  }
  benchmark::DoNotOptimize(byte);
}

// ---- a child process -----------------------------------------------------------------------

int child(const std::string& mode) {
  if (have_gpu()) check(cudaFree(nullptr), "cudaFree(0)");  // the context, before the clock
  std::printf("ready\n");
  std::fflush(stdout);
  char go = 0;
  if (::read(0, &go, 1) != 1) return 1;
  const auto start = clock_type::now();
  clock_type::time_point first;
  const auto tensors = model_tensors();
  vmm::store::tensor_set held;
  std::vector<void*> owned;
  if (mode == "store") {
    vmm::store::client store({.socket_path = socket_path()});
    held = vmm::store::tensor_set::get(store, set_name);
    touch(held[0].data);
    first = clock_type::now();
    touch(held[held.size() - 1].data);
  } else if (mode == "own_copy") {
    const vmm::store::safetensors_header header = vmm::store::read_safetensors_header(model_path());
    const int fd = ::open(model_path().c_str(), O_RDONLY | O_CLOEXEC);
    std::vector<char> staging;
    for (std::size_t i = 0; i < header.tensors.size(); ++i) {
      const auto& t = header.tensors[i];
      staging.resize(t.bytes);
      if (::pread(fd, staging.data(), t.bytes, static_cast<off_t>(header.data_start + t.offset)) !=
          static_cast<ssize_t>(t.bytes))
        return 1;
      void* p = nullptr;
      if (have_gpu()) {
        check(cudaMalloc(&p, t.bytes), "cudaMalloc");
        check(cudaMemcpy(p, staging.data(), t.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
      } else {
        p = std::malloc(t.bytes);
        std::memcpy(p, staging.data(), t.bytes);
      }
      owned.push_back(p);
      if (i == 0) {
        touch(p);
        first = clock_type::now();
      }
    }
    ::close(fd);
  } else {  // legacy_tensor, legacy_buffer: the handles the parent wrote
    const int fd = ::open(handles_path().c_str(), O_RDONLY | O_CLOEXEC);
    const std::size_t count = mode == "legacy_tensor" ? tensors.size() : 1;
    std::vector<cudaIpcMemHandle_t> handles(count);
    if (::read(fd, handles.data(), count * sizeof(cudaIpcMemHandle_t)) !=
        static_cast<ssize_t>(count * sizeof(cudaIpcMemHandle_t)))
      return 1;
    ::close(fd);
    for (std::size_t i = 0; i < count; ++i) {
      void* p = nullptr;
      check(cudaIpcOpenMemHandle(&p, handles[i], cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      owned.push_back(p);
      if (i == 0) {
        touch(p);
        first = clock_type::now();
      }
    }
  }
  const auto all = clock_type::now();
  const auto us = [&](clock_type::time_point t) {
    return std::chrono::duration<double, std::micro>(t - start).count();
  };
  std::printf("%.3f %.3f\n", us(first), us(all));
  std::fflush(stdout);
  while (::read(0, &go, 1) > 0) {}  // hold until the parent measured
  return 0;
}

// ---- the parent ----------------------------------------------------------------------------

struct running_child {
  pid_t pid = -1;
  std::FILE* out = nullptr;
  int in = -1;
};

running_child start_child(const std::string& mode) {
  int to[2], from[2];
  if (::pipe2(to, O_CLOEXEC) != 0 || ::pipe2(from, O_CLOEXEC) != 0) throw vmm::os_error(errno, "pipe2");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from[1], 1);
  std::vector<std::string> argv = {
      program, "child", mode, directory, std::to_string(scale), std::to_string(layers)};
  std::vector<char*> pointers;
  for (std::string& word : argv) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  running_child c;
  const int result = ::posix_spawn(&c.pid, pointers[0], &actions, nullptr, pointers.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(to[0]);
  ::close(from[1]);
  if (result != 0) throw vmm::os_error(result, "posix_spawn");
  c.out = ::fdopen(from[0], "r");
  c.in = to[1];
  return c;
}

// Runs N children of `mode` together; sets the row's counters. `shared_bytes`: what this
// process holds of the model on the GPU for them.
void run_children(benchmark::State& state, const std::string& mode, std::uint64_t shared_bytes) {
  const int n = static_cast<int>(state.range(0));
  for (auto _ : state) {
    std::vector<running_child> children;
    for (int i = 0; i < n; ++i) children.push_back(start_child(mode));
    char line[64];
    for (auto& c : children)
      if (std::fgets(line, sizeof line, c.out) == nullptr)
        throw std::runtime_error(mode + ": a child did not start");
    const std::uint64_t before = have_gpu() ? gpu_used() : 0;
    for (auto& c : children)
      if (::write(c.in, "g", 1) != 1) throw vmm::os_error(errno, "write");
    double first = 0, all = 0;
    for (auto& c : children) {
      double f = 0, a = 0;
      if (std::fscanf(c.out, "%lf %lf", &f, &a) != 2) throw std::runtime_error(mode + ": a child failed");
      first = std::max(first, f);
      all = std::max(all, a);
    }
    const std::uint64_t after = have_gpu() ? gpu_used() : 0;
    for (auto& c : children) {
      ::close(c.in);
      std::fclose(c.out);
      int status = 0;
      ::waitpid(c.pid, &status, 0);
    }
    state.SetIterationTime(all / 1e6);
    state.counters["first_usable_us"] = first;
    state.counters["all_usable_us"] = all;
    if (have_gpu()) {
      const double gpu_bytes = static_cast<double>(after - before + shared_bytes);
      state.counters["gpu_bytes"] = gpu_bytes;
      state.counters["copies"] = gpu_bytes / static_cast<double>(model_bytes());
    }
  }
}

vmm::store::client* store = nullptr;
std::uint64_t set_capacity = 0;

void BM_store(benchmark::State& state) {
  run_children(state, "store", set_capacity);
}

void BM_own_copy(benchmark::State& state) {
  if (have_gpu()) {
    std::size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    // Each child's context takes some memory too: a tenth of the GPU is left for them.
    if (static_cast<double>(state.range(0)) * static_cast<double>(model_bytes()) >
        0.9 * static_cast<double>(free))
      return state.SkipWithError("not enough free GPU memory for a copy per process");
  }
  run_children(state, "own_copy", 0);
}

// The legacy rows: this process cudaMallocs (one allocation per tensor, or one for all) and
// writes the handles where the children read them.
void legacy(benchmark::State& state, bool per_tensor) {
  if (!have_gpu()) return state.SkipWithError("no GPU: the legacy rows need cudaIpc");
  const auto tensors = model_tensors();
  std::vector<void*> allocations;
  std::vector<cudaIpcMemHandle_t> handles;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < (per_tensor ? tensors.size() : 1); ++i) {
    const std::uint64_t size = per_tensor ? tensors[i].bytes : tensors.back().offset + tensors.back().bytes;
    void* p = nullptr;
    check(cudaMalloc(&p, size), "cudaMalloc");
    allocations.push_back(p);
    handles.emplace_back();
    check(cudaIpcGetMemHandle(&handles.back(), p), "cudaIpcGetMemHandle");
    bytes += size;
  }
  const int fd = ::open(handles_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const std::size_t length = handles.size() * sizeof(cudaIpcMemHandle_t);
  const bool written = ::write(fd, handles.data(), length) == static_cast<ssize_t>(length);
  ::close(fd);
  if (!written) throw vmm::os_error(errno, "write " + handles_path());
  run_children(state, per_tensor ? "legacy_tensor" : "legacy_buffer", bytes);
  for (void* p : allocations) check(cudaFree(p), "cudaFree");
}

void BM_legacy_tensor(benchmark::State& state) {
  legacy(state, true);
}
void BM_legacy_buffer(benchmark::State& state) {
  legacy(state, false);
}

void BM_load_safetensors(benchmark::State& state) {
  const vmm::location where = have_gpu() ? vmm::location::device(0) : vmm::location::os_host();
  for (auto _ : state) {
    {
      const vmm::store::tensor_set set =
          vmm::store::load_safetensors(*store, model_path(), "bench/load", {.where = where});
      benchmark::DoNotOptimize(set.memory().data());
    }
    state.PauseTiming();
    store->remove("bench/load");
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * model_bytes()));
}

// What BM_load_safetensors costs without reading the file or copying: the set's memory made
// (created and mapped by the daemon, imported by this process), sealed and got again.
void BM_load_create_only(benchmark::State& state) {
  const vmm::location where = have_gpu() ? vmm::location::device(0) : vmm::location::os_host();
  std::vector<vmm::store::tensor_info> table;
  for (const vmm::store::tensor_info& t : vmm::store::read_safetensors_header(model_path()).tensors)
    table.push_back({.name = t.name, .type = t.type, .shape = t.shape});
  for (auto _ : state) {
    {
      vmm::store::tensor_set_builder builder(*store, "bench/create", table, where);
      const vmm::store::tensor_set set = builder.commit();
      benchmark::DoNotOptimize(set.memory().data());
    }
    state.PauseTiming();
    store->remove("bench/create");
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * model_bytes()));
}

void BM_load_pinned_h2d(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no GPU: no host-to-device copy");
  const std::size_t chunk = std::size_t{16} << 20;
  const std::uint64_t bytes = model_bytes();
  void* host = nullptr;
  void* device = nullptr;
  check(cudaMallocHost(&host, chunk), "cudaMallocHost");
  check(cudaMalloc(&device, bytes), "cudaMalloc");
  for (auto _ : state) {
    for (std::uint64_t at = 0; at < bytes; at += chunk)
      check(cudaMemcpy(static_cast<char*>(device) + at, host, std::min<std::uint64_t>(chunk, bytes - at),
                       cudaMemcpyHostToDevice),
            "cudaMemcpy");
  }
  check(cudaFree(device), "cudaFree");
  check(cudaFreeHost(host), "cudaFreeHost");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void BM_read_file(benchmark::State& state) {
  const std::size_t readers = static_cast<std::size_t>(state.range(0));
  const std::size_t piece = std::size_t{16} << 20;
  const std::uint64_t bytes = model_bytes();
  const int fd = ::open(model_path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw vmm::os_error(errno, "open " + model_path());
  std::vector<void*> buffers(readers, nullptr);
  for (void*& b : buffers) {
    if (have_gpu())
      check(cudaMallocHost(&b, piece), "cudaMallocHost");
    else if ((b = std::malloc(piece)) == nullptr)
      throw std::bad_alloc();
  }
  for (auto _ : state) {
    std::atomic<std::uint64_t> next{0};
    std::atomic<bool> short_read{false};
    auto read_pieces = [&](void* into) {
      for (std::uint64_t at = next.fetch_add(piece); at < bytes; at = next.fetch_add(piece)) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(piece, bytes - at));
        if (::pread(fd, into, n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) short_read = true;
      }
    };
    std::vector<std::thread> threads;
    for (std::size_t r = 1; r < readers; ++r) threads.emplace_back(read_pieces, buffers[r]);
    read_pieces(buffers[0]);
    for (std::thread& t : threads) t.join();
    if (short_read) {
      state.SkipWithError("a short read of the model file");
      break;
    }
  }
  for (void* b : buffers) {
    if (have_gpu())
      check(cudaFreeHost(b), "cudaFreeHost");
    else
      std::free(b);
  }
  ::close(fd);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

BENCHMARK(BM_store)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->UseManualTime()->Iterations(1)->Unit(
    benchmark::kMillisecond);
BENCHMARK(BM_legacy_buffer)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_legacy_tensor)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_own_copy)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_load_safetensors)->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_load_create_only)->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_load_pinned_h2d)->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_read_file)
    ->Apply([](benchmark::internal::Benchmark* b) {
      b->Arg(1);
      const auto readers = static_cast<std::int64_t>(vmm::store::default_safetensors_readers());
      if (readers > 1) b->Arg(readers);
    })
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);

// Whether `word` is the option `prefix` (--name=); then its value, a whole number from low to
// high, is put into `into`. @throws std::invalid_argument a value that is not one, naming it.
bool own_option(const std::string_view word, const std::string_view prefix, std::uint64_t low,
                std::uint64_t high, std::uint64_t& into) {
  if (!word.starts_with(prefix)) return false;
  const std::string_view text = word.substr(prefix.size());
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || value < low || value > high)
    throw std::invalid_argument(std::string(word) + ": a whole number from " + std::to_string(low) + " to " +
                                std::to_string(high));
  into = value;
  return true;
}

}  // namespace

int main(int argc, char** argv) try {
  program = argv[0];
  if (argc >= 6 && std::string(argv[1]) == "child") {
    directory = argv[3];
    scale = std::stoull(argv[4]);
    layers = std::stoull(argv[5]);
    return child(argv[2]);
  }
  // This program's own options, taken out before Google Benchmark reads the rest.
  for (int i = 1; i < argc; ++i) {
    const bool taken =
        own_option(argv[i], "--scale=", 1, 4096, scale) || own_option(argv[i], "--layers=", 1, 1024, layers);
    if (!taken) continue;
    std::copy(argv + i + 1, argv + argc, argv + i);
    --argc;
    --i;
  }
  ::signal(SIGPIPE, SIG_IGN);
  char temporary[] = "/tmp/vmm-tensor-set-bench-XXXXXX";
  if (::mkdtemp(temporary) == nullptr) throw vmm::os_error(errno, "mkdtemp");
  directory = temporary;
  write_model();
  {
    vmm::store::server daemon({.socket_path = socket_path()});
    std::thread loop([&] { daemon.run(); });
    {
      vmm::store::client client({.socket_path = socket_path()});
      store = &client;
      const vmm::location where = have_gpu() ? vmm::location::device(0) : vmm::location::os_host();
      const vmm::store::tensor_set loaded =
          vmm::store::load_safetensors(client, model_path(), set_name, {.where = where});
      set_capacity = client.stat(set_name).capacity;
      benchmark::AddCustomContext("model_bytes", std::to_string(model_bytes()));
      benchmark::AddCustomContext("tensors", std::to_string(loaded.size()));
      benchmark::Initialize(&argc, argv);
      benchmark::RunSpecifiedBenchmarks();
      benchmark::Shutdown();
      store = nullptr;
    }
    daemon.stop();
    loop.join();
  }
  std::remove(model_path().c_str());
  std::remove(handles_path().c_str());
  ::rmdir(directory.c_str());
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "vmm_bench_tensor_set: %s\n", error.what());
  return 1;
}
