#pragma once
/// @file
/// safetensors files into vmm-store tensor sets: the header parsed strictly, the data
/// streamed through bounded host memory into the set's memory.
///
///     vmm::store::client store;
///     vmm::store::tensor_set set = vmm::store::load_safetensors(
///         store, "model.safetensors", "llama-7b", {.where = vmm::location::device(0)});
///
/// The format: an 8-byte little-endian length N, N bytes of a JSON object (UTF-8), then the
/// data. Each key of the object but "__metadata__" names a tensor: {"dtype": "BF16",
/// "shape": [4096, 4096], "data_offsets": [begin, end]}, offsets relative to the data's start.
/// What parse_safetensors_header refuses, each with a message naming the problem: a length
/// past max_safetensors_header_bytes or past the file's end; bytes that are not JSON (invalid
/// UTF-8 included); JSON that is not an object; a duplicate key; "__metadata__" that is not
/// an object of strings; a tensor entry that is not an object of exactly those three keys; an
/// unknown dtype (dtype_from_name); a shape that is not an array of at most max_rank
/// non-negative integers; data_offsets that are not two non-negative integers, begin > end,
/// an end past the data, a range whose length is not the shape's bytes, two ranges that
/// overlap; a tensor name that is no valid store name (valid_name: UTF-8, no control
/// character, at most max_name_bytes).
///
/// Loading. The tensors are laid out in the set as tensor_set_builder does (in the file's
/// data order, aligned) and copied from the file in chunks of at most chunk_bytes through
/// two staging buffers: pinned host memory for a set on a GPU (the read of one chunk
/// overlaps the host-to-device copy of the other), OS host memory on the OS provider. A
/// load that fails at any point (a refused header, a short read, a refusal of the daemon)
/// leaves nothing in the store.

#include <vmm/location.hpp>
#include <vmm/store/client.hpp>
#include <vmm/store/tensor_set.hpp>
#include <vmm/store/tensors.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vmm::store {

/// The longest header read (the limit of the safetensors reference reader).
inline constexpr std::uint64_t max_safetensors_header_bytes = std::uint64_t{100} << 20;
/// The most threads one load reads with (load_options::readers).
inline constexpr std::size_t max_safetensors_readers = 64;

/// A parsed safetensors header.
struct safetensors_header {
  /// Where the data start in the file: 8 + the header's length.
  std::uint64_t data_start = 0;
  /// The tensors in the order of their data; `offset` is relative to data_start.
  std::vector<tensor_info> tensors;
  /// "__metadata__", in the file's order.
  std::vector<std::pair<std::string, std::string>> metadata;
};

/// Parses the JSON of a header (the N bytes after the length) for a file whose data are
/// `data_bytes` long.
/// @throws vmm::invalid_argument the header breaks a rule of the file comment (the message
///         names it).
[[nodiscard]] safetensors_header parse_safetensors_header(std::span<const std::byte> json,
                                                          std::uint64_t data_bytes);

/// Reads and parses the header of the file at `path`.
/// @throws vmm::invalid_argument the file is too short or its header is refused (the
///         message names the file and the problem).
/// @throws vmm::os_error the file cannot be opened or read.
[[nodiscard]] safetensors_header read_safetensors_header(const std::string& path);

/// How to load.
struct load_options {
  /// Where the set lives.
  location where = location::os_host();
  /// The most bytes one read moves (and, for a set off the host, of one staging buffer: two
  /// per reader, in pinned host memory).
  std::size_t chunk_bytes = std::size_t{16} << 20;
  /// Threads that read the file at once, each its own pieces of chunk_bytes (0: half the
  /// cores, from 1 to 8; at most max_safetensors_readers).
  std::size_t readers = 0;
  /// Called after each chunk with the bytes read and the bytes to read (may be empty), from
  /// the reading threads, one call at a time.
  std::function<void(std::uint64_t done, std::uint64_t total)> progress;
  /// The set's layout and seal (tensor_set_options): per_tensor with deduplicate shares the
  /// tensors whose bytes another de-duplicated set holds (vmm-store load --dedup).
  tensor_set_options set;
};

/// The readers of a load whose load_options::readers is 0: half the cores, from 1 to 8.
[[nodiscard]] std::size_t default_safetensors_readers() noexcept;

/// Loads the safetensors file at `path` as the tensor set `name`; returns it read-only.
/// @throws vmm::invalid_argument as read_safetensors_header, a file without tensors,
///         chunk_bytes 0 or readers past max_safetensors_readers; nothing was created.
/// @throws vmm::os_error reading failed, or the file is shorter than its header says.
/// @throws store_error, vmm::ipc::protocol_error, vmm::out_of_memory, vmm::driver_error as
///         tensor_set_builder and its commit(). Nothing is left in the store after any.
tensor_set load_safetensors(client& store, const std::string& path, std::string_view name,
                            const load_options& options = {});

}  // namespace vmm::store
