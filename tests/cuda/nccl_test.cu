// vmm memory registered with NCCL (ncclCommRegister) and reduced over it: two GPUs in one
// process (ncclCommInitAll over devices 0 and 1), an all-reduce (sum of floats) that reads
// and writes (a) allocations of a vmm::memory_resource on each GPU and (b) a growable_buffer
// on each GPU, the result checked on the host, the buffers deregistered; and (c) allocations
// registered through the resource (memory_resource::register_memory), reduced after a sleep
// and a wake have put new physical memory under them (vmm/memory_registration.hpp).
//
// What registration needs of the memory: NCCL finds the physical segments under a
// registered range (cuMemGetAddressRange, segment by segment) and exports each one with its
// own handle type (POSIX fd here), so every chunk must have been created exportable: vmm's
// driver provider asks for POSIX-fd handles whenever the GPU supports them, and the
// resource says so with handle_type posix_fd (refused where the GPU cannot). Buffers start
// on the granularity, which on these GPUs is the recommended one (vmm-info says so per GPU).
//
// NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set before the communicators
// are made when it is unset, and the test skips when it is set to anything else. Nothing
// here calls cuMulticastCreate. Run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG to see what
// NCCL registered. Every test skips with the reason where there are fewer than two GPUs.

#include <nccl.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/error.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/provider.hpp"

namespace vmm::testing {
namespace {

constexpr int ranks = 2;
constexpr std::size_t floats = (std::size_t{24} << 20) / sizeof(float) + 77;  // 24 MiB and a tail

void nccl_check(ncclResult_t result, const char* call) {
  if (result != ncclSuccess)
    throw std::runtime_error(std::string(call) + ": " + ncclGetErrorString(result) + " (" +
                             ncclGetLastError(nullptr) + ")");
}
#define VMM_NCCL_CHECK(call) nccl_check((call), #call)

// Rank r's contribution at index i: small integers, so that the float sum is exact.
__host__ __device__ float contribution(int rank, std::size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 1000 + 1));
}

__global__ void write_contribution(float* values, std::size_t count, int rank) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x)
    values[i] = contribution(rank, i);
}

// A buffer registered with a communicator for the guard's life.
class registration {
 public:
  registration(ncclComm_t comm, void* data, std::size_t bytes) : comm_(comm) {
    VMM_NCCL_CHECK(ncclCommRegister(comm_, data, bytes, &handle_));
  }
  registration(const registration&) = delete;
  registration& operator=(const registration&) = delete;
  ~registration() { ncclCommDeregister(comm_, handle_); }
  // Deregisters now, checked.
  void deregister() {
    void* handle = handle_;
    handle_ = nullptr;
    VMM_NCCL_CHECK(ncclCommDeregister(comm_, handle));
  }

 private:
  ncclComm_t comm_;
  void* handle_ = nullptr;
};

// ncclCommRegister / ncclCommDeregister as a vmm::memory_registrar: the resource calls it so
// that a registration follows its memory across sleep and wake.
class nccl_registrar : public memory_registrar {
 public:
  explicit nccl_registrar(ncclComm_t comm) : comm_(comm) {}
  void* register_memory(void* ptr, std::size_t bytes) override {
    void* handle = nullptr;
    VMM_NCCL_CHECK(ncclCommRegister(comm_, ptr, bytes, &handle));
    ++registered;
    return handle;
  }
  void deregister_memory(void* handle) noexcept override {
    if (ncclCommDeregister(comm_, handle) != ncclSuccess) report_cleanup_failure("ncclCommDeregister failed");
    ++deregistered;
  }
  int registered = 0;
  int deregistered = 0;

 private:
  ncclComm_t comm_;
};

