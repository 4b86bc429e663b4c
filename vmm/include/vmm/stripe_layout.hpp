#pragma once
/// @file
/// Where each byte of a range striped over several devices lives: a trivially copyable
/// description, passed to kernels by value, with the placement arithmetic as inline
/// functions that compile for the host and, under nvcc, for the device.
///
///     vmm::stripe_layout layout =
///         vmm::make_stripe_layout(size, 64 << 20, 2, vmm::stripe_mode::round_robin);
///     std::uint32_t holder = layout.device_of(offset);   // index into the device list
///     vmm::stripe_extent first = layout.stripe_of(1, 0);  // device 1's first stripe
///     std::uint64_t bytes = layout.bytes_on(1);            // all that device 1 holds
///
/// The range of `size` bytes is cut into units of `stripe_size` bytes (the last one may be
/// shorter) and the units are dealt to `device_count` devices, numbered 0..device_count-1
/// (indices into the buffer's device list, not CUDA ordinals):
///  - stripe_mode::round_robin: unit u goes to device u % device_count. Each unit is one
///    stripe; device d holds the stripes at offsets (k * device_count + d) * stripe_size.
///  - stripe_mode::contiguous: the units are split into device_count blocks of consecutive
///    units, as even as whole units allow (the first size_in_units % device_count devices
///    get one unit more); device d holds one stripe, its block. A device gets no stripe
///    when there are fewer units than devices.
/// A stripe is thus a maximal run of bytes one device holds that the layout hands out as
/// one piece: vmm::striped_buffer maps one physical chunk per stripe.
///
/// A kernel on device d walks its own bytes with stripes_of(d) and stripe_of(d, k) (one
/// division per stripe, none per byte), or maps a position in its own bytes to the range
/// with local_to_offset(d, j):
///
///   for (std::uint64_t k = 0; k < layout.stripes_of(d); ++k) {
///     const vmm::stripe_extent s = layout.stripe_of(d, k);
///     for (std::uint64_t i = first_thread; i < s.length / sizeof(T); i += all_threads)
///       process(reinterpret_cast<T*>(base + s.offset)[i]);
///   }
///
/// The functions taking a device, a stripe index or an offset require it in range (device <
/// device_count, k < stripes_of(device), offset < size); they do not check (kernels cannot
/// throw). Build layouts with make_stripe_layout(), which checks the fields.

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "vmm/error.hpp"

#include "vmm/host_device.hpp"

namespace vmm {

/// How stripe_layout deals a range's units to devices (see the file comment).
enum class stripe_mode : std::uint8_t {
  round_robin,  ///< unit u on device u % device_count: every device gets a share of every region.
  contiguous,   ///< one block of consecutive units per device, in device order.
};

/// A stripe: `length` bytes from `offset` in the range, held by one device.
struct stripe_extent {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

/// The stripe that holds a byte: its device, its index among that device's stripes, and
/// its extent.
struct stripe_position {
  std::uint32_t device = 0;  ///< index into the device list
  std::uint64_t index = 0;   ///< k such that stripe_of(device, k) is this stripe
  stripe_extent extent;
};

/// See the file comment. Trivially copyable: pass it to kernels by value.
struct stripe_layout {
  /// Bytes laid out.
  std::uint64_t size = 0;
  /// round_robin: the bytes of each stripe (the last one may be shorter). contiguous: the
  /// unit blocks are made of; block boundaries are multiples of it.
  std::uint64_t stripe_size = 0;
  /// Devices the units are dealt to.
  std::uint32_t device_count = 0;
  stripe_mode mode = stripe_mode::round_robin;

  /// Units of stripe_size bytes in the range (the last may be shorter).
  [[nodiscard]] VMM_HOST_DEVICE constexpr std::uint64_t unit_count() const {
    return size / stripe_size + (size % stripe_size != 0 ? 1 : 0);
  }

  /// Stripes in the whole range: unit_count() in round_robin mode; the devices with a
  /// non-empty block in contiguous mode.
  [[nodiscard]] VMM_HOST_DEVICE constexpr std::uint64_t stripe_count() const {
    const std::uint64_t units = unit_count();
    if (mode == stripe_mode::round_robin) return units;
    return units < device_count ? units : device_count;
  }

  /// The device (index into the device list) that holds byte `offset`.
  [[nodiscard]] VMM_HOST_DEVICE constexpr std::uint32_t device_of(std::uint64_t offset) const {
    const std::uint64_t unit = offset / stripe_size;
    if (mode == stripe_mode::round_robin) return static_cast<std::uint32_t>(unit % device_count);
    const std::uint64_t base = unit_count() / device_count;    // units of the smaller blocks
    const std::uint64_t larger = unit_count() % device_count;  // devices with base + 1 units
    const std::uint64_t in_larger = larger * (base + 1);       // units in those blocks
    if (unit < in_larger) return static_cast<std::uint32_t>(unit / (base + 1));
    return static_cast<std::uint32_t>(larger + (unit - in_larger) / base);
  }

