// The GPU pieces of vmm_bench_grow: GPU 0 as a memory_target (writes with cudaMemsetAsync),
// the baselines a user would pick instead of vmm (preallocated cudaMalloc as the floor,
// cudaMalloc + copy with 2x capacity, thrust::device_vector::resize), the raw driver
// sequence cuMemMap + cuMemSetAccess that a grow needs, and the realloc + copy reach.
//
// Nothing here links libcuda: driver entry points come through the runtime's
// cudaGetDriverEntryPointByVersion; cuda.h is included for its types only.
// Every runtime and driver call is checked; a failure throws bench_failure naming the call
// and the size, which the benchmark body turns into SkipWithError.

#include <cuda.h>
#include <cuda_runtime.h>
#include <thrust/device_vector.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "cuda_check.hpp"
#include "grow_bench.hpp"
#include "raw_driver.hpp"
#include "settle.hpp"
#include "vmm/growable_buffer.hpp"

namespace vmm::bench {
namespace {

std::string bytes(std::size_t n) {
  return std::to_string(n) + " bytes";
}

// ---- GPU 0 ----

class gpu_target final : public memory_target {
 public:
  gpu_target(std::string name, std::size_t total) : name_(std::move(name)), total_(total) {}
  [[nodiscard]] std::string name() const override { return name_; }
  [[nodiscard]] bool is_gpu() const noexcept override { return true; }
  void fill(void* p, std::size_t n) override {
    check(cudaMemsetAsync(p, 0x5a, n, nullptr), "cudaMemsetAsync(" + bytes(n) + ")");
  }
  void synchronize() override { check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize"); }
  [[nodiscard]] std::optional<std::size_t> free_bytes() override {
    std::size_t free = 0;
    std::size_t total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return free;
  }
  [[nodiscard]] std::size_t total_bytes() override { return total_; }
  void settle(std::size_t released) override { settle_after_release(released); }

 private:
  std::string name_;
  std::size_t total_;
};

// ---- the baselines ----

// cudaMalloc of the final size before the timed part: the writes alone.
class gpu_floor final : public grow_contender {
 public:
  ~gpu_floor() override { end(); }
  void begin(std::size_t final_size, memory_probe*) override {
    end();
    check(cudaMalloc(&data_, final_size), "cudaMalloc(" + bytes(final_size) + ")");
    size_ = final_size;
  }
  char* grow(std::size_t) override { return data_; }
  void end() noexcept override {
    if (data_ != nullptr) report(cudaFree(data_), "cudaFree");
    data_ = nullptr;
  }
  [[nodiscard]] std::size_t own_peak_bytes() const override { return size_; }
  [[nodiscard]] std::size_t handle_count() const override { return 1; }

 private:
  char* data_ = nullptr;
  std::size_t size_ = 0;
};

// cudaMalloc a 2x larger buffer, copy, cudaFree the old one (cudaFree synchronizes the
// device, as it does for every user of this pattern).
class gpu_realloc_2x final : public grow_contender {
 public:
  ~gpu_realloc_2x() override { end(); }
  void begin(std::size_t, memory_probe* probe) override {
    end();
    tracker_.reset();
    probe_ = probe;
  }
  char* grow(std::size_t new_size) override {
    if (new_size > capacity_) {
      const std::size_t capacity = std::max(new_size, 2 * capacity_);
      char* fresh = nullptr;
      check(cudaMalloc(&fresh, capacity), "cudaMalloc(" + bytes(capacity) + ")");
      tracker_.allocated(capacity);
      if (probe_ != nullptr) probe_->sample();  // old and new storage both alive: the peak
      if (size_ != 0) {
        const cudaError_t copied = cudaMemcpyAsync(fresh, data_, size_, cudaMemcpyDeviceToDevice, nullptr);
        if (copied != cudaSuccess) {
          report(cudaFree(fresh), "cudaFree");
          tracker_.freed(capacity);
          check(copied, "cudaMemcpyAsync(" + bytes(size_) + ")");
        }
      }
      char* old = std::exchange(data_, fresh);
      tracker_.freed(std::exchange(capacity_, capacity));
      if (old != nullptr) check(cudaFree(old), "cudaFree");
    }
    size_ = new_size;
    return data_;
  }
  void end() noexcept override {
    if (data_ != nullptr) report(cudaFree(data_), "cudaFree");
    data_ = nullptr;
    size_ = capacity_ = 0;
    probe_ = nullptr;
  }
  [[nodiscard]] std::size_t own_peak_bytes() const override { return tracker_.high; }
  [[nodiscard]] std::size_t handle_count() const override { return tracker_.allocations; }

