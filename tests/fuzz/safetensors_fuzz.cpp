/// @file
/// Fuzz target: vmm::store::parse_safetensors_header (vmm/store/safetensors.hpp) on raw
/// bytes.
///
/// The input is a u32 (little-endian): the bytes of data the file holds after its header,
/// then the header's JSON. Whatever the bytes, the parser either throws
/// vmm::invalid_argument, whose message starts "safetensors header: ", or returns a header
/// whose tensors are in data order, each with a valid name, a known dtype, bytes equal to its
/// shape's, inside the data and overlapping no other; names unique; and laid out as a store
/// set (lay_out) they keep every rule of a tensor table (tensor_table_problem).

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "vmm/error.hpp"
#include "vmm/store/protocol.hpp"
#include "vmm/store/safetensors.hpp"
#include "vmm/store/tensors.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace store = vmm::store;
  using vmm::fuzz::finding;
  vmm::fuzz::byte_reader input(data, size);
  const std::uint64_t data_bytes = std::uint64_t{input.u16()} | std::uint64_t{input.u16()} << 16;
  const std::span<const std::byte> json = input.take(input.remaining());
  store::safetensors_header header;
  try {
    header = store::parse_safetensors_header(json, data_bytes);
  } catch (const vmm::invalid_argument& error) {
    if (!std::string_view(error.what()).starts_with("safetensors header: "))
      finding(fmt::format("a refusal without its prefix: {}", error.what()));
    return 0;
  } catch (const std::exception& error) {
    finding(fmt::format("the parser threw something other than invalid_argument: {}", error.what()));
  }
  if (header.data_start != 8 + json.size()) finding("data_start is not 8 + the header's length");
  std::uint64_t last_end = 0;
  for (const store::tensor_info& t : header.tensors) {
    if (!store::valid_name(t.name))
      finding(fmt::format("accepted an invalid name of {} bytes", t.name.size()));
    const auto bytes = store::tensor_bytes(t.type, t.shape);
    if (!bytes || *bytes != t.bytes) finding(fmt::format("tensor {}: bytes differ from its shape's", t.name));
    if (t.offset > data_bytes || t.bytes > data_bytes - t.offset)
      finding(fmt::format("tensor {} ends past the data", t.name));
    if (t.bytes != 0) {
      if (t.offset < last_end) finding(fmt::format("tensor {} overlaps or is out of order", t.name));
      last_end = t.offset + t.bytes;
    }
  }
  std::vector<store::tensor_info> laid = header.tensors;
  if (!laid.empty()) {
    const std::uint64_t extent = store::lay_out(laid);
    if (const auto problem = store::tensor_table_problem(laid, extent))
      finding(fmt::format("an accepted header makes no valid set: {}", *problem));
  }
  return 0;
}
