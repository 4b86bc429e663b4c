/// @file
/// Fuzz target: the header of a vmm.share() handle (python/native/handle_header.hpp) on raw
/// bytes, as vmm.SharedHandle.receive reads them from a socket.
///
/// Whatever the bytes, parse_handle_header either throws vmm::invalid_argument, whose
/// message starts with "a vmm handle's header: ", or returns a header that keeps every rule:
/// counts and sizes in range, a lease only with a descriptor, and a layout whose elements
/// lie inside the shared bytes. Such a header serializes to text that parses back equal.

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "handle_header.hpp"
#include "vmm/error.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using vmm::fuzz::finding;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  vmm_python::handle_header header;
  try {
    header = vmm_python::parse_handle_header(text);
  } catch (const vmm::invalid_argument& error) {
    if (!std::string_view(error.what()).starts_with("a vmm handle's header: "))
      finding(fmt::format("a refusal that does not say what it refuses: {}", error.what()));
    return 0;
  } catch (const std::exception& error) {
    finding(fmt::format("parse_handle_header threw something other than invalid_argument: {}", error.what()));
  }

  if (header.manifest_bytes > (1U << 20) || header.fds > 65536 || header.offset > (std::uint64_t{1} << 48))
    finding("accepted a count or offset out of range");
  if (header.lease && header.fds == 0) finding("accepted a lease without a descriptor");
  if (header.tensor && (!header.length || header.tensor->shape.size() != header.tensor->strides.size()))
    finding("accepted a layout without a length, or with strides of another rank");
  std::string written;
  try {
    written = vmm_python::serialize(header);
  } catch (const std::exception& error) {
    finding(fmt::format("an accepted header does not serialize: {}", error.what()));
  }
  vmm_python::handle_header reread;
  try {
    reread = vmm_python::parse_handle_header(written);
  } catch (const std::exception& error) {
    finding(fmt::format("a serialized header does not parse: {}", error.what()));
  }
  if (!(reread == header)) finding(fmt::format("a header reads back otherwise: {}", written));
  return 0;
}
