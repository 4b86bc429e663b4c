// The contenders that need only vmm and the OS: vmm's own (on any location) and the host
// baselines of the OS-provider set.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "grow_bench.hpp"
#include "vmm/address_range.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/physical_allocation.hpp"
#include "vmm/provider.hpp"

namespace vmm::bench {
namespace {

location location_of(int gpu_ordinal) {
  return gpu_ordinal < 0 ? location::os_host() : location::device(gpu_ordinal);
}

// Destructors of benchmark objects report, never throw (the library's own habit).
template <class Fn>
void report_failure_of(const char* what, Fn&& fn) noexcept {
  try {
    fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vmm_bench_grow: %s failed: %s\n", what, e.what());
  }
}

// `error` is errno read right after the failing call, before anything can change it.
[[noreturn]] void throw_errno(int error, const std::string& call) {
  throw bench_failure(fmt::format("{} failed: {}", call, std::strerror(error)));
}

// ---- vmm ----

class vmm_grow_contender final : public grow_contender {
 public:
  vmm_grow_contender(location where, chunk_policy policy, bool warm)
      : where_(where), policy_(policy), warm_(warm) {}
  ~vmm_grow_contender() override { end(); }

  void begin(std::size_t, memory_probe*) override {
    if (!pool_) pool_ = chunk_pool::create(provider_for(where_));
    buffer_.emplace(pool_, growable_buffer_options{.policy = policy_});
  }
  char* grow(std::size_t new_size) override {
    buffer_->resize(new_size);
    return static_cast<char*>(buffer_->data());
  }
  void end() noexcept override {
    buffer_.reset();  // its destructor waits for the stream, unmaps, gives the chunks back
    if (!warm_ && pool_) {
      report_failure_of("chunk_pool::trim_to(0)", [&] { pool_->trim_to(0); });
      pool_.reset();
    }
  }
  [[nodiscard]] std::size_t own_peak_bytes() const override {
    return pool_ ? pool_->statistics().reserved_high : 0;
  }
  [[nodiscard]] std::size_t handle_count() const override { return buffer_ ? buffer_->chunk_count() : 0; }

 private:
  location where_;
  chunk_policy policy_;
  bool warm_;
  std::shared_ptr<chunk_pool> pool_;
  std::optional<growable_buffer> buffer_;  // destroyed before pool_ is trimmed
};

class vmm_growable_once final : public grow_once_contender {
 public:
  // max_size 0: the default reservation (the device's whole memory).
  vmm_growable_once(location where, std::size_t chunk, std::size_t max_size)
      : pool_(chunk_pool::create(provider_for(where))),
        buffer_(pool_, growable_buffer_options{.max_size = max_size, .policy = chunk_policy::fixed(chunk)}),
        chunk_(round_up(chunk, pool_->granularity())) {
    // Warm the pool: the timed grows take this chunk back without creating memory.
    grow();
    if (buffer_.capacity() != chunk_)
      throw bench_failure(
          fmt::format("growable_buffer::reserve({}) mapped {} bytes", chunk_, buffer_.capacity()));
    undo();
    if (buffer_.capacity() != 0 || buffer_.chunk_count() != 0)
      throw bench_failure("growable_buffer: shrink_to_fit + release_retired left chunks mapped");
    created_at_start_ = pool_->statistics().chunks_created;
  }
  void grow() override { buffer_.reserve(chunk_); }
  void undo() override {
    buffer_.shrink_to_fit();
    buffer_.collect_retired(true);
  }
  [[nodiscard]] std::size_t chunks_created() const override {
    return pool_->statistics().chunks_created - created_at_start_;
  }

 private:
  std::shared_ptr<chunk_pool> pool_;
  growable_buffer buffer_;  // declared after pool_: destroyed first
  std::size_t chunk_;
  std::size_t created_at_start_ = 0;
};

class vmm_provider_once final : public grow_once_contender {
 public:
  vmm_provider_once(location where, std::size_t chunk)
      : provider_(provider_for(where)), memory_(provider_, chunk), range_(provider_, memory_.size()) {}
  ~vmm_provider_once() override {
    if (mapped_) report_failure_of("memory_provider::unmap", [&] { undo(); });
  }
  void grow() override {
    provider_->map(range_.address(), memory_.size(), memory_.get());
    mapped_ = true;
    provider_->set_access(range_.address(), memory_.size(),
                          provider_->capabilities().grants(access_mode::read_write));
  }
  void undo() override {
    provider_->unmap(range_.address(), memory_.size());
    mapped_ = false;
  }

