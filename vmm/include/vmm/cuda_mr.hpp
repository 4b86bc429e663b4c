#pragma once
/// @file
/// vmm::memory_resource as a CCCL 3.0 memory resource (cuda::mr), for CUDA C++ code only.
///
///     #define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE   // before any CCCL header
///     #include "vmm/cuda_mr.hpp"
///
///     vmm::memory_resource gpu(vmm::location::device(0));
///     cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{gpu};
///     void* p = ref.allocate_async(bytes, 256, cuda::stream_ref{stream});
///     ref.deallocate_async(p, bytes, 256, cuda::stream_ref{stream});
///
/// memory_resource has the members cuda::mr::async_resource asks for (allocate and
/// deallocate of (bytes, alignment), allocate_async and deallocate_async with a stream,
/// equality); this header adds the one property it declares, found by argument-dependent
/// lookup, so that a cuda::mr::async_resource_ref<cuda::mr::device_accessible> (and
/// resource_ref) can hold it.
///
/// The property is a claim about the type, not about one resource: CCCL asks it before any
/// object exists. It is true of a resource over GPU memory (location::device) or pinned host
/// memory (location::pinned_host): kernels on the GPUs given access (the memory's own GPU by
/// default; set_access adds others) may read and write what it allocates. A resource over
/// location::os_host() is host memory that no GPU can reach: never hand one to code that asks
/// for device_accessible. host_accessible is not declared: device memory is not
/// host-dereferenceable, and a property cannot depend on the location.
///
/// Code that wants no CCCL header, or the CCCL 3.1 names (allocate_sync, allocate(stream,
/// bytes, alignment)), checks memory_resource against vmm/resource_like.hpp's concepts instead:
/// they need no macro.
///
/// Only for code compiled with the CUDA toolkit's headers (nvcc, or a host compiler given
/// the toolkit's include directories): <cuda/memory_resource> needs <cuda_runtime_api.h>.
/// The library itself never includes this header.

#ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#error \
    "vmm/cuda_mr.hpp: define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE before including any CCCL header (CCCL 3.0 keeps cuda::mr behind it)"
#endif

#include <cuda/memory_resource>

#include "vmm/memory_resource.hpp"

namespace vmm {

/// cuda::mr::device_accessible: what memory_resource allocates, GPUs may access. True of
/// resources over location::device and location::pinned_host; see the file comment for
/// location::os_host().
constexpr void get_property(const memory_resource&, cuda::mr::device_accessible) noexcept {}

}  // namespace vmm
