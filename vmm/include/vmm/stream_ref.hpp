#pragma once
/// @file
/// A CUDA stream, passed by value to every call that queues work.
///
///     vmm::device_vector<float> v(vmm::location::device(0));
///     v.resize(n, vmm::element_init::zeroed, stream);   // queued on `stream`
///     v.append(batch);                                  // on the vector's default stream
///     my_kernel<<<grid, block, 0, stream.get()>>>(v.data());
///
/// Like cuda::stream_ref (CCCL), a stream_ref does not own the stream: it is a pointer-sized
/// value, convertible from CUstream and cudaStream_t (both are CUstream_st*) and from
/// nullptr. An object may keep a default stream for calls that name none, but never the
/// only one: every operation that queues work takes a stream_ref.
///
/// Host memory (the OS provider) does its work synchronously; for it every stream is the
/// same, and a stream_ref is accepted and ignored.

#include <cstdint>

struct CUstream_st;  // CUstream and cudaStream_t are both pointers to this.

namespace vmm {

/// A non-owning reference to a CUDA stream. Trivially copyable; usable in .cu files.
class stream_ref {
 public:
  /// The legacy default stream (nullptr, as CUDA spells it).
  constexpr stream_ref() noexcept = default;
  /// `stream`, a CUstream or cudaStream_t; nullptr is the legacy default stream.
  constexpr stream_ref(CUstream_st* stream) noexcept
      : stream_(stream) {}  // NOLINT(google-explicit-constructor): implicit like cuda::stream_ref

  /// The per-thread default stream (CU_STREAM_PER_THREAD).
  static stream_ref per_thread() noexcept {
    return stream_ref(reinterpret_cast<CUstream_st*>(std::uintptr_t{0x2}));
  }

  /// The stream as CUstream / cudaStream_t.
  [[nodiscard]] constexpr CUstream_st* get() const noexcept { return stream_; }

  friend constexpr bool operator==(stream_ref, stream_ref) noexcept = default;

 private:
  CUstream_st* stream_ = nullptr;
};

}  // namespace vmm