 private:
  std::shared_ptr<memory_provider> provider_;
  physical_allocation memory_;
  address_range range_;  // freed before memory_ is released; unmapped first by ~vmm_provider_once
  bool mapped_ = false;
};

// ---- the OS-provider set ----

class os_target final : public memory_target {
 public:
  [[nodiscard]] std::string name() const override { return "os host"; }
  [[nodiscard]] bool is_gpu() const noexcept override { return false; }
  void fill(void* p, std::size_t n) override { std::memset(p, 0x5a, n); }
  void synchronize() override {}
  [[nodiscard]] std::optional<std::size_t> free_bytes() override { return std::nullopt; }
  [[nodiscard]] std::size_t total_bytes() override {
    return provider_for(location::os_host())->capabilities().physical_memory_size;
  }
};

// Preallocated host memory, touched once before the timed part so that, like cudaMalloc'd
// memory, it is committed: the floor is the writes alone.
class host_floor final : public grow_contender {
 public:
  void begin(std::size_t final_size, memory_probe*) override {
    memory_ = std::make_unique_for_overwrite<char[]>(final_size);
    std::memset(memory_.get(), 0, final_size);
    peak_ = final_size;
  }
  char* grow(std::size_t) override { return memory_.get(); }
  void end() noexcept override { memory_.reset(); }
  [[nodiscard]] std::size_t own_peak_bytes() const override { return peak_; }
  [[nodiscard]] std::size_t handle_count() const override { return 1; }

 private:
  std::unique_ptr<char[]> memory_;
  std::size_t peak_ = 0;
};

// malloc a 2× larger buffer, memcpy, free the old one (what realloc would do if it could not
// move pages; glibc's realloc of large blocks uses mremap and does not copy).
class host_realloc_2x final : public grow_contender {
 public:
  ~host_realloc_2x() override { end(); }
  void begin(std::size_t, memory_probe*) override {
    end();
    tracker_.reset();
  }
  char* grow(std::size_t new_size) override {
    if (new_size > capacity_) {
      const std::size_t capacity = std::max(new_size, 2 * capacity_);
      auto* fresh = static_cast<char*>(std::malloc(capacity));
      if (fresh == nullptr) throw bench_failure(fmt::format("malloc({}) failed", capacity));
      tracker_.allocated(capacity);
      if (size_ != 0) std::memcpy(fresh, data_, size_);
      std::free(data_);
      tracker_.freed(capacity_);
      data_ = fresh;
      capacity_ = capacity;
    }
    size_ = new_size;
    return data_;
  }
  void end() noexcept override {
    std::free(data_);
    data_ = nullptr;
    size_ = capacity_ = 0;
  }
  [[nodiscard]] std::size_t own_peak_bytes() const override { return tracker_.high; }
  [[nodiscard]] std::size_t handle_count() const override { return tracker_.allocations; }

 private:
  char* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  allocation_tracker tracker_;
};

template <class T>
class counting_allocator {
 public:
  using value_type = T;
  explicit counting_allocator(allocation_tracker* tracker) noexcept : tracker_(tracker) {}
  template <class U>
  counting_allocator(const counting_allocator<U>& other) noexcept : tracker_(other.tracker()) {}
  T* allocate(std::size_t n) {
    T* p = std::allocator<T>{}.allocate(n);
    tracker_->allocated(n * sizeof(T));
    return p;
  }
  void deallocate(T* p, std::size_t n) noexcept {
    std::allocator<T>{}.deallocate(p, n);
    tracker_->freed(n * sizeof(T));
  }
  [[nodiscard]] allocation_tracker* tracker() const noexcept { return tracker_; }
  friend bool operator==(const counting_allocator&, const counting_allocator&) = default;