class nccl_two_gpus : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "needs 2 GPUs; no GPU here: " << why;
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    if (counted == cudaErrorInsufficientDriver)
      GTEST_SKIP() << "the driver is older than the CUDA runtime these tests were built with";
    VMM_CUDA_CHECK(counted);
    if (count < ranks) GTEST_SKIP() << "needs 2 GPUs; this machine has " << count;
    if (const char* nvls = std::getenv("NCCL_NVLS_ENABLE"); nvls != nullptr && std::string(nvls) != "0")
      GTEST_SKIP() << "NCCL_NVLS_ENABLE=" << nvls << ": this test runs with NVLink multicast off only";
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);
    for (int d = 0; d < ranks; ++d) {
      const provider_capabilities& offered = provider_for(location::device(d))->capabilities();
      if (offered.export_kind == handle_kind::none)
        GTEST_SKIP() << "gpu " << d
                     << " cannot export its memory (no POSIX-fd handles): NCCL cannot register it";
      on_device selected(d);
      VMM_CUDA_CHECK(cudaFree(nullptr));  // the primary context, which vmm's driver layer uses too
      streams_.push_back(std::make_unique<cuda_stream>());
      granularity_.push_back(offered.recommended_granularity);
    }
    const int devices[ranks] = {0, 1};
    VMM_NCCL_CHECK(ncclCommInitAll(comms_, ranks, devices));
  }
  void TearDown() override {
    for (ncclComm_t comm : comms_)
      if (comm != nullptr) ncclCommDestroy(comm);
  }

  // Writes each rank's contribution into send[r] on its stream.
  void write_contributions(const std::vector<float*>& send) {
    for (int r = 0; r < ranks; ++r) {
      on_device selected(r);
      write_contribution<<<264, 256, 0, streams_[r]->get()>>>(send[r], floats, r);
      VMM_CUDA_CHECK(cudaGetLastError());
    }
  }

  // Writes each rank's contribution into send[r], all-reduces into receive[r] (both
  // registered), and checks every value on every rank.
  void reduce_and_check(const std::vector<float*>& send, const std::vector<float*>& receive) {
    write_contributions(send);
    std::vector<std::unique_ptr<registration>> registered;
    for (int r = 0; r < ranks; ++r) {
      registered.push_back(std::make_unique<registration>(comms_[r], send[r], floats * sizeof(float)));
      registered.push_back(std::make_unique<registration>(comms_[r], receive[r], floats * sizeof(float)));
    }
    all_reduce_and_check(send, receive);
    for (auto& buffer : registered) buffer->deregister();
  }

  // All-reduces send[r] into receive[r] (registered already) and checks every value.
  void all_reduce_and_check(const std::vector<float*>& send, const std::vector<float*>& receive) {
    VMM_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < ranks; ++r)
      VMM_NCCL_CHECK(
          ncclAllReduce(send[r], receive[r], floats, ncclFloat, ncclSum, comms_[r], streams_[r]->get()));
    VMM_NCCL_CHECK(ncclGroupEnd());
    for (int r = 0; r < ranks; ++r) {
      on_device selected(r);
      streams_[r]->synchronize();
      std::vector<float> result(floats);
      VMM_CUDA_CHECK(cudaMemcpy(result.data(), receive[r], floats * sizeof(float), cudaMemcpyDeviceToHost));
      std::size_t wrong = 0;
      std::size_t first_wrong = floats;
      for (std::size_t i = 0; i < floats; ++i) {
        float expected = 0;
        for (int k = 0; k < ranks; ++k) expected += contribution(k, i);
        if (result[i] != expected && wrong++ == 0) first_wrong = i;
      }
      EXPECT_EQ(wrong, 0U) << "rank " << r << ", first at index " << first_wrong;
    }
  }

  // Allocations of `bytes` (at least floats' worth) from a resource on each GPU, made with
  // `properties`: their first floats are registered and all-reduced.
  void reduce_over_resource_allocations(memory_resource_properties properties, std::size_t bytes) {
    std::vector<std::unique_ptr<memory_resource>> resources;
    std::vector<float*> send;
    std::vector<float*> receive;
    for (int r = 0; r < ranks; ++r) {
      resources.push_back(std::make_unique<memory_resource>(location::device(r), properties));
      // A buffer that starts at a page (the recommended granularity here): the resource hands
      // out allocations of at least a page at page boundaries when asked to align so.
      const std::size_t page = resources.back()->pool()->granularity();
      ASSERT_EQ(page, granularity_[r]) << "gpu " << r << ": vmm's page is not the recommended granularity";
      send.push_back(static_cast<float*>(resources.back()->allocate(streams_[r]->get(), bytes, page)));
      receive.push_back(static_cast<float*>(resources.back()->allocate(streams_[r]->get(), bytes, page)));
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(send.back()) % page, 0U);
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(receive.back()) % page, 0U);
      ASSERT_EQ(resources.back()->pages_of(send.back(), bytes).page_size,
                properties.large_page_size == 0 ? page : properties.large_page_size);
    }
    reduce_and_check(send, receive);
    for (int r = 0; r < ranks; ++r) {
      const std::size_t page = resources[r]->pool()->granularity();
      resources[r]->deallocate(streams_[r]->get(), send[r], bytes, page);
      resources[r]->deallocate(streams_[r]->get(), receive[r], bytes, page);
      streams_[r]->synchronize();
    }
  }

  ncclComm_t comms_[ranks] = {};
  std::vector<std::unique_ptr<cuda_stream>> streams_;
  std::vector<std::size_t> granularity_;
};

