#pragma once
/// @file
/// What a memory resource offers, as concepts that need no CCCL header and no experimental
/// macro: the members the CCCL of CUDA 13.1 and later asks of cuda::mr::synchronous_resource
/// and cuda::mr::resource, spelled with vmm's stream_ref.
///
///     template <vmm::resource_like Resource>
///     void* scratch(Resource& r, vmm::stream_ref stream, std::size_t n) {
///       return r.allocate(stream, n, 256);    // freed with r.deallocate(stream, p, n, 256)
///     }
///     static_assert(vmm::resource_like<vmm::memory_resource>);
///
/// The names follow CCCL 3.1: `allocate_sync` / `deallocate_sync` without stream order,
/// `allocate(stream, bytes, alignment)` / `deallocate(stream, ptr, bytes, alignment)` in stream
/// order, deallocation that never throws, and equality (two resources are equal when memory
/// from one may be freed through the other). The CCCL of CUDA 13.0 (3.0) has these concepts
/// only behind LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE and with older names;
/// vmm/cuda_mr.hpp adapts memory_resource to them. Header-only: concepts, no code.

#include <concepts>
#include <cstddef>

#include "vmm/stream_ref.hpp"

namespace vmm {

/// Allocates and frees without stream order (CCCL 3.1's cuda::mr::synchronous_resource):
/// `allocate_sync(bytes, alignment)` gives a void*, `deallocate_sync(ptr, bytes, alignment)`
/// never throws, and resources compare with ==.
template <class Resource>
concept synchronous_resource_like = std::equality_comparable<Resource> &&
    requires(Resource& r, void* ptr, std::size_t bytes, std::size_t alignment) {
  { r.allocate_sync(bytes, alignment) } -> std::same_as<void*>;
  r.deallocate_sync(ptr, bytes, alignment);
  requires noexcept(r.deallocate_sync(ptr, bytes, alignment));
};

/// Allocates and frees in stream order as well (CCCL 3.1's cuda::mr::resource):
/// `allocate(stream, bytes, alignment)` gives memory `stream`'s later work may use, and
/// `deallocate(stream, ptr, bytes, alignment)`, which never throws, frees it after the work
/// queued on `stream` before it.
template <class Resource>
concept resource_like = synchronous_resource_like<Resource> &&
    requires(Resource& r, stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment) {
  { r.allocate(stream, bytes, alignment) } -> std::same_as<void*>;
  r.deallocate(stream, ptr, bytes, alignment);
  requires noexcept(r.deallocate(stream, ptr, bytes, alignment));
};

}  // namespace vmm