 private:
  allocation_tracker* tracker_;
};

// std::vector<char>::resize: 2× capacity growth, and it zeroes the new bytes before the
// benchmark writes them (as thrust::device_vector::resize does on the GPU).
class host_vector_resize final : public grow_contender {
 public:
  void begin(std::size_t, memory_probe*) override {
    vector_.reset();
    tracker_.reset();
    vector_.emplace(counting_allocator<char>(&tracker_));
  }
  char* grow(std::size_t new_size) override {
    vector_->resize(new_size);
    return vector_->data();
  }
  void end() noexcept override { vector_.reset(); }
  [[nodiscard]] std::size_t own_peak_bytes() const override { return tracker_.high; }
  [[nodiscard]] std::size_t handle_count() const override { return tracker_.allocations; }

 private:
  allocation_tracker tracker_;
  std::optional<std::vector<char, counting_allocator<char>>> vector_;
};

// The OS's own cost of growth by mapping: one committed memfd of the final size, each step's
// new pages mapped (MAP_FIXED | MAP_SHARED) at the end of a reservation, their page tables
// filled at once (MADV_POPULATE_WRITE): the OS at its best. Without huge pages for
// shared memory every 4 KiB page still takes a page-table entry, which is what separates
// growth by mapping from writes into memory touched long before (the floor).
class host_map_committed final : public grow_contender {
 public:
  ~host_map_committed() override { end(); }
  void begin(std::size_t final_size, memory_probe*) override {
    end();
    fd_ = ::memfd_create("vmm-bench", MFD_CLOEXEC);
    if (fd_ < 0) throw_errno(errno, "memfd_create");
    if (::fallocate(fd_, 0, 0, static_cast<off_t>(final_size)) != 0) throw_errno(errno, "fallocate");
    void* base = ::mmap(nullptr, final_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw_errno(errno, fmt::format("mmap(PROT_NONE, {})", final_size));
    base_ = static_cast<char*>(base);
    reserved_ = final_size;
  }
  char* grow(std::size_t new_size) override {
    if (new_size > reserved_) throw bench_failure(fmt::format("grow to {} past {}", new_size, reserved_));
    if (new_size > mapped_) {
      const std::size_t bytes = new_size - mapped_;
      if (::mmap(base_ + mapped_, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_,
                 static_cast<off_t>(mapped_)) == MAP_FAILED)
        throw_errno(errno, fmt::format("mmap(MAP_SHARED | MAP_FIXED, {})", bytes));
      (void)::madvise(base_ + mapped_, bytes, MADV_POPULATE_WRITE);  // advice: faults otherwise
      mapped_ = new_size;
    }
    return base_;
  }
  void end() noexcept override {
    if (base_ != nullptr && ::munmap(base_, reserved_) != 0)
      std::fprintf(stderr, "vmm_bench_grow: munmap failed: %s\n", std::strerror(errno));
    if (fd_ >= 0) ::close(fd_);
    base_ = nullptr;
    fd_ = -1;
    reserved_ = mapped_ = 0;
  }
  [[nodiscard]] std::size_t own_peak_bytes() const override { return reserved_; }
  [[nodiscard]] std::size_t handle_count() const override { return 1; }

 private:
  int fd_ = -1;
  char* base_ = nullptr;
  std::size_t reserved_ = 0;
  std::size_t mapped_ = 0;
};

// What the OS provider does under map + set_access, with no registry, lock or pool around
// it: mmap(MAP_FIXED) of a memfd into a PROT_NONE reservation, then mprotect.
class raw_os_once final : public grow_once_contender {
 public:
  explicit raw_os_once(std::size_t chunk) : size_(chunk) {
    fd_ = ::memfd_create("vmm-bench", MFD_CLOEXEC);
    if (fd_ < 0) throw_errno(errno, "memfd_create");
    if (::fallocate(fd_, 0, 0, static_cast<off_t>(size_)) != 0) {
      const int error = errno;
      ::close(fd_);
      throw_errno(error, fmt::format("fallocate({})", size_));
    }
    // A PROT_NONE reservation aligned to 2 MiB and trimmed to the size, as the provider's
    // are (the same layout of mappings, and huge pages may depend on the alignment).
    const std::size_t alignment = 2 * mib;
    const std::size_t padded = size_ + alignment;
    void* base = ::mmap(nullptr, padded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      const int error = errno;
      ::close(fd_);
      throw_errno(error, fmt::format("mmap(PROT_NONE, {})", padded));
    }
    const auto start = reinterpret_cast<std::uintptr_t>(base);
    const std::uintptr_t aligned = (start + alignment - 1) & ~(alignment - 1);
    if (aligned > start) ::munmap(base, aligned - start);
    if (start + padded > aligned + size_)
      ::munmap(reinterpret_cast<void*>(aligned + size_), start + padded - (aligned + size_));
    address_ = reinterpret_cast<void*>(aligned);
  }
  ~raw_os_once() override {
    if (::munmap(address_, size_) != 0)
      std::fprintf(stderr, "vmm_bench_grow: munmap failed: %s\n", std::strerror(errno));
    ::close(fd_);
  }
  void grow() override {
    if (::mmap(address_, size_, PROT_NONE, MAP_SHARED | MAP_FIXED, fd_, 0) == MAP_FAILED) {
      const int error = errno;
      throw_errno(error, fmt::format("mmap(MAP_SHARED | MAP_FIXED, {})", size_));
    }
    if (::mprotect(address_, size_, PROT_READ | PROT_WRITE) != 0) {
      const int error = errno;
      throw_errno(error, fmt::format("mprotect({})", size_));
    }
  }
  void undo() override {
    if (::mmap(address_, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) ==
        MAP_FAILED) {
      const int error = errno;
      throw_errno(error, fmt::format("mmap(PROT_NONE | MAP_FIXED, {})", size_));
    }
  }

