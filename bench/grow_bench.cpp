// vmm_bench_grow: growing a buffer with vmm against what a user would do instead, in the
// same run.
//
//  grow/<final>_by_<append>/<contender>   grow from 0 to <final> in <append> steps, each
//      appended slice written once; time, bytes/s, peak extra memory (bytes and × final
//      size), chunks mapped (vmm) or allocations made (baselines).
//  grow_once/<chunk>/<contender>          one grow of one chunk with a warm pool, against
//      the raw calls it needs (cuMemMap + cuMemSetAccess; on the host mmap + mprotect).
//  reach/<append>_appends/<contender>     (GPU only) grow until out of memory; the size
//      reached as a share of the free memory at the start.
//
// The contenders registered are those this machine can run: the GPU set when the program
// was built with CUDA C++ and a GPU with VMM support is there, else the OS-provider set
// (vmm on location::os_host() against host baselines, at sizes a small CI machine runs in
// seconds). scripts/bench_report.py turns the JSON output into tables.

#include "grow_bench.hpp"

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "vmm/capabilities.hpp"

namespace vmm::bench {
namespace {

using host_clock = std::chrono::steady_clock;

double seconds_since(host_clock::time_point start) {
  return std::chrono::duration<double>(host_clock::now() - start).count();
}

std::string size_name(std::size_t bytes) {
  if (bytes % gib == 0) return fmt::format("{}GiB", bytes / gib);
  return fmt::format("{}MiB", bytes / mib);
}

benchmark::Counter byte_counter(std::size_t bytes) {
  return benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kDefaults,
                            benchmark::Counter::OneK::kIs1024);
}

void skip(benchmark::State& state, const std::string& message) {
  state.SkipWithError(message.c_str());  // const char* in 1.7, std::string in 1.8
}

struct grow_scenario {
  std::size_t final_size;
  std::size_t append;
  [[nodiscard]] std::string name() const {
    return fmt::format("{}_by_{}", size_name(final_size), size_name(append));
  }
};

// The timed part: grow from 0 to the final size, writing each appended slice once, then
// wait for the writes.
void grow_and_write(grow_contender& contender, memory_target& target, const grow_scenario& scenario,
                    memory_probe* probe) {
  for (std::size_t size = 0; size < scenario.final_size;) {
    const std::size_t append = std::min(scenario.append, scenario.final_size - size);
    char* data = contender.grow(size + append);
    target.fill(data + size, append);
    size += append;
    if (probe != nullptr) probe->sample();
  }
  target.synchronize();
}

void run_grow(benchmark::State& state, memory_target& target, const grow_scenario& scenario,
              const grow_entry& entry) {
  state.SetLabel(to_string(entry.role));
  std::unique_ptr<grow_contender> contender;
  std::size_t handles = 0;
  std::size_t own_peak = 0;
  std::optional<std::size_t> measured_peak;
  try {
    contender = entry.make();
    // An untimed first run: warms a warm pool, the code and the allocators, and measures
    // memory (sampling free memory costs time, so the timed runs do not).
    memory_probe probe(target);
    contender->begin(scenario.final_size, &probe);
    probe.sample();
    grow_and_write(*contender, target, scenario, &probe);
    measured_peak = probe.peak_drop();
    handles = contender->handle_count();
    own_peak = contender->own_peak_bytes();
    contender->end();
  } catch (const std::exception& e) {
    if (contender) contender->end();
    skip(state, fmt::format("{}: the untimed first run failed: {}", entry.name, e.what()));
    return;
  }
  for (auto _ : state) {
    try {
      target.settle(scenario.final_size);
      contender->begin(scenario.final_size, nullptr);
      const host_clock::time_point start = host_clock::now();
      grow_and_write(*contender, target, scenario, nullptr);
      state.SetIterationTime(seconds_since(start));
      contender->end();
    } catch (const std::exception& e) {
      contender->end();
      skip(state, fmt::format("{}: {}", entry.name, e.what()));
      return;
    }
  }
  const std::size_t peak = measured_peak.value_or(own_peak);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(scenario.final_size));
  state.counters["peak_extra_bytes"] = byte_counter(peak);
  state.counters["peak_extra_x"] = static_cast<double>(peak) / static_cast<double>(scenario.final_size);
  state.counters["own_peak_bytes"] = byte_counter(own_peak);
  state.counters[entry.role == contender_role::vmm ? "chunks" : "allocations"] = static_cast<double>(handles);
}

