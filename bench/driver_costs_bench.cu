// What the driver's VMM calls cost, and what they depend on: the floor every vmm figure is
// held against, measured in the same run as vmm's own calls over the same memory.
//
//  - one grow by one chunk (cuMemMap + cuMemSetAccess of a recycled handle), raw, into
//    reservations of several sizes and alignments, at the start or in the middle of the
//    reservation; vmm's growable_buffer the same way, with the reservation it makes;
//  - fresh memory: cuMemCreate + cuMemMap + cuMemSetAccess of 16 GiB in handles of several
//    sizes, each call timed on its own (counters), raw, against vmm's geometric growth;
//  - 3 GiB mapped at once in handles of 2 MiB, 64 MiB or one, each phase's calls spread
//    over 1 to 8 host threads (what a wake pays, and whether threads help);
//  - import on the importer's side: cuMemImportFromShareableHandle + map + access of one
//    handle, raw, against vmm::physical_allocation::import_fd + mapping.
// Each row reports microseconds per operation as counters (median of the iterations'
// host-clock times).

#include <benchmark/benchmark.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "raw_driver.hpp"
#include "vmm/address_range.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/mapping.hpp"
#include "vmm/physical_allocation.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t gib = std::size_t{1} << 30;

struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const vmm::bench::raw_driver_calls& driver() {
  return vmm::bench::raw_driver<failure>();
}

void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS)
    throw failure(std::string(what) + ": " + vmm::bench::raw_driver_error_name<failure>(result));
}

bool skip_without_gpu(benchmark::State& state) {
  std::string why;
  if (vmm::gpu_available(&why) && cudaSetDevice(0) == cudaSuccess && cudaFree(nullptr) == cudaSuccess)
    return false;
  state.SkipWithError(("no GPU: " + why).c_str());
  return true;
}

CUmemAllocationProp device_properties() {
  CUmemAllocationProp properties{};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  properties.location.id = 0;
  properties.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return properties;
}

CUmemAccessDesc read_write() {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

double microseconds(clock_type::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

double median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2),
                   samples.end());
  return samples[samples.size() / 2];
}

// One 2 MiB (or chunk-sized) handle mapped and given access, then unmapped, again and
// again, into a reservation of range(1) MiB aligned to range(2) MiB, at offset 0 or in the
// middle (range(3) = 1). Map, access and unmap each timed.
void raw_grow_in_reservation(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t chunk = static_cast<std::size_t>(state.range(0)) * mib;
  const std::size_t reservation = static_cast<std::size_t>(state.range(1)) * mib;
  const std::size_t alignment = static_cast<std::size_t>(state.range(2)) * mib;
  const bool middle = state.range(3) != 0;
  const CUmemAllocationProp properties = device_properties();
  CUmemGenericAllocationHandle handle = 0;
  check(driver().create(&handle, chunk, &properties, 0), "cuMemCreate");
  CUdeviceptr base = 0;
  check(driver().address_reserve(&base, reservation, alignment, 0, 0), "cuMemAddressReserve");
  const CUdeviceptr at = base + (middle ? (reservation / 2) / chunk * chunk : 0);
  const CUmemAccessDesc access = read_write();
  std::vector<double> maps, accesses, unmaps;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    check(driver().map(at, chunk, 0, handle, 0), "cuMemMap");
    const auto t1 = clock_type::now();
    check(driver().set_access(at, chunk, &access, 1), "cuMemSetAccess");
    const auto t2 = clock_type::now();
    check(driver().unmap(at, chunk), "cuMemUnmap");
    const auto t3 = clock_type::now();
    maps.push_back(microseconds(t1 - t0));
    accesses.push_back(microseconds(t2 - t1));
    unmaps.push_back(microseconds(t3 - t2));
  }
  check(driver().address_free(base, reservation), "cuMemAddressFree");
  check(driver().release(handle), "cuMemRelease");
  state.counters["map_us"] = median(maps);
  state.counters["access_us"] = median(accesses);
  state.counters["grow_us"] = median(maps) + median(accesses);
  state.counters["unmap_us"] = median(unmaps);
}
BENCHMARK(raw_grow_in_reservation)
    ->ArgNames({"chunk_mib", "reservation_mib", "alignment_mib", "middle"})
    ->Args({2, 2, 2, 0})
    ->Args({2, 4, 2, 0})
    ->Args({2, 32, 2, 0})
    ->Args({2, 512, 2, 0})
    ->Args({2, 1024, 2, 0})
    ->Args({2, 1024, 1024, 0})
    ->Args({2, 1024, 2, 1})
    ->Args({2, 16 * 1024, 2, 0})
    ->Args({2, 80 * 1024, 2, 0})
    ->Args({2, 80 * 1024, 2, 1})
    ->Args({64, 64, 2, 0})
    ->Args({64, 1024, 2, 0})
    ->Args({64, 80 * 1024, 2, 0})
    ->Iterations(200)
    ->Unit(benchmark::kMicrosecond);