 private:
  std::size_t size_;
  int fd_ = -1;
  void* address_ = nullptr;
};

struct scope_exit {
  std::function<void()> fn;
  ~scope_exit() { fn(); }
};

}  // namespace

std::unique_ptr<grow_contender> make_vmm_contender(int gpu_ordinal, chunk_policy policy, bool warm) {
  return std::make_unique<vmm_grow_contender>(location_of(gpu_ordinal), policy, warm);
}

std::unique_ptr<grow_once_contender> make_vmm_growable_once(int gpu_ordinal, std::size_t chunk,
                                                            std::size_t max_size) {
  return std::make_unique<vmm_growable_once>(location_of(gpu_ordinal), chunk, max_size);
}

std::unique_ptr<grow_once_contender> make_vmm_provider_once(int gpu_ordinal, std::size_t chunk) {
  return std::make_unique<vmm_provider_once>(location_of(gpu_ordinal), chunk);
}

std::size_t reach_with_vmm(memory_target& target, int gpu_ordinal, std::size_t append) {
  const location where = location_of(gpu_ordinal);
  // Whatever happens, the default pool gives its idle chunks back: later benchmarks need
  // the memory.
  const scope_exit trim{
      [&] { report_failure_of("default_pool().trim_to(0)", [&] { default_pool(where)->trim_to(0); }); }};
  growable_buffer buffer(default_pool(where), growable_buffer_options{.max_size = target.total_bytes()});
  std::size_t reached = 0;
  while (reached + append <= buffer.max_size()) {
    try {
      buffer.resize(reached + append);
    } catch (const out_of_memory&) {
      break;  // the buffer is as it was before this append
    }
    target.fill(static_cast<char*>(buffer.data()) + reached, append);
    reached += append;
  }
  target.synchronize();
  return reached;
}

std::unique_ptr<memory_target> make_os_target() {
  return std::make_unique<os_target>();
}

std::vector<grow_entry> os_baseline_contenders() {
  return {
      {"floor", contender_role::floor, [] { return std::make_unique<host_floor>(); }},
      {"map_committed_pages", contender_role::baseline,
       [] { return std::make_unique<host_map_committed>(); }},
      {"realloc_copy_2x", contender_role::baseline, [] { return std::make_unique<host_realloc_2x>(); }},
      {"std_vector_resize", contender_role::baseline, [] { return std::make_unique<host_vector_resize>(); }},
  };
}

std::unique_ptr<grow_once_contender> make_raw_os_once(std::size_t chunk) {
  return std::make_unique<raw_os_once>(chunk);
}

}  // namespace vmm::bench
