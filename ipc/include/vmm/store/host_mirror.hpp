#pragma once
/// @file
/// A host copy of a vmm-store buffer, in memory the GPU copies to and from at full speed.
///
///     vmm::store::buffer weights = store.get("weights");
///     {
///       vmm::store::host_mirror host(weights, stream);   // copied in, in stream order
///       host.synchronize();                              // wait for the copy
///       inspect(static_cast<const float*>(host.data()), host.size() / sizeof(float));
///     }                                                  // read-only: nothing copied back
///
/// The mirror's memory is pinned host memory through the driver (location::pinned_host,
/// page-locked, so copies are DMA at the link's speed, as from cudaMallocHost) for a buffer
/// on a GPU, and OS host memory for a buffer on the OS provider. It is a growable_buffer of
/// the buffer's size, taken from that location's default pool.
///
/// Stream order. Every copy is queued on the stream given (or the mirror's own, set at
/// construction) through the buffer's provider's executor: nothing blocks but
/// synchronize(). The destructor of a mirror of a writable buffer copies the host bytes
/// back on the mirror's stream, and the mirror's memory is retired after that stream
/// (vmm/retirement.hpp), so the copy never reads freed memory. On the OS provider every copy
/// is done before the call returns.
///
/// The mirror covers [0, size()) of the buffer as it was at construction; a buffer that
/// grew since is mirrored again by a new host_mirror.

#include <vmm/growable_buffer.hpp>
#include <vmm/store/client.hpp>
#include <vmm/stream_ref.hpp>

#include <cstddef>

namespace vmm::store {

/// How to make a mirror.
struct mirror_options {
  /// Copy the buffer's bytes in at construction (false: the host bytes start undefined).
  bool copy_in = true;
  /// Copy the host bytes back at destruction when the buffer is writable.
  bool copy_back = true;
};

/// An RAII host copy of a vmm-store buffer. Move-only; see the file comment.
class host_mirror {
 public:
  /// Allocates host memory of `source.size()` bytes and (options.copy_in) queues the copy
  /// in on `stream`. `source` must outlive the mirror.
  /// @throws vmm::invalid_argument `source` is empty.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error allocating or copying failed.
  host_mirror(const buffer& source, stream_ref stream = {}, mirror_options options = {});
  host_mirror(host_mirror&&) noexcept = default;
  host_mirror& operator=(host_mirror&&) = delete;
  host_mirror(const host_mirror&) = delete;
  host_mirror& operator=(const host_mirror&) = delete;
  /// Copies back (writable buffers, options.copy_back) on the mirror's stream, then retires
  /// the host memory after it. Never throws: a failed copy is reported through
  /// vmm::report_cleanup_failure.
  ~host_mirror();

  [[nodiscard]] void* data() const noexcept { return host_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] stream_ref stream() const noexcept { return host_.stream(); }

  /// Queues buffer -> host on `stream`.
  /// @throws vmm::driver_error the copy could not be queued (GPU memory).
  void copy_in(stream_ref stream);
  /// copy_in() on the mirror's stream. @throws as copy_in(stream).
  void copy_in() { copy_in(stream()); }
  /// Queues host -> buffer on `stream`.
  /// @throws vmm::invalid_argument the buffer is mapped read-only here.
  /// @throws vmm::driver_error the copy could not be queued (GPU memory).
  void copy_back(stream_ref stream);
  /// copy_back() on the mirror's stream. @throws as copy_back(stream).
  void copy_back() { copy_back(stream()); }
  /// Waits for the work queued on the mirror's stream.
  /// @throws vmm::driver_error the stream's work failed.
  void synchronize();

 private:
  const buffer* source_;
  growable_buffer host_;
  std::size_t size_;
  mirror_options options_;
};

}  // namespace vmm::store
