#pragma once
/// @file
/// The same physical memory at another address ("virtual aliasing"): views, re-layout.
///
///     vmm::growable_buffer buffer(vmm::location::device(0), {.policy = vmm::chunk_policy::fixed(64 << 20)});
///     buffer.resize(256 << 20);
///     vmm::chunk_view reader = vmm::alias(buffer, 0, 128 << 20, vmm::access_mode::read_only);
///     std::size_t order[] = {3, 2, 1, 0};
///     vmm::chunk_view reversed = vmm::permute(buffer, order);   // no byte copied
///
/// A chunk_view reserves an address range of its own and maps a list of physical chunks
/// into it back to back, in the order given. The chunks are the ones a growable_buffer (or
/// another view) already maps: nothing is copied and no physical memory is created. One
/// mechanism covers three uses:
///  - an alias: some whole chunks of a buffer at a second address, with access rights of
///    its own per accessor (a read-write producer view and a read-only consumer view; the
///    hardware enforces read-only: PROT_READ on the host, CU_MEM_ACCESS_FLAGS_PROT_READ on
///    the GPU);
///  - re-layout: a view whose chunks come from several buffers, or from one buffer in
///    another order (concatenate, permute, splice), sharing their physical memory;
///  - the double mapping under vmm::ring_buffer: a list may name a chunk more than once, and
///    each occurrence is mapped at its own place.
///
/// Lifetime. A view holds a shared_chunk for each chunk it maps, so physical memory lives
/// while any buffer or view maps it, whatever order they are destroyed in; it goes back to
/// its pool when the last of them lets go. Destroying a view does not block: work queued on
/// the view's stream may still read through it, so the view is retired in stream order
/// (vmm/retirement.hpp) and unmapped once the stream has passed its destruction.
///
/// Costs are per handle (docs/GPU-FACTS.md): a view maps each chunk once and sets access once
/// over its whole range, so it costs about one cuMemMap and one cuMemSetAccess handle-step
/// per chunk, whatever the chunks' sizes. Views of buffers made of large chunks are cheap.
///
/// Coherency rule (read this before writing through one alias and reading through another):
///  - On the GPU, accesses through two aliases of the same physical memory are NOT coherent
///    within one grid, nor between grids running at the same time: a thread that writes
///    through one address and another thread (or the same one) that reads through the
///    other may see stale data, fences notwithstanding.
///  - They ARE coherent in stream order across kernel launches (and copies): once a kernel
///    that wrote through one view has finished, a kernel launched after it in stream order
///    (or after an event or a synchronize) sees the writes through every view.
///  - On the host (OS memory, and pinned host memory read by the CPU) aliases are coherent:
///    the CPU's caches are physically tagged.
/// Write through one view and read through another only across a kernel boundary.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "vmm/growable_buffer.hpp"
#include "vmm/mapped_range.hpp"
#include "vmm/provider.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm {

/// Physical chunks mapped back to back at a new address range, with access of their own.
/// See the file comment (including the coherency rule). Move-only.
class chunk_view {
 public:
  /// An empty view (maps nothing).
  chunk_view() noexcept = default;
  /// Maps `chunks`, in order (a chunk may appear more than once), at a new address range
  /// and grants `mode` to the provider's default accessors with one access call over the
  /// whole range. `stream` is where work using the view is queued: destruction is ordered
  /// after it (the legacy default stream when not given).
  /// @throws vmm::invalid_argument the list is empty, holds a null or empty chunk, or its
  ///         chunks come from different providers (the message names both locations).
  /// @throws vmm::out_of_memory no address range of that size is left.
  /// @throws vmm::driver_error, vmm::os_error mapping or setting access failed; whatever was
  ///         mapped is unmapped again.
  explicit chunk_view(std::vector<shared_chunk> chunks, access_mode mode = access_mode::read_write,
                      stream_ref stream = {});
  /// As above, with explicit grants: one per accessor (GPUs, the host), e.g. read-only for a
  /// consumer GPU and read-write for the host.
  /// @throws vmm::invalid_argument as above, or `grants` is empty or names an accessor the
  ///         provider cannot grant.
  chunk_view(std::vector<shared_chunk> chunks, std::span<const access_grant> grants, stream_ref stream = {});
  chunk_view(chunk_view&& other) noexcept = default;
  chunk_view& operator=(chunk_view&& other) noexcept;
  chunk_view(const chunk_view&) = delete;
  chunk_view& operator=(const chunk_view&) = delete;
  /// Retires the view after its stream (see the file comment); never blocks.
  ~chunk_view();