TEST_F(nccl_two_gpus, all_reduce_over_registered_memory_resource_allocations) {
  reduce_over_resource_allocations({.handle_type = handle_kind::posix_fd}, floats * sizeof(float));
}

// vmm_torch's resources: large pages (16 times the granularity) under requests of two or more.
TEST_F(nccl_two_gpus, all_reduce_over_registered_large_page_allocations) {
  const std::size_t large = granularity_[0] * memory_resource::default_large_page_granules;
  reduce_over_resource_allocations({.handle_type = handle_kind::posix_fd, .large_page_size = large},
                                   2 * large + floats * sizeof(float));
}

// The registrations go with the pages at sleep() and come back over the new pages at wake():
// the reduce after the wake reads the restored contributions through NCCL's registration.
TEST_F(nccl_two_gpus, registrations_made_through_the_resource_follow_it_across_sleep_and_wake) {
  constexpr allocation_tag weights{1};
  const std::size_t bytes = floats * sizeof(float);
  std::vector<std::unique_ptr<memory_resource>> resources;
  std::vector<std::shared_ptr<nccl_registrar>> registrars;
  std::vector<memory_registration> registrations;
  std::vector<float*> send;
  std::vector<float*> receive;
  for (int r = 0; r < ranks; ++r) {
    resources.push_back(std::make_unique<memory_resource>(
        location::device(r), memory_resource_properties{.handle_type = handle_kind::posix_fd}));
    const std::size_t page = resources.back()->pool()->granularity();
    send.push_back(static_cast<float*>(resources.back()->allocate(streams_[r]->get(), bytes, page, weights)));
    receive.push_back(
        static_cast<float*>(resources.back()->allocate(streams_[r]->get(), bytes, page, weights)));
    registrars.push_back(std::make_shared<nccl_registrar>(comms_[r]));
  }
  write_contributions(send);
  for (int r = 0; r < ranks; ++r) {
    streams_[r]->synchronize();
    registrations.push_back(resources[r]->register_memory(send[r], bytes, registrars[r]));
    registrations.push_back(resources[r]->register_memory(receive[r], bytes, registrars[r]));
  }
  const allocation_tag offload[] = {weights};
  for (int r = 0; r < ranks; ++r) {
    on_device selected(r);
    resources[r]->sleep(offload, streams_[r]->get());
    EXPECT_EQ(registrars[r]->deregistered, 2) << "rank " << r;
    EXPECT_EQ(resources[r]->statistics().reserved_current, 0U);
    resources[r]->wake({}, streams_[r]->get());
    EXPECT_EQ(registrars[r]->registered, 4) << "rank " << r << ": not registered again over the new pages";
  }
  all_reduce_and_check(send, receive);
  registrations.clear();
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(registrars[r]->deregistered, 4) << "rank " << r;
    const std::size_t page = resources[r]->pool()->granularity();
    resources[r]->deallocate(streams_[r]->get(), send[r], bytes, page);
    resources[r]->deallocate(streams_[r]->get(), receive[r], bytes, page);
    streams_[r]->synchronize();
  }
}

TEST_F(nccl_two_gpus, all_reduce_over_registered_growable_buffers) {
  std::vector<std::unique_ptr<growable_buffer>> send_buffers;
  std::vector<std::unique_ptr<growable_buffer>> receive_buffers;
  std::vector<float*> send;
  std::vector<float*> receive;
  const std::size_t bytes = floats * sizeof(float);
  for (int r = 0; r < ranks; ++r) {
    // max_size a multiple of the recommended granularity, so that the range starts on it.
    const std::size_t max_size = round_up(4 * bytes, granularity_[r]);
    for (auto* buffers : {&send_buffers, &receive_buffers}) {
      buffers->push_back(std::make_unique<growable_buffer>(
          location::device(r), growable_buffer_options{.max_size = max_size, .stream = streams_[r]->get()}));
      // Grown in two steps, so that the registered range spans several chunks (segments).
      buffers->back()->resize(bytes / 3);
      buffers->back()->resize(bytes);
      ASSERT_GE(buffers->back()->chunk_count(), 2U);
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(buffers->back()->data()) % granularity_[r], 0U);
    }
    send.push_back(static_cast<float*>(send_buffers.back()->data()));
    receive.push_back(static_cast<float*>(receive_buffers.back()->data()));
  }
  reduce_and_check(send, receive);
  for (int r = 0; r < ranks; ++r) streams_[r]->synchronize();
}

}  // namespace
}  // namespace vmm::testing