void run_grow_once(benchmark::State& state, std::size_t chunk, const grow_once_entry& entry) {
  state.SetLabel(to_string(entry.role));
  std::unique_ptr<grow_once_contender> contender;
  try {
    contender = entry.make(chunk);
    contender->grow();  // warm-up, untimed
    contender->undo();
  } catch (const std::exception& e) {
    skip(state, fmt::format("{}: setup failed: {}", entry.name, e.what()));
    return;
  }
  double undo_seconds = 0;
  for (auto _ : state) {
    try {
      const host_clock::time_point start = host_clock::now();
      contender->grow();
      state.SetIterationTime(seconds_since(start));
      const host_clock::time_point undo_start = host_clock::now();
      contender->undo();
      undo_seconds += seconds_since(undo_start);
    } catch (const std::exception& e) {
      skip(state, fmt::format("{}: {}", entry.name, e.what()));
      return;
    }
  }
  state.counters["undo_us"] = undo_seconds * 1e6 / static_cast<double>(state.iterations());
  state.counters["chunk_bytes"] = byte_counter(chunk);
  state.counters["chunks_created"] = static_cast<double>(contender->chunks_created());
}

using reach_function = std::function<std::size_t(memory_target&, std::size_t append)>;

void run_reach(benchmark::State& state, memory_target& target, std::size_t append,
               const reach_function& reach) {
  for (auto _ : state) {
    try {
      const std::optional<std::size_t> free_at_start = target.free_bytes();
      if (!free_at_start) throw bench_failure("the target cannot read its free memory");
      const host_clock::time_point start = host_clock::now();
      const std::size_t reached = reach(target, append);
      state.SetIterationTime(seconds_since(start));
      state.counters["reached_bytes"] = byte_counter(reached);
      state.counters["free_at_start_bytes"] = byte_counter(*free_at_start);
      state.counters["reached_share"] = static_cast<double>(reached) / static_cast<double>(*free_at_start);
    } catch (const std::exception& e) {
      skip(state, e.what());
      return;
    }
  }
}

// What one machine runs.
struct contender_set {
  std::vector<grow_scenario> scenarios;
  std::vector<grow_entry> grow;
  std::vector<std::size_t> once_chunks;
  std::vector<grow_once_entry> once;
  std::vector<std::pair<std::string, reach_function>> reach;  // GPU only
  std::size_t reach_append = 256 * mib;
};

// vmm's contenders, placed right after the floor, before the baselines.
std::vector<grow_entry> with_vmm(std::vector<grow_entry> baselines, int gpu_ordinal) {
  std::vector<grow_entry> vmm_entries;
  for (bool geometric : {true, false}) {
    for (bool warm : {false, true}) {
      vmm_entries.push_back(
          {fmt::format("vmm_{}_{}", geometric ? "geometric" : "fixed64MiB", warm ? "warm" : "cold"),
           contender_role::vmm, [gpu_ordinal, geometric, warm] {
             return make_vmm_contender(
                 gpu_ordinal, geometric ? chunk_policy::geometric() : chunk_policy::fixed(64 * mib), warm);
           }});
    }
  }
  const auto floor = std::find_if(baselines.begin(), baselines.end(),
                                  [](const grow_entry& e) { return e.role == contender_role::floor; });
  const auto at = floor == baselines.end() ? baselines.begin() : std::next(floor);
  baselines.insert(at, vmm_entries.begin(), vmm_entries.end());
  return baselines;
}

std::vector<grow_once_entry> once_entries(grow_once_entry raw, int gpu_ordinal) {
  return {std::move(raw),
          {"vmm_provider", contender_role::vmm,
           [gpu_ordinal](std::size_t chunk) { return make_vmm_provider_once(gpu_ordinal, chunk); }},
          {"vmm_growable_warm", contender_role::vmm,
           [gpu_ordinal](std::size_t chunk) { return make_vmm_growable_once(gpu_ordinal, chunk, 0); }},
          {"vmm_growable_warm_tight", contender_role::vmm,
           [gpu_ordinal](std::size_t chunk) { return make_vmm_growable_once(gpu_ordinal, chunk, chunk); }},
          {"vmm_growable_warm_1GiB", contender_role::vmm,
           [gpu_ordinal](std::size_t chunk) { return make_vmm_growable_once(gpu_ordinal, chunk, gib); }}};
}