// vmm's one grow by one chunk of range(0) MiB with a warm pool, in a buffer whose
// reservation is range(1) MiB (0: the default, the GPU's memory): resize up, then down and
// collect_retired (unmap) outside the timed part.
void vmm_grow_one_chunk(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t chunk = static_cast<std::size_t>(state.range(0)) * mib;
  const std::size_t max_size = static_cast<std::size_t>(state.range(1)) * mib;
  auto pool = vmm::chunk_pool::create(vmm::provider_for(vmm::location::device(0)));
  vmm::growable_buffer buffer(pool, {.max_size = max_size, .policy = vmm::chunk_policy::fixed(chunk)});
  buffer.resize(chunk);  // warm: the pool holds the chunk from now on
  buffer.resize(0);
  buffer.collect_retired(true);
  std::vector<double> grows;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    buffer.resize(chunk);
    const auto t1 = clock_type::now();
    state.PauseTiming();
    buffer.resize(0);
    buffer.collect_retired(true);
    state.ResumeTiming();
    grows.push_back(microseconds(t1 - t0));
  }
  state.counters["grow_us"] = median(grows);
  state.counters["reservation_mib"] = static_cast<double>(buffer.max_size() / mib);
}
BENCHMARK(vmm_grow_one_chunk)
    ->ArgNames({"chunk_mib", "reservation_mib"})
    ->Args({2, 2})
    ->Args({2, 1024})
    ->Args({2, 0})
    ->Args({64, 64})
    ->Args({64, 0})
    ->Iterations(200)
    ->Unit(benchmark::kMicrosecond);

// Fresh memory: 16 GiB as handles of range(0) MiB, each created, mapped and given access
// in a loop of appends of 256 MiB, raw; create, map and access totals as counters.
void raw_cold_growth(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t chunk = static_cast<std::size_t>(state.range(0)) * mib;
  const std::size_t total = 16 * gib;
  const CUmemAllocationProp properties = device_properties();
  const CUmemAccessDesc access = read_write();
  double create_ms = 0, map_ms = 0, access_ms = 0;
  for (auto _ : state) {
    CUdeviceptr base = 0;
    check(driver().address_reserve(&base, total, 0, 0, 0), "cuMemAddressReserve");
    std::vector<CUmemGenericAllocationHandle> handles;
    for (std::size_t done = 0; done < total; done += chunk) {
      CUmemGenericAllocationHandle handle = 0;
      const auto t0 = clock_type::now();
      check(driver().create(&handle, chunk, &properties, 0), "cuMemCreate");
      const auto t1 = clock_type::now();
      check(driver().map(base + done, chunk, 0, handle, 0), "cuMemMap");
      const auto t2 = clock_type::now();
      check(driver().set_access(base + done, chunk, &access, 1), "cuMemSetAccess");
      const auto t3 = clock_type::now();
      create_ms += microseconds(t1 - t0) / 1000;
      map_ms += microseconds(t2 - t1) / 1000;
      access_ms += microseconds(t3 - t2) / 1000;
      handles.push_back(handle);
    }
    state.PauseTiming();
    check(driver().unmap(base, total), "cuMemUnmap");
    for (auto h : handles) check(driver().release(h), "cuMemRelease");
    check(driver().address_free(base, total), "cuMemAddressFree");
    state.ResumeTiming();
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["create_ms"] = create_ms / n;
  state.counters["map_ms"] = map_ms / n;
  state.counters["access_ms"] = access_ms / n;
}
BENCHMARK(raw_cold_growth)
    ->ArgName("chunk_mib")
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Arg(2048)
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

// Mapping 3 GiB at once (what a memory resource's wake maps): handles of range(0) MiB, the
// driver calls of each phase spread over range(1) host threads (contiguous shares), each
// phase timed as a whole; create, map, access, unmap and release as counters (ms). Shows
// what the per-handle cost depends on: the handle count (2 MiB against 64 MiB handles),
// and whether host threads overlap the driver's work (they do not: it serializes them).
void raw_map_many(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t handle_bytes = static_cast<std::size_t>(state.range(0)) * mib;
  const int threads = static_cast<int>(state.range(1));
  const std::size_t total = 3 * gib;
  const std::size_t count = total / handle_bytes;
  const CUmemAllocationProp properties = device_properties();
  const CUmemAccessDesc access = read_write();
  CUdeviceptr base = 0;
  check(driver().address_reserve(&base, total, 0, 0, 0), "cuMemAddressReserve");
  std::vector<CUmemGenericAllocationHandle> handles(count);
  // Runs body(first, end) over contiguous shares of the handles, one host thread each.
  const auto spread = [&](auto&& body) {
    std::vector<std::thread> workers;
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        try {
          if (cudaSetDevice(0) != cudaSuccess) throw failure("cudaSetDevice(0) failed on a worker thread");
          body(count * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads),
               count * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads));
        } catch (...) {
          errors[static_cast<std::size_t>(t)] = std::current_exception();
        }
      });
    for (auto& worker : workers) worker.join();
    for (const auto& error : errors)
      if (error) std::rethrow_exception(error);
  };
  const auto timed = [&](auto&& body) {
    const auto t0 = clock_type::now();
    spread(body);
    return microseconds(clock_type::now() - t0) / 1000;
  };
  double create_ms = 0, map_ms = 0, access_ms = 0, unmap_ms = 0, release_ms = 0;
  for (auto _ : state) {
    create_ms += timed([&](std::size_t first, std::size_t end) {
      for (std::size_t i = first; i < end; ++i)
        check(driver().create(&handles[i], handle_bytes, &properties, 0), "cuMemCreate");
    });
    map_ms += timed([&](std::size_t first, std::size_t end) {
      for (std::size_t i = first; i < end; ++i)
        check(driver().map(base + i * handle_bytes, handle_bytes, 0, handles[i], 0), "cuMemMap");
    });
    access_ms += timed([&](std::size_t first, std::size_t end) {
      if (end > first)
        check(driver().set_access(base + first * handle_bytes, (end - first) * handle_bytes, &access, 1),
              "cuMemSetAccess");
    });
    unmap_ms += timed([&](std::size_t first, std::size_t end) {
      for (std::size_t i = first; i < end; ++i)
        check(driver().unmap(base + i * handle_bytes, handle_bytes), "cuMemUnmap");
    });
    release_ms += timed([&](std::size_t first, std::size_t end) {
      for (std::size_t i = first; i < end; ++i) check(driver().release(handles[i]), "cuMemRelease");
    });
  }
  check(driver().address_free(base, total), "cuMemAddressFree");
  const double n = static_cast<double>(state.iterations());
  state.counters["create_ms"] = create_ms / n;
  state.counters["map_ms"] = map_ms / n;
  state.counters["access_ms"] = access_ms / n;
  state.counters["unmap_ms"] = unmap_ms / n;
  state.counters["release_ms"] = release_ms / n;
  state.counters["handles"] = static_cast<double>(count);
}
BENCHMARK(raw_map_many)
    ->ArgNames({"handle_mib", "threads"})
    ->Args({2, 1})
    ->Args({2, 4})
    ->Args({2, 8})
    ->Args({64, 1})
    ->Args({3072, 1})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);