 private:
  char* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  memory_probe* probe_ = nullptr;
  allocation_tracker tracker_;
};

// Thrust's allocators carry no state, so the probe and the tracker of the one thrust
// contender that is growing are reached through these.
thread_local memory_probe* thrust_probe = nullptr;
thread_local allocation_tracker* thrust_tracker = nullptr;

// thrust::device_allocator that also samples free memory right after each allocation (when
// the old storage is still alive) and counts bytes.
template <class T>
class probed_device_allocator : public thrust::device_allocator<T> {
  using base = thrust::device_allocator<T>;

 public:
  using pointer = typename base::pointer;
  using size_type = typename base::size_type;
  template <class U>
  struct rebind {
    using other = probed_device_allocator<U>;
  };

  __host__ __device__ probed_device_allocator() {}
  __host__ __device__ probed_device_allocator(const probed_device_allocator& other) : base(other) {}
  template <class U>
  __host__ __device__ probed_device_allocator(const probed_device_allocator<U>& other) : base(other) {}
  probed_device_allocator& operator=(const probed_device_allocator&) = default;
  __host__ __device__ ~probed_device_allocator() {}

  pointer allocate(size_type n) {
    pointer p = base::allocate(n);
    if (thrust_tracker != nullptr) thrust_tracker->allocated(n * sizeof(T));
    try {
      if (thrust_probe != nullptr) thrust_probe->sample();
    } catch (...) {
      deallocate(p, n);
      throw;
    }
    return p;
  }
  void deallocate(pointer p, size_type n) {
    base::deallocate(p, n);
    if (thrust_tracker != nullptr) thrust_tracker->freed(n * sizeof(T));
  }
};

// thrust::device_vector<char>::resize: 2x capacity growth, and it zero-fills the new bytes
// before the benchmark writes them.
class gpu_thrust_resize final : public grow_contender {
  using vector = thrust::device_vector<char, probed_device_allocator<char>>;

 public:
  ~gpu_thrust_resize() override { end(); }
  void begin(std::size_t, memory_probe* probe) override {
    end();
    tracker_.reset();
    thrust_tracker = &tracker_;
    thrust_probe = probe;
    vector_ = std::make_unique<vector>();
  }
  char* grow(std::size_t new_size) override {
    vector_->resize(new_size);
    return thrust::raw_pointer_cast(vector_->data());
  }
  void end() noexcept override {
    try {
      vector_.reset();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "vmm_bench_grow: freeing a thrust::device_vector failed: %s\n", e.what());
    }
    if (thrust_tracker == &tracker_) thrust_tracker = nullptr;
    thrust_probe = nullptr;
  }
  [[nodiscard]] std::size_t own_peak_bytes() const override { return tracker_.high; }
  [[nodiscard]] std::size_t handle_count() const override { return tracker_.allocations; }

