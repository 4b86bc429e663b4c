#pragma once
/// @file
/// The tensors of a vmm-store tensor set as values, and the table that describes them on
/// the wire: what a tensor set is, apart from the memory it lives in.
///
///     std::vector<vmm::store::tensor_info> table = {
///         {.name = "embed.weight", .type = vmm::store::dtype::bf16, .shape = {32000, 4096}}};
///     const std::uint64_t extent = vmm::store::lay_out(table);   // offsets, 256-byte aligned
///     std::vector<std::byte> bytes = vmm::store::encode(table);
///     auto back = vmm::store::decode_tensor_table(bytes, extent); // or protocol_error
///
/// A tensor set is one store buffer holding every tensor's bytes, each tensor one
/// contiguous range [offset, offset + bytes) of it, plus this table, which the daemon keeps
/// beside the buffer once it checked it (docs/store.md). The rules a table obeys, checked
/// on both sides of the socket by one function (tensor_table_problem):
///   - 1 to max_tensors tensors, each with a valid store name (valid_name), no two alike;
///   - a dtype of the safetensors format's byte-sized ones, a rank up to max_rank, and
///     bytes = product of the shape x the dtype's element size, without overflow;
///   - offset a multiple of tensor_alignment, the range inside [0, extent), and no two
///     non-empty ranges overlapping.
///
/// Wire format of a table (little-endian, no padding):
///     0  4 count     u32
///     then per tensor: name (u16 length + bytes), dtype u8, rank u8, 6 bytes 0,
///                      offset u64, bytes u64, rank x u64 dimensions
/// Trailing bytes, an unknown dtype, a non-zero reserved byte or a broken rule above are
/// refused.

#include <vmm/ipc/protocol_error.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace vmm::store {

/// Element types: the safetensors format's byte-sized dtypes (its sub-byte ones, F4 and
/// F6, are not kept). The numbering is this library's wire format.
enum class dtype : std::uint8_t {
  boolean = 1,
  u8 = 2,
  i8 = 3,
  f8_e5m2 = 4,
  f8_e4m3 = 5,
  f8_e8m0 = 6,
  i16 = 7,
  u16 = 8,
  f16 = 9,
  bf16 = 10,
  i32 = 11,
  u32 = 12,
  f32 = 13,
  c64 = 14,
  f64 = 15,
  i64 = 16,
  u64 = 17,
};

/// The safetensors name of `type` ("BF16", "F32", ...); "unknown" for no dtype.
[[nodiscard]] const char* to_string(dtype type) noexcept;
/// The dtype of a safetensors name (case-sensitive, as the format writes them); none for
/// another name.
[[nodiscard]] std::optional<dtype> dtype_from_name(std::string_view name) noexcept;
/// The bytes of one element of `type`; 0 for no dtype.
[[nodiscard]] std::size_t element_bytes(dtype type) noexcept;

/// Where every tensor starts in a set: a multiple of this (what cudaMalloc aligns to, and
/// more than any element needs).
inline constexpr std::uint64_t tensor_alignment = 256;
/// The most tensors in one set.
inline constexpr std::size_t max_tensors = std::size_t{1} << 20;
/// The most dimensions of one tensor.
inline constexpr std::size_t max_rank = 8;
/// The largest encoded table.
inline constexpr std::size_t max_table_bytes = std::size_t{64} << 20;

/// One tensor of a set.
struct tensor_info {
  std::string name;
  dtype type = dtype::u8;
  std::vector<std::uint64_t> shape;  ///< empty: a scalar
  std::uint64_t offset = 0;          ///< the first byte in the set's buffer
  std::uint64_t bytes = 0;           ///< product(shape) x element_bytes(type)
  friend bool operator==(const tensor_info&, const tensor_info&) = default;
};

/// product(shape) x element_bytes(type), or none when that overflows 64 bits or `type` is
/// no dtype.
[[nodiscard]] std::optional<std::uint64_t> tensor_bytes(dtype type,
                                                        std::span<const std::uint64_t> shape) noexcept;

/// Why `table` breaks a rule of the file comment for a set of `extent` bytes; none when it
/// keeps them all.
[[nodiscard]] std::optional<std::string> tensor_table_problem(std::span<const tensor_info> table,
                                                              std::uint64_t extent);

/// Sets every tensor's `bytes` from its dtype and shape and its `offset` to the next
/// multiple of tensor_alignment after the one before, in the table's order; returns the
/// bytes the tensors need (the end of the last).
/// @throws vmm::invalid_argument a dtype is unknown, or a size overflows.
std::uint64_t lay_out(std::span<tensor_info> table);

/// Lays `table` out for a set of chunks that end where tensors end (tensor_set_options'
/// set_layout::per_tensor): every tensor of at least `granularity` bytes starts at a
/// multiple of `granularity`, its range rounded up to whole granules and a chunk of its own;
/// consecutive smaller tensors are packed, each at a multiple of tensor_alignment, into
/// chunks of one granule (a tensor that would cross the granule's end starts the next
/// one). Sets every tensor's `bytes` and `offset`; returns the end of every chunk in order,
/// each a multiple of `granularity` (empty when no tensor has a byte). The table goes after
/// the last, in a chunk of its own.
/// @throws vmm::invalid_argument a dtype is unknown, a size overflows, or `granularity` is
///         not a non-zero multiple of tensor_alignment.
std::vector<std::uint64_t> lay_out_per_tensor(std::span<tensor_info> table, std::uint64_t granularity);

/// The wire form of `table` (it is not checked: the daemon encodes only checked tables).
[[nodiscard]] std::vector<std::byte> encode(std::span<const tensor_info> table);
/// Parses a table and checks it against a set of `extent` bytes.
/// @throws vmm::ipc::protocol_error the bytes are no valid table, or the table breaks a
///         rule of the file comment (the message names it).
[[nodiscard]] std::vector<tensor_info> decode_tensor_table(std::span<const std::byte> bytes,
                                                           std::uint64_t extent);

}  // namespace vmm::store