  /// The first byte (nullptr when empty).
  [[nodiscard]] void* data() const noexcept { return run_.data(); }
  /// The first byte as an address (0 when empty).
  [[nodiscard]] std::uintptr_t address() const noexcept { return run_.address(); }
  /// Bytes mapped: the sum of the chunks' sizes.
  [[nodiscard]] std::size_t size() const noexcept { return run_.mapped(); }
  /// The number of chunks mapped (repeats counted).
  [[nodiscard]] std::size_t chunk_count() const noexcept { return run_.chunks().size(); }
  /// The chunks mapped, in address order.
  [[nodiscard]] const std::vector<shared_chunk>& chunks() const noexcept { return run_.chunks(); }
  /// The chunks that back [offset, offset + length), in address order, to map elsewhere in
  /// turn (a view of a view). Same contract as growable_buffer::chunks().
  /// @throws vmm::invalid_argument zero length, past size(), or not on chunk boundaries.
  [[nodiscard]] std::vector<shared_chunk> chunks(std::size_t offset, std::size_t length) const {
    return run_.chunks(offset, length);
  }
  /// The provider of the chunks (null when empty).
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept { return run_.provider(); }
  /// The stream destruction is ordered after.
  [[nodiscard]] stream_ref stream() const noexcept { return stream_; }
  /// Orders destruction after work on `stream` instead.
  void set_stream(stream_ref stream) noexcept { stream_ = stream; }

  /// Grants `mode` to the provider's default accessors over the whole view (one call).
  /// Other views of the same memory keep their own access.
  /// @throws vmm::invalid_argument the view is empty.
  void set_access(access_mode mode);
  /// Applies `grants` over the whole view (one call).
  /// @throws vmm::invalid_argument the view is empty, `grants` is empty or names an
  ///         accessor the provider cannot grant.
  void set_access(std::span<const access_grant> grants);

 private:
  struct without_access {};
  // Validates the list and maps it with no access yet; the constructors then set access.
  chunk_view(without_access, std::vector<shared_chunk> chunks, stream_ref stream);

  mapped_range run_;
  stream_ref stream_;
};

/// An alias of [offset, offset + length) of `buffer`: the same physical chunks at a new
/// address, granting `mode` to the default accessors. The range must lie on chunk
/// boundaries within buffer.capacity(). The alias does not follow later growth or shrinking
/// of the buffer: it keeps the chunks it was made with.
/// @throws vmm::invalid_argument zero length, past the capacity, or not on chunk boundaries
///         (the message names the nearest boundaries).
[[nodiscard]] chunk_view alias(const growable_buffer& buffer, std::size_t offset, std::size_t length,
                               access_mode mode = access_mode::read_write, stream_ref stream = {});
/// As above, with explicit grants per accessor.
/// @throws vmm::invalid_argument as above, or `grants` is empty or not grantable.
[[nodiscard]] chunk_view alias(const growable_buffer& buffer, std::size_t offset, std::size_t length,
                               std::span<const access_grant> grants, stream_ref stream = {});

/// A whole-chunk piece of a buffer: [offset, offset + length) of *buffer.
struct buffer_slice {
  const growable_buffer* buffer = nullptr;
  std::size_t offset = 0;
  std::size_t length = 0;
};

/// Splicing: one view of `slices` back to back, in order. Slices may come from several
/// buffers (of one provider), overlap, or repeat. Each must lie on chunk boundaries
/// within its buffer's capacity.
/// @throws vmm::invalid_argument no slices, a null buffer, a slice of zero length, past
///         the capacity or not on chunk boundaries (the message names the slice), or
///         buffers of different providers.
[[nodiscard]] chunk_view splice(std::span<const buffer_slice> slices,
                                access_mode mode = access_mode::read_write, stream_ref stream = {});

/// Concatenation: the first size() bytes of each buffer back to back, in order, without
/// copying. Each buffer's size() must end on a chunk boundary (a buffer grown with
/// chunk_policy::fixed(n) to a multiple of n, say); empty buffers contribute nothing.
/// @throws vmm::invalid_argument no bytes at all, a null buffer, a size not on a chunk
///         boundary (the message names the buffer), or buffers of different providers.
[[nodiscard]] chunk_view concatenate(std::span<const growable_buffer* const> buffers,
                                     access_mode mode = access_mode::read_write, stream_ref stream = {});

/// Permutation: a view whose i-th chunk is chunk order[i] of `buffer`, counting the chunks
/// that back [0, buffer.capacity()) from 0 in address order. `order` may also repeat or
/// leave out indices (a gather of chunks).
/// @throws vmm::invalid_argument `order` is empty or names a chunk index past the last.
[[nodiscard]] chunk_view permute(const growable_buffer& buffer, std::span<const std::size_t> order,
                                 access_mode mode = access_mode::read_write, stream_ref stream = {});

}  // namespace vmm
