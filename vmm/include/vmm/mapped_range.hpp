#pragma once
/// @file
/// An address range with physical chunks mapped in it back to back from its start: what a
/// growable buffer, a chunk view, a striped buffer and an imported buffer are made of.
///
///     auto pool = vmm::default_pool(vmm::location::device(0));
///     vmm::mapped_range run(pool->provider(), 1 << 30);        // 1 GiB of addresses
///     run.push_back(std::make_shared<const vmm::pooled_chunk>(pool->acquire(64 << 20)));
///     run.set_access(0, run.mapped(), vmm::access_mode::read_write);
///     use(run.data());
///     const vmm::stream_use queued{&pool->provider()->executor(), stream};
///     std::move(run).retire_after({&queued, 1});   // unmapped once `stream` has passed
///
/// A chunk's memory may come from any provider that shares the range's address space
/// (several GPUs' memory in one range: see vmm/address_space.hpp). Chunks are
/// shared_chunk: the same memory may be mapped in several ranges, and it goes back to its
/// pool when the last of them lets go.
///
/// Unmapping. unmap_from() and the destructor unmap at once, as cuMemUnmap does: use them
/// only when no queued work uses the memory; retire() hands the range to the process's
/// retirement list instead (vmm/retirement.hpp), which unmaps once the given stream points
/// have passed. A chunk that cannot be unmapped (the driver or the OS refused) stays mapped:
/// unmap_from() keeps it (and everything below it); the destructor and the retirement list
/// keep it, with the range, on the retirement list, which tries again at each collection
/// and gives the chunks back once they are unmapped. Only if the list cannot take them are
/// they given up: they stay mapped, and are marked discarded, so that their pool never lends
/// memory that is still mapped here.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "vmm/address_range.hpp"
#include "vmm/mapping.hpp"
#include "vmm/shared_chunk.hpp"
#include "vmm/stream_executor.hpp"

namespace vmm {

namespace detail {
class retired_range;
}  // namespace detail

/// A stream whose queued work may use memory, with the executor of its device.
struct stream_use {
  stream_executor* executor = nullptr;
  stream_ref stream;
};

/// See the file comment. Move-only.
class mapped_range {
 public:
  /// Nothing allocated.
  mapped_range() noexcept = default;
  /// Allocates `size` bytes of addresses (rounded up to the granularity) through `provider`;
  /// nothing mapped.
  /// @throws vmm::invalid_argument size is 0, the provider is null, or the alignment is bad.
  /// @throws vmm::out_of_memory no address range of that size is left.
  /// @throws vmm::driver_error, vmm::os_error the driver or the OS refused the range for
  ///         another reason.
  mapped_range(std::shared_ptr<memory_provider> provider, std::size_t size, std::size_t alignment = 0);
  mapped_range(mapped_range&& other) noexcept;
  mapped_range& operator=(mapped_range&& other) noexcept;
  mapped_range(const mapped_range&) = delete;
  mapped_range& operator=(const mapped_range&) = delete;
  /// Unmaps every chunk now, then frees the range; what cannot be unmapped or freed goes to
  /// the retirement list (see the file comment).
  ~mapped_range();

  /// The first byte (nullptr when empty).
  [[nodiscard]] void* data() const noexcept { return range_.data(); }
  /// The first address (0 when empty).
  [[nodiscard]] std::uintptr_t address() const noexcept { return range_.address(); }
  /// Bytes of addresses.
  [[nodiscard]] std::size_t size() const noexcept { return range_.size(); }
  /// Bytes mapped, from the start.
  [[nodiscard]] std::size_t mapped() const noexcept { return mapped_; }
  /// The chunks mapped, in address order.
  [[nodiscard]] const std::vector<shared_chunk>& chunks() const noexcept { return chunks_; }
  /// The chunks that back [offset, offset + length) of what is mapped, in address order,
  /// for mapping the same physical memory elsewhere (aliases, re-layout, export).
  /// @throws vmm::invalid_argument zero length, past mapped(), or not on chunk boundaries
  ///         (the message names the nearest boundaries).
  [[nodiscard]] std::vector<shared_chunk> chunks(std::size_t offset, std::size_t length) const;
  /// The provider the range was allocated through (null when empty).
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept {
    return range_.provider();
  }

  /// Maps `chunk` right after what is mapped, with no access yet (set_access() follows, one
  /// call over many chunks).
  /// @throws vmm::invalid_argument the chunk is empty, does not fit in the range, or its
  ///         memory belongs to another address space (the message names both).
  void push_back(shared_chunk chunk);
  /// Sets access over [offset, offset + length) of what is mapped (one call).
  /// @throws vmm::invalid_argument the span is not whole chunks within mapped(), or a grant
  ///         cannot be given.
  /// @throws vmm::driver_error, vmm::os_error the provider refused the access.
  void set_access(std::size_t offset, std::size_t length, std::span<const access_grant> grants);
  /// Grants `mode` to the default accessors of the range's provider.
  /// @throws as set_access() with grants.
  void set_access(std::size_t offset, std::size_t length, access_mode mode);
  /// Maps `chunk` in place of chunk `index`, at the same address, with `grants`, and returns
  /// the chunk it replaced (unmapped here; its memory lives while anything else holds it).
  /// The old chunk is unmapped at once, as unmap_from() does: no queued work may use it.
  /// Strong guarantee: when the unmap or the new mapping fails, chunk `index` is mapped
  /// again with `restore` (the access it had) and the error is thrown. Only when mapping it
  /// back fails as well (reported, not thrown) are those addresses left unmapped.
  /// @throws vmm::invalid_argument no chunk `index`, `chunk` is empty, of another size, or of
  ///         another address space (nothing changed).
  /// @throws vmm::driver_error, vmm::os_error the unmap, the map or the access was refused.
  shared_chunk replace(std::size_t index, shared_chunk chunk, std::span<const access_grant> grants,
                       std::span<const access_grant> restore);
  /// Unmaps chunks [first, chunk count) at once, the last first, and lets go of them.
  /// Returns the chunk count afterwards: `first`, or more when an unmap failed (that chunk
  /// and those below it stay mapped; the failure was reported).
  std::size_t unmap_from(std::size_t first) noexcept;
  /// Hands everything to the retirement list: unmapped and freed once every point in
  /// `passed` is done (at once if they are). The object is left empty. Never throws.
  void retire(std::vector<stream_event> passed) && noexcept;
  /// Retires after the work queued so far on each stream of `uses` (a point recorded on
  /// each; a stream whose point cannot be recorded is synchronized here instead) and after
  /// the points in `also`.
  void retire_after(std::span<const stream_use> uses, std::vector<stream_event> also = {}) && noexcept;

 private:
  friend class detail::retired_range;
  // Unmaps every chunk (the last first), then frees the range. Returns whether all of it was
  // let go; what was not stays here, for a later call.
  bool release_all() noexcept;
  // Throws unless `chunk` is memory this range can map.
  void check_mappable(const shared_chunk& chunk) const;
  // Forgets what release_all() left: the mappings stay mapped and the range allocated for the
  // rest of the process, and their chunks are discarded.
  void abandon() noexcept;

  // Declaration order is destruction order reversed: the mappings go before the range, and
  // the range before the chunks.
  std::vector<shared_chunk> chunks_;
  address_range range_;
  std::vector<mapping> mappings_;
  std::size_t mapped_ = 0;
};

}  // namespace vmm