 private:
  allocation_tracker tracker_;
  std::unique_ptr<vector> vector_;
};

// ---- the raw driver sequence ----

const raw_driver_calls& driver() {
  return raw_driver<bench_failure>();
}

void check(CUresult result, const std::string& call) {
  if (result != CUDA_SUCCESS)
    throw bench_failure(call + " failed: " + raw_driver_error_name<bench_failure>(result));
}

void report(CUresult result, const char* call) noexcept {
  if (result != CUDA_SUCCESS)
    std::fprintf(stderr, "vmm_bench_grow: %s failed: CUresult %d\n", call, static_cast<int>(result));
}

// Owned driver objects, so that a constructor failing half-way leaks nothing.
struct driver_handle {
  CUmemGenericAllocationHandle handle = 0;
  bool live = false;
  ~driver_handle() {
    if (live) report(driver().release(handle), "cuMemRelease");
  }
};

struct driver_range {
  CUdeviceptr address = 0;
  std::size_t size = 0;
  ~driver_range() {
    if (address != 0) report(driver().address_free(address, size), "cuMemAddressFree");
  }
};

// One handle created as the vmm GPU provider creates its chunks (pinned, device 0, POSIX-fd
// exportable where the device supports it), mapped into a range of its size.
class raw_driver_once final : public grow_once_contender {
 public:
  // reservation: the range the chunk is mapped at the start of (0: the chunk's size). A
  // buffer that grows reserves far more than one chunk; the driver's cost for a 2 MiB map
  // depends on it, so the like-for-like floor of a growable_buffer row uses the same.
  raw_driver_once(std::size_t chunk, std::size_t reservation) {
    const raw_driver_calls& calls = driver();
    CUdevice device = 0;
    check(calls.device_get(&device, 0), "cuDeviceGet(0)");
    int posix_fd = 0;
    check(calls.device_get_attribute(&posix_fd,
                                     CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device),
          "cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)");
    CUmemAllocationProp properties{};
    properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    properties.location.id = 0;
    properties.requestedHandleTypes =
        posix_fd != 0 ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    std::size_t granularity = 0;
    check(calls.get_allocation_granularity(&granularity, &properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    if (granularity == 0) throw bench_failure("cuMemGetAllocationGranularity returned 0");
    size_ = (chunk + granularity - 1) / granularity * granularity;
    check(calls.create(&memory_.handle, size_, &properties, 0), "cuMemCreate(" + bytes(size_) + ")");
    memory_.live = true;
    const std::size_t reserved = std::max(size_, reservation);
    check(calls.address_reserve(&range_.address, reserved, 0, 0, 0),
          "cuMemAddressReserve(" + bytes(reserved) + ")");
    range_.size = reserved;
    access_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access_.location.id = 0;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  ~raw_driver_once() override {
    if (mapped_) report(driver().unmap(range_.address, size_), "cuMemUnmap");
  }
  void grow() override {
    const raw_driver_calls& calls = driver();
    check(calls.map(range_.address, size_, 0, memory_.handle, 0), "cuMemMap(" + bytes(size_) + ")");
    mapped_ = true;
    check(calls.set_access(range_.address, size_, &access_, 1), "cuMemSetAccess(" + bytes(size_) + ")");
  }
  void undo() override {
    check(driver().unmap(range_.address, size_), "cuMemUnmap(" + bytes(size_) + ")");
    mapped_ = false;
  }

 private:
  std::size_t size_ = 0;
  driver_handle memory_;  // released last
  driver_range range_;
  CUmemAccessDesc access_{};
  bool mapped_ = false;
};

// The raw driver sequence a user would write by hand: handles created as vmm creates its
// chunks, mapped at the end of one reservation, one cuMemSetAccess a grow; everything
// released in end(). The handle sizes follow a chunk_policy (its arithmetic only): 64 MiB or
// 256 MiB each, or the geometric policy's own sequence, so that vmm's geometric rows have a
// raw row that creates exactly the handles they create. The same cold state as vmm's
// cold-pool rows: no handle is reused between iterations.
class raw_vmm_grow final : public grow_contender {
 public:
  explicit raw_vmm_grow(vmm::chunk_policy policy) : policy_(policy) {}
  ~raw_vmm_grow() override { end(); }
  void begin(std::size_t final_size, memory_probe* probe) override {
    end();
    const raw_driver_calls& calls = driver();
    properties_ = {};
    properties_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    properties_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    properties_.location.id = 0;
    properties_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    check(calls.get_allocation_granularity(&granularity_, &properties_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    if (granularity_ == 0) throw bench_failure("cuMemGetAllocationGranularity returned 0");
    // Room for the policy's slack past the final size: one largest chunk.
    reserved_ = (final_size + largest_chunk - 1) / largest_chunk * largest_chunk + largest_chunk;
    check(calls.address_reserve(&base_, reserved_, 0, 0, 0), "cuMemAddressReserve(" + bytes(reserved_) + ")");
    access_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access_.location.id = 0;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    probe_ = probe;
  }
  char* grow(std::size_t new_size) override {
    const raw_driver_calls& calls = driver();
    const std::size_t first = mapped_;
    while (mapped_ < new_size) {
      const std::size_t chunk = policy_.next_chunk(mapped_, new_size, granularity_);
      CUmemGenericAllocationHandle handle = 0;
      check(calls.create(&handle, chunk, &properties_, 0), "cuMemCreate(" + bytes(chunk) + ")");
      handles_.push_back(handle);
      check(calls.map(base_ + mapped_, chunk, 0, handle, 0), "cuMemMap(" + bytes(chunk) + ")");
      mapped_ += chunk;
      if (probe_ != nullptr) probe_->sample();
    }
    if (mapped_ > first)
      check(calls.set_access(base_ + first, mapped_ - first, &access_, 1),
            "cuMemSetAccess(" + bytes(mapped_ - first) + ")");
    return reinterpret_cast<char*>(base_);
  }
  void end() noexcept override {
    const raw_driver_calls& calls = driver();
    if (mapped_ != 0) report(calls.unmap(base_, mapped_), "cuMemUnmap");
    for (CUmemGenericAllocationHandle handle : handles_) report(calls.release(handle), "cuMemRelease");
    if (base_ != 0) report(calls.address_free(base_, reserved_), "cuMemAddressFree");
    handles_.clear();
    mapped_ = 0;
    base_ = 0;
    reserved_ = 0;
  }
  [[nodiscard]] std::size_t own_peak_bytes() const override { return mapped_; }
  [[nodiscard]] std::size_t handle_count() const override { return handles_.size(); }

 private:
  static constexpr std::size_t largest_chunk = 256 * mib;
  vmm::chunk_policy policy_;
  std::size_t granularity_ = 0;
  CUmemAllocationProp properties_{};
  CUmemAccessDesc access_{};
  CUdeviceptr base_ = 0;
  std::size_t reserved_ = 0;
  std::size_t mapped_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  memory_probe* probe_ = nullptr;
};

}  // namespace

std::unique_ptr<memory_target> make_gpu_target(std::string* why) {
  try {
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    if (counted != cudaSuccess) {
      (void)cudaGetLastError();
      throw bench_failure("cudaGetDeviceCount failed: " + describe(counted));
    }
    if (count == 0) throw bench_failure("cudaGetDeviceCount found no GPU");
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    check(cudaFree(nullptr), "cudaFree(nullptr) (initialising the primary context)");
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties(0)");
    std::size_t free = 0;
    std::size_t total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    char size[32];
    std::snprintf(size, sizeof size, "%.1f GiB", static_cast<double>(total) / static_cast<double>(gib));
    return std::make_unique<gpu_target>(std::string("gpu 0: ") + properties.name + ", " + size, total);
  } catch (const bench_failure& e) {
    if (why != nullptr) *why = e.what();
    return nullptr;
  }
}

std::vector<grow_entry> gpu_baseline_contenders() {
  return {
      {"floor", contender_role::floor, [] { return std::make_unique<gpu_floor>(); }},
      {"realloc_copy_2x", contender_role::baseline, [] { return std::make_unique<gpu_realloc_2x>(); }},
      {"thrust_resize", contender_role::baseline, [] { return std::make_unique<gpu_thrust_resize>(); }},
      {"raw_vmm_64MiB_cold", contender_role::baseline,
       [] { return std::make_unique<raw_vmm_grow>(vmm::chunk_policy::fixed(64 * mib)); }},
      {"raw_vmm_256MiB_cold", contender_role::baseline,
       [] { return std::make_unique<raw_vmm_grow>(vmm::chunk_policy::fixed(256 * mib)); }},
      {"raw_vmm_geometric_cold", contender_role::baseline,
       [] { return std::make_unique<raw_vmm_grow>(vmm::chunk_policy::geometric()); }},
  };
}

std::unique_ptr<grow_contender> make_raw_vmm_grow(vmm::chunk_policy policy) {
  return std::make_unique<raw_vmm_grow>(policy);
}

std::unique_ptr<grow_once_contender> make_raw_driver_once(std::size_t chunk, std::size_t reservation) {
  return std::make_unique<raw_driver_once>(chunk, reservation);
}

std::size_t reach_with_realloc_2x(memory_target& target, std::size_t append) {
  struct device_buffer {
    char* data = nullptr;
    ~device_buffer() {
      if (data != nullptr) report(cudaFree(data), "cudaFree");
    }
  } buffer;
  std::size_t size = 0;
  std::size_t capacity = 0;
  const std::size_t total = target.total_bytes();
  while (size + append <= total) {
    if (size + append > capacity) {
      const std::size_t grown = std::max(size + append, 2 * capacity);
      char* fresh = nullptr;
      const cudaError_t allocated = cudaMalloc(&fresh, grown);
      if (allocated == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // not sticky; clear it for the calls that follow
        break;
      }
      check(allocated, "cudaMalloc(" + bytes(grown) + ")");
      if (size != 0) {
        const cudaError_t copied =
            cudaMemcpyAsync(fresh, buffer.data, size, cudaMemcpyDeviceToDevice, nullptr);
        if (copied != cudaSuccess) {
          report(cudaFree(fresh), "cudaFree");
          check(copied, "cudaMemcpyAsync(" + bytes(size) + ")");
        }
      }
      char* old = std::exchange(buffer.data, fresh);
      capacity = grown;
      if (old != nullptr) check(cudaFree(old), "cudaFree");
    }
    target.fill(buffer.data + size, append);
    size += append;
  }
  target.synchronize();
  return size;
}

}  // namespace vmm::bench
