// memory_resource against the concepts: vmm's own (vmm/resource_like.hpp), which need no
// macro, and the CUDA toolkit's cuda::mr, which CCCL 3.0 keeps behind its experimental macro
// (vmm/cuda_mr.hpp). Compiled by the host compiler with the toolkit's headers, so that it
// runs on every machine: its resource is over host memory (location::os_host()), held by a
// device_accessible resource_ref (CCCL asks for one execution-space property). That property
// is a claim about the type (vmm/cuda_mr.hpp); only the host touches this memory here.

#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#include "vmm/cuda_mr.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

#include "vmm/memory_resource.hpp"
#include "vmm/resource_like.hpp"

namespace vmm::testing {
namespace {

// ---- vmm's concepts: what satisfies them and what does not -------------------------------

struct synchronous_only {
  void* allocate_sync(std::size_t, std::size_t);
  void deallocate_sync(void*, std::size_t, std::size_t) noexcept;
  friend bool operator==(const synchronous_only&, const synchronous_only&) = default;
};
struct throwing_free {
  void* allocate_sync(std::size_t, std::size_t);
  void deallocate_sync(void*, std::size_t, std::size_t);  // may throw: not a resource
  friend bool operator==(const throwing_free&, const throwing_free&) = default;
};
struct incomparable {
  void* allocate_sync(std::size_t, std::size_t);
  void deallocate_sync(void*, std::size_t, std::size_t) noexcept;
};

static_assert(resource_like<memory_resource>);
static_assert(synchronous_resource_like<memory_resource>);
static_assert(synchronous_resource_like<synchronous_only>);
static_assert(!resource_like<synchronous_only>);
static_assert(!synchronous_resource_like<throwing_free>);
static_assert(!synchronous_resource_like<incomparable>);

// ---- CCCL 3.0's concepts (the toolkit's own, under its experimental macro) ---------------

static_assert(cuda::mr::resource<memory_resource>);
static_assert(cuda::mr::async_resource<memory_resource>);
static_assert(cuda::mr::async_resource_with<memory_resource, cuda::mr::device_accessible>);
static_assert(!cuda::has_property<memory_resource, cuda::mr::host_accessible>);

// Through CCCL's type-erased reference, every call reaches the resource: the bytes are
// usable, equal references name the same resource, and each free is the resource's own (no
// refused deallocation, nothing used afterwards).
TEST(cuda_mr, a_resource_ref_allocates_and_frees_through_the_resource) {
  memory_resource host(location::os_host());
  memory_resource other(location::os_host());
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{host};
  EXPECT_TRUE(ref == cuda::mr::async_resource_ref<cuda::mr::device_accessible>{host});
  EXPECT_FALSE(ref == cuda::mr::async_resource_ref<cuda::mr::device_accessible>{other});

  void* ordered = ref.allocate_async(1000, 256, cuda::stream_ref{});
  void* plain = ref.allocate(3000, 512);
  ASSERT_NE(ordered, nullptr);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(plain) % 512, 0u);
  std::memset(ordered, 0x5a, 1000);
  std::memset(plain, 0xa5, 3000);
  EXPECT_EQ(static_cast<unsigned char*>(ordered)[999], 0x5a);
  EXPECT_GE(host.statistics().used_current, 4000u);

  ref.deallocate_async(ordered, 1000, 256, cuda::stream_ref{});
  ref.deallocate(plain, 3000, 512);
  EXPECT_EQ(host.statistics().used_current, 0u);
  EXPECT_EQ(host.statistics().bad_deallocations, 0u);
  EXPECT_EQ(other.statistics().used_current, 0u);
}

}  // namespace
}  // namespace vmm::testing
