#pragma once
/// @file
/// One address range whose stripes live on several GPUs.
///
///     vmm::striped_buffer b({0, 1}, 16ull << 30, {.stripe_size = 64 << 20});
///     // each GPU reads its own stripes at local bandwidth, through the one pointer:
///     for (int d : b.devices())
///       sum_own_stripes<<<...>>>(b.data(), b.layout(), b.device_index(d));
///
/// A striped_buffer reserves one range of virtual addresses and maps into it one physical
/// chunk per stripe, each created on the GPU the vmm::stripe_layout assigns that stripe to:
/// round-robin stripes of a settable size, or one contiguous block per GPU. A kernel on any
/// GPU with access addresses every byte through the one pointer data(); a kernel on each
/// GPU that touches only its own stripes (layout().stripes_of / stripe_of) works at local
/// memory bandwidth, so that N GPUs together stream the buffer about N times as fast as one.
///
/// Peer access is the buffer's business, not the caller's. Memory from cuMemCreate is not
/// governed by cuCtxEnablePeerAccess / cudaDeviceEnablePeerAccess: who may touch it is set
/// per mapping with cuMemSetAccess, one access descriptor per device. The buffer sets access
/// once over the whole range, with one grant per accessor device (read-write or read-only),
/// after every chunk is mapped. Before it reserves or maps anything it checks that every
/// accessor can reach every holder's memory (cuDeviceCanAccessPeer); a pair that cannot is
/// a vmm::invalid_argument naming both devices.
///
/// Costs are per handle (docs/GPU-FACTS.md): one chunk per stripe, so a buffer of many small
/// stripes costs one cuMemCreate and cuMemMap per stripe and one cuMemSetAccess handle-step
/// per stripe and accessor. Large stripes (64 MiB) also stream faster than small ones.
///
/// Kernels address the whole range through one pointer; host code that wants to know where
/// a byte lives asks layout() or device_of(). Like every vmm buffer, destruction does not
/// block: the buffer is retired after the streams work on it is queued on (see
/// striped_buffer_options::streams) and unmapped once they have passed
/// (vmm/retirement.hpp): cuMemUnmap does not wait for kernels still running.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "vmm/chunk_pool.hpp"
#include "vmm/location.hpp"
#include "vmm/mapped_range.hpp"
#include "vmm/provider.hpp"
#include "vmm/shared_chunk.hpp"
#include "vmm/stream_ref.hpp"
#include "vmm/stripe_layout.hpp"

namespace vmm {

/// A stream on one GPU that work on a striped_buffer is queued on.
struct device_stream {
  int device = 0;  ///< the ordinal of the device the stream belongs to
  stream_ref stream;
};

/// Settings of a striped_buffer.
struct striped_buffer_options {
  /// round_robin: the bytes of each stripe; contiguous: the unit block boundaries fall on.
  /// A multiple of every device's allocation granularity; 0: the granularity (2 MiB on the
  /// GPUs of docs/GPU-FACTS.md). Large stripes (64 MiB) make faster streaming and fewer
  /// handles; small ones balance small buffers better.
  std::size_t stripe_size = 0;
  stripe_mode mode = stripe_mode::round_robin;
  /// Who gets access, one entry per GPU (accessor::device; GPUs holding no stripe may be
  /// named too). Empty: every device of the list, read-write. A device not named gets no
  /// access, even to its own stripes. access_mode::none entries are allowed and grant
  /// nothing.
  std::vector<access_grant> access;
  /// Pools to take each device's chunks from, parallel to the device list (pools[i] must
  /// hold memory of devices[i]). Empty: default_pool(location::device(d)) for each.
  std::vector<std::shared_ptr<chunk_pool>> pools;
  /// Streams work on the buffer is queued on: destruction is ordered after each of them, and
  /// after the legacy default stream of every device that holds stripes or has access.
  std::vector<device_stream> streams;
};

/// See the file comment. Move-only.
class striped_buffer {
 public:
  /// An empty buffer (holds nothing; data() is nullptr).
  striped_buffer() noexcept = default;
  /// Reserves one range of `size` bytes (rounded up to the granularity), maps one chunk per
  /// stripe on the device options.mode and options.stripe_size assign it to, then grants
  /// options.access over the whole range with one access call.
  ///
  /// Checks come first, in this order, so that nothing is reserved or mapped when one fails:
  /// the arguments themselves (no driver call), then the devices and pools, the stripe size
  /// against each device's granularity, and peer access for every (accessor, holder) pair.
  /// @param devices CUDA device ordinals, in the order the layout deals stripes to them.
  /// @throws vmm::invalid_argument the device list is empty, names a device twice or a
  ///         negative one; size is 0; options.access names a device twice, a negative one,
  ///         or the host;
  ///         options.pools does not match the device list (count, null, or memory of another
  ///         location); the mode is unknown (all before any driver call); a device does not
  ///         exist; a stream names a device that neither holds stripes nor has access; the
  ///         stripe size is not a multiple of a device's granularity (the message names both
  ///         and the device); an accessor cannot access a holder's memory (the message names
  ///         both devices).
  /// @throws vmm::driver_unavailable there is no usable driver or GPU (and the arguments
  ///         were otherwise fine).
  /// @throws vmm::out_of_memory no address range of that size is left, or a device or pool
  ///         has no memory for a stripe (the message names the stripe and the device);
  ///         whatever was mapped is unmapped and given back.
  /// @throws vmm::driver_error mapping or setting access failed; nothing is left behind.
  striped_buffer(std::vector<int> devices, std::size_t size, striped_buffer_options options = {});
  striped_buffer(striped_buffer&& other) noexcept;
  striped_buffer& operator=(striped_buffer&& other) noexcept;
  striped_buffer(const striped_buffer&) = delete;
  striped_buffer& operator=(const striped_buffer&) = delete;
  /// Retires the buffer after its streams (see striped_buffer_options::streams): never
  /// blocks; the stripes are unmapped and go back to their pools once the streams pass.
  ~striped_buffer();