// The importer's side of sharing one handle of range(0) MiB: import, reserve, map, access,
// raw against vmm (the fd from the same process stands in for a peer's: the driver's work
// is the same).
void raw_import(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t chunk = static_cast<std::size_t>(state.range(0)) * mib;
  auto provider = vmm::provider_for(vmm::location::device(0));
  vmm::physical_allocation memory(provider, chunk);
  const vmm::unique_fd fd = memory.export_fd();
  const CUmemAccessDesc access = read_write();
  auto import_from_shareable = reinterpret_cast<decltype(&cuMemImportFromShareableHandle)>([] {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuMemImportFromShareableHandle", &address, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess)
      throw failure("no cuMemImportFromShareableHandle");
    return address;
  }());
  std::vector<double> totals;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    CUmemGenericAllocationHandle handle = 0;
    check(import_from_shareable(&handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd.get())),
                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle");
    CUdeviceptr base = 0;
    check(driver().address_reserve(&base, chunk, 0, 0, 0), "cuMemAddressReserve");
    check(driver().map(base, chunk, 0, handle, 0), "cuMemMap");
    check(driver().set_access(base, chunk, &access, 1), "cuMemSetAccess");
    const auto t1 = clock_type::now();
    totals.push_back(microseconds(t1 - t0));
    state.PauseTiming();
    check(driver().unmap(base, chunk), "cuMemUnmap");
    check(driver().address_free(base, chunk), "cuMemAddressFree");
    check(driver().release(handle), "cuMemRelease");
    state.ResumeTiming();
  }
  state.counters["import_us"] = median(totals);
}
BENCHMARK(raw_import)->ArgName("chunk_mib")->Arg(64)->Iterations(100)->Unit(benchmark::kMicrosecond);

void vmm_import(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t chunk = static_cast<std::size_t>(state.range(0)) * mib;
  auto provider = vmm::provider_for(vmm::location::device(0));
  vmm::physical_allocation memory(provider, chunk);
  const vmm::unique_fd fd = memory.export_fd();
  std::vector<double> totals;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    vmm::physical_allocation imported = vmm::physical_allocation::import_fd(provider, fd.get(), chunk);
    vmm::address_range range(provider, chunk);
    vmm::mapping mapped(imported, range.address(), vmm::access_mode::read_write);
    const auto t1 = clock_type::now();
    totals.push_back(microseconds(t1 - t0));
    state.PauseTiming();
    mapped.reset();
    range.reset();
    imported.reset();
    state.ResumeTiming();
  }
  state.counters["import_us"] = median(totals);
}
BENCHMARK(vmm_import)->ArgName("chunk_mib")->Arg(64)->Iterations(100)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