  /// How many stripes device `device` holds (contiguous mode: 1, or 0 for an empty block).
  [[nodiscard]] VMM_HOST_DEVICE constexpr std::uint64_t stripes_of(std::uint32_t device) const {
    const std::uint64_t units = unit_count();
    if (mode == stripe_mode::round_robin)
      return units / device_count + (device < units % device_count ? 1 : 0);
    return first_unit(device + 1) > first_unit(device) ? 1 : 0;
  }

  /// Where stripe k of device `device` starts in the range.
  [[nodiscard]] VMM_HOST_DEVICE constexpr std::uint64_t stripe_offset(std::uint32_t device,
                                                                      std::uint64_t k) const {
    if (mode == stripe_mode::round_robin) return (k * device_count + device) * stripe_size;
    return first_unit(device) * stripe_size;
  }

  /// The bytes of stripe k of device `device`.
  [[nodiscard]] VMM_HOST_DEVICE constexpr std::uint64_t stripe_length(std::uint32_t device,
                                                                      std::uint64_t k) const {
    const std::uint64_t begin = stripe_offset(device, k);
    const std::uint64_t units =
        mode == stripe_mode::round_robin ? 1 : first_unit(device + 1) - first_unit(device);
    const std::uint64_t whole = units * stripe_size;
    return size - begin < whole ? size - begin : whole;
  }

  /// Stripe k of device `device`: its offset and length.
  [[nodiscard]] VMM_HOST_DEVICE constexpr stripe_extent stripe_of(std::uint32_t device,
                                                                  std::uint64_t k) const {
    return {stripe_offset(device, k), stripe_length(device, k)};
  }

  /// The bytes device `device` holds: the sum of its stripes' lengths.
  [[nodiscard]] VMM_HOST_DEVICE constexpr std::uint64_t bytes_on(std::uint32_t device) const {
    const std::uint64_t stripes = stripes_of(device);
    if (stripes == 0) return 0;
    if (mode == stripe_mode::contiguous) return stripe_length(device, 0);
    // Every stripe is whole but perhaps the last of the range.
    return (stripes - 1) * stripe_size + stripe_length(device, stripes - 1);
  }

  /// The stripe that holds byte `offset`.
  [[nodiscard]] VMM_HOST_DEVICE constexpr stripe_position locate(std::uint64_t offset) const {
    const std::uint32_t device = device_of(offset);
    const std::uint64_t index = mode == stripe_mode::round_robin ? offset / stripe_size / device_count : 0;
    return {device, index, stripe_of(device, index)};
  }

  /// Where byte `local` of device `device`'s bytes (its stripes back to back, in address
  /// order; local < bytes_on(device)) is in the range.
  [[nodiscard]] VMM_HOST_DEVICE constexpr std::uint64_t local_to_offset(std::uint32_t device,
                                                                        std::uint64_t local) const {
    if (mode == stripe_mode::contiguous) return first_unit(device) * stripe_size + local;
    return (local / stripe_size * device_count + device) * stripe_size + local % stripe_size;
  }

  /// The inverse of local_to_offset: where byte `offset` is among its device's bytes.
  [[nodiscard]] VMM_HOST_DEVICE constexpr std::uint64_t offset_to_local(std::uint64_t offset) const {
    if (mode == stripe_mode::contiguous) return offset - first_unit(device_of(offset)) * stripe_size;
    return offset / stripe_size / device_count * stripe_size + offset % stripe_size;
  }

  /// contiguous mode: the first unit of device `device`'s block (device may be
  /// device_count: the end of the last block). Blocks are as even as whole units allow.
  [[nodiscard]] VMM_HOST_DEVICE constexpr std::uint64_t first_unit(std::uint32_t device) const {
    const std::uint64_t base = unit_count() / device_count;
    const std::uint64_t larger = unit_count() % device_count;
    return device * base + (device < larger ? device : larger);
  }
};

static_assert(std::is_trivially_copyable_v<stripe_layout>);
static_assert(std::is_standard_layout_v<stripe_layout>);

/// A checked stripe_layout.
/// @throws vmm::invalid_argument size, stripe_size or device_count is 0, the mode is not a
///         stripe_mode, or size is so close to 2^64 that offsets past it would overflow.
[[nodiscard]] inline stripe_layout make_stripe_layout(std::uint64_t size, std::uint64_t stripe_size,
                                                      std::uint32_t device_count, stripe_mode mode) {
  if (size == 0) throw invalid_argument("stripe_layout: size 0");
  if (stripe_size == 0) throw invalid_argument("stripe_layout: stripe size 0");
  if (device_count == 0) throw invalid_argument("stripe_layout: no devices");
  if (mode != stripe_mode::round_robin && mode != stripe_mode::contiguous)
    throw invalid_argument("stripe_layout: unknown stripe mode " + std::to_string(static_cast<int>(mode)));
  if (size > std::numeric_limits<std::uint64_t>::max() - stripe_size)
    throw invalid_argument("stripe_layout: size " + std::to_string(size) + " with stripes of " +
                           std::to_string(stripe_size) + " bytes overflows 64-bit offsets");
  return {size, stripe_size, device_count, mode};
}

}  // namespace vmm
