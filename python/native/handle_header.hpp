#pragma once
/// @file
/// The header of a vmm.share() handle on the wire (vmm.SharedHandle.send / receive): a JSON
/// object that says how many manifest bytes and descriptors follow and how the receiver
/// lays the memory out. It arrives from another process, so every field is checked here
/// before anything is mapped or any array is made.
///
///     {"manifest": 64, "fds": 2, "dtype": "|u1", "length": 4096, "read_only": false,
///      "offset": 0, "lease": true, "tensor": null}
///
/// Fields, all required, no others: `manifest` (0 to 1 MiB) and `fds` (0 to 65536) counts;
/// `dtype`, a numpy type string ([<>|=] then b, i, u, f or c, then the item size in bytes);
/// `length`, elements or null (all the shared bytes); `read_only`; `offset` (bytes into the
/// mapping); `lease` (the last descriptor is the sender's lease; then `fds` is at least 1);
/// `tensor`, null or a layout, which must fit the `length` bytes (as uint8) after `offset`:
///   {"kind": "torch", "dtype": "float32", "shape": [...], "stride": [...], "storage_offset": N}
///   {"kind": "cupy", "dtype": "<f4", "shape": [...], "strides": [...], "offset": N}
/// (torch's strides and offset count elements, CuPy's bytes; at most 32 dimensions).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vmm_python {

/// An array layout of a handle (the `tensor` field).
struct array_layout {
  enum class library { torch, cupy };
  library kind = library::torch;
  std::string dtype;  ///< torch's dtype name, or CuPy's numpy type string
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  ///< elements (torch) or bytes (CuPy)
  std::int64_t offset = 0;            ///< storage_offset in elements (torch), bytes (CuPy)
  friend bool operator==(const array_layout&, const array_layout&) = default;
};

/// A checked handle header.
struct handle_header {
  std::uint64_t manifest_bytes = 0;
  std::uint64_t fds = 0;
  std::string dtype = "|u1";
  std::optional<std::uint64_t> length;
  bool read_only = false;
  std::uint64_t offset = 0;
  bool lease = false;
  std::optional<array_layout> tensor;
  friend bool operator==(const handle_header&, const handle_header&) = default;
};

/// The most bytes a header may have on the wire.
inline constexpr std::size_t max_handle_header_bytes = std::size_t{1} << 20;

/// Parses and checks a header's JSON text.
/// @throws vmm::invalid_argument not JSON, not an object of exactly the fields of the file
///         comment, a field of the wrong type or out of range, or a layout that does not fit
///         the bytes; the message names the field.
[[nodiscard]] handle_header parse_handle_header(std::string_view text);

/// The JSON text of a header (parse_handle_header reads it back equal).
/// @throws vmm::invalid_argument the header breaks a rule of the file comment.
[[nodiscard]] std::string serialize(const handle_header& header);

}  // namespace vmm_python
