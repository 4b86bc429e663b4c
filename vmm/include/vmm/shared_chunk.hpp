#pragma once
/// @file
/// A physical chunk shared by everything that maps it.
///
///     vmm::growable_buffer buffer(vmm::location::device(0));
///     buffer.resize(64 << 20);
///     std::vector<vmm::shared_chunk> chunks = buffer.chunks(0, buffer.capacity());
///     vmm::chunk_view alias(chunks, vmm::access_mode::read_only);   // same memory
///
/// A growable buffer's chunks, a view's, a striped buffer's: each holds its chunks as
/// shared_chunk, so physical memory lives while any of them maps it, whatever order they
/// are destroyed in, and goes back to its pool when the last of them lets go.

#include <memory>

#include "vmm/chunk_pool.hpp"

namespace vmm {

/// See the file comment.
using shared_chunk = std::shared_ptr<const pooled_chunk>;

}  // namespace vmm
