/// @file
/// Fuzz target: the tensor table of a vmm-store tensor set (vmm/store/tensors.hpp), as the
/// daemon decodes it at seal_set and the client at every get.
///
/// The input is a u32 (little-endian): the set's extent in bytes, then the table's bytes.
/// Whatever they are, decode_tensor_table either throws vmm::ipc::protocol_error or returns
/// a table that keeps every rule (tensor_table_problem finds none) and encodes back to
/// exactly the input's bytes.

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>

#include "fuzz_support.hpp"
#include "vmm/ipc/protocol_error.hpp"
#include "vmm/store/tensors.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace store = vmm::store;
  using vmm::fuzz::finding;
  vmm::fuzz::byte_reader input(data, size);
  const std::uint64_t extent = std::uint64_t{input.u16()} | std::uint64_t{input.u16()} << 16;
  const std::span<const std::byte> bytes = input.take(input.remaining());
  std::vector<store::tensor_info> table;
  try {
    table = store::decode_tensor_table(bytes, extent);
  } catch (const vmm::ipc::protocol_error&) {
    return 0;
  } catch (const std::exception& error) {
    finding(fmt::format("the decoder threw something other than protocol_error: {}", error.what()));
  }
  if (const auto problem = store::tensor_table_problem(table, extent))
    finding(fmt::format("an accepted table breaks a rule: {}", *problem));
  const std::vector<std::byte> again = store::encode(table);
  if (again.size() != bytes.size() || std::memcmp(again.data(), bytes.data(), bytes.size()) != 0)
    finding("an accepted table encodes to other bytes");
  return 0;
}