#ifdef VMM_BENCH_HAVE_CUDA
contender_set gpu_set() {
  constexpr int gpu = 0;
  contender_set set;
  set.scenarios = {{16 * gib, 256 * mib}, {4 * gib, 16 * mib}};
  set.grow = with_vmm(gpu_baseline_contenders(), gpu);
  set.once_chunks = {2 * mib, 64 * mib};
  set.once = once_entries(
      {"raw_driver", contender_role::floor, [](std::size_t chunk) { return make_raw_driver_once(chunk, 0); }},
      gpu);
  set.once.push_back({"raw_driver_1GiB", contender_role::baseline,
                      [](std::size_t chunk) { return make_raw_driver_once(chunk, gib); }});
  set.reach = {
      {"vmm", [](memory_target& target, std::size_t append) { return reach_with_vmm(target, gpu, append); }},
      {"realloc_copy_2x", reach_with_realloc_2x}};
  return set;
}
#endif

contender_set os_set() {
  constexpr int os_host = -1;
  contender_set set;
  set.scenarios = {{1 * gib, 16 * mib}, {256 * mib, 1 * mib}};  // the GPU shapes, 1/16 the size
  set.grow = with_vmm(os_baseline_contenders(), os_host);
  set.once_chunks = {2 * mib, 64 * mib};
  set.once = once_entries({"raw_os", contender_role::floor, make_raw_os_once}, os_host);
  return set;  // no reach: it would take all of the machine's memory
}

void register_set(const contender_set& set, memory_target& target) {
  for (const grow_scenario& scenario : set.scenarios) {
    for (const grow_entry& entry : set.grow) {
      const std::string name = fmt::format("grow/{}/{}", scenario.name(), entry.name);
      benchmark::RegisterBenchmark(
          name.c_str(),
          [&target, scenario, entry](benchmark::State& state) { run_grow(state, target, scenario, entry); })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (std::size_t chunk : set.once_chunks) {
    for (const grow_once_entry& entry : set.once) {
      const std::string name = fmt::format("grow_once/{}/{}", size_name(chunk), entry.name);
      benchmark::RegisterBenchmark(
          name.c_str(), [chunk, entry](benchmark::State& state) { run_grow_once(state, chunk, entry); })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const auto& [contender, reach] : set.reach) {
    const std::string name = fmt::format("reach/{}_appends/{}", size_name(set.reach_append), contender);
    const std::size_t append = set.reach_append;
    benchmark::RegisterBenchmark(
        name.c_str(),
        [&target, append, reach](benchmark::State& state) { run_reach(state, target, append, reach); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);  // it takes all of the GPU's memory: once is the measurement
  }
}

// The GPU when the runtime and vmm both see one with VMM support, else null and why.
std::unique_ptr<memory_target> usable_gpu(std::string* why) {
#ifdef VMM_BENCH_HAVE_CUDA
  std::unique_ptr<memory_target> gpu = make_gpu_target(why);
  if (!gpu) return nullptr;
  if (!vmm::gpu_available(why)) return nullptr;
  try {
    if (!vmm::query_device(0).vmm_supported) {
      *why = "gpu 0 does not support virtual memory management";
      return nullptr;
    }
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
  return gpu;
#else
  *why = "built without CUDA C++ (no nvcc, or VMM_CUDA_CODE=OFF)";
  return nullptr;
#endif
}

}  // namespace
}  // namespace vmm::bench

int main(int argc, char** argv) {
  using namespace vmm::bench;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  std::string why;
  std::unique_ptr<memory_target> target = usable_gpu(&why);
  contender_set set;
#ifdef VMM_BENCH_HAVE_CUDA
  if (target) set = gpu_set();
#endif
  if (!target) {
    std::fprintf(stderr, "vmm_bench_grow: no GPU set (%s); running the OS-provider set\n", why.c_str());
    target = make_os_target();
    set = os_set();
    benchmark::AddCustomContext("vmm_no_gpu_reason", why);
  }
  register_set(set, *target);

  const bool gpu = target->is_gpu();
  benchmark::AddCustomContext("vmm_bench_set", gpu ? "gpu" : "os");
  benchmark::AddCustomContext("vmm_memory", target->name());
  benchmark::AddCustomContext(
      "vmm_peak_memory_source",
      gpu ? "drop of free device memory (cudaMemGetInfo) in an untimed first run, sampled "
            "after every append and right after every baseline allocation"
          : "the contender's own accounting (vmm: pool reserved_high; baselines: their "
            "allocator's high-water mark)");
  benchmark::AddCustomContext("vmm_grow_once_floor",
                              gpu ? "raw_driver: cuMemMap + cuMemSetAccess on a pre-created handle, through "
                                    "cudaGetDriverEntryPointByVersion"
                                  : "raw_os: mmap(MAP_SHARED | MAP_FIXED) of a memfd + mprotect");

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