  /// The first byte: every stripe, on every device, through this one pointer.
  [[nodiscard]] void* data() const noexcept { return run_.data(); }
  /// The first byte as an address.
  [[nodiscard]] std::uintptr_t address() const noexcept { return run_.address(); }
  /// Bytes mapped: the size asked for, rounded up to the granularity.
  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(layout_.size); }
  /// Where every byte lives: pass it to kernels by value, with device_index() of the GPU
  /// the kernel runs on.
  [[nodiscard]] const stripe_layout& layout() const noexcept { return layout_; }
  /// The device ordinals, in layout order: layout device index i is devices()[i].
  [[nodiscard]] const std::vector<int>& devices() const noexcept { return devices_; }
  /// The access granted, one entry per device named (the defaults filled in).
  [[nodiscard]] const std::vector<access_grant>& access() const noexcept { return access_; }
  /// The pools the chunks came from, parallel to devices().
  [[nodiscard]] const std::vector<std::shared_ptr<chunk_pool>>& pools() const noexcept { return pools_; }
  /// The physical chunks, one per stripe, in address order; chunk i's provider says which
  /// device it was created on. Map them elsewhere (vmm::chunk_view) for a second view,
  /// e.g. one device's stripes back to back.
  [[nodiscard]] const std::vector<shared_chunk>& chunks() const noexcept { return run_.chunks(); }

  /// The ordinal of the device that holds byte `offset`.
  /// @throws vmm::invalid_argument offset >= size().
  [[nodiscard]] int device_of(std::size_t offset) const;
  /// The layout's index of device `ordinal` (what a kernel on it passes to stripes_of()).
  /// @throws vmm::invalid_argument the device is not in devices().
  [[nodiscard]] std::uint32_t device_index(int ordinal) const;
  /// Orders destruction after `stream` (a stream of device `ordinal`) as well.
  /// @throws vmm::invalid_argument the device neither holds stripes nor has access.
  void add_stream(int ordinal, stream_ref stream);

 private:
  // A device that holds stripes or has access: destruction is ordered after its streams.
  struct device_user {
    int device;
    stream_executor* executor;        // records the points in the device's context
    std::vector<stream_ref> streams;  // always holds the legacy default stream
  };

  std::vector<int> devices_;
  std::vector<access_grant> access_;
  std::vector<std::shared_ptr<chunk_pool>> pools_;
  std::vector<device_user> users_;
  stripe_layout layout_;
  mapped_range run_;
};

}  // namespace vmm
