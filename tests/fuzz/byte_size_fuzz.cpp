/// @file
/// Fuzz target: vmm::parse_byte_size (vmm/byte_size.hpp) on raw bytes, and format_byte_size on
/// what it accepts.
///
/// The input is the text of a command-line option. Whatever the bytes, parse_byte_size either
/// throws vmm::invalid_argument, whose message quotes the text, or returns a size; text it
/// accepts holds no whitespace, sign or byte outside the grammar, and a text of digits only
/// is its own value. format_byte_size of an accepted size gives text that parses again, to
/// at most the size and within a thousandth of its unit.

#include <fmt/format.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "vmm/byte_size.hpp"
#include "vmm/error.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using vmm::fuzz::finding;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::uint64_t bytes = 0;
  try {
    bytes = vmm::parse_byte_size(text);
  } catch (const vmm::invalid_argument& error) {
    if (std::string_view(error.what()).find("byte size \"") == std::string_view::npos)
      finding(fmt::format("a refusal that quotes no text: {}", error.what()));
    return 0;
  } catch (const std::exception& error) {
    finding(fmt::format("parse_byte_size threw something other than invalid_argument: {}", error.what()));
  }

  if (text.find_first_not_of("0123456789.KMGTkmgtiB") != std::string_view::npos)
    finding(fmt::format("accepted a byte outside the grammar: {} bytes", size));
  if (text.find_first_not_of("0123456789") == std::string_view::npos) {
    std::uint64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size() || value != bytes)
      finding(fmt::format("digits read as {}, from_chars reads {}", bytes, value));
  }

  const std::string shown = vmm::format_byte_size(bytes);
  std::uint64_t again = 0;
  try {
    again = vmm::parse_byte_size(shown);
  } catch (const std::exception& error) {
    finding(fmt::format("format_byte_size({}) = {} does not parse: {}", bytes, shown, error.what()));
  }
  // The unit format_byte_size picked: the largest power of 1024 not above the size.
  std::uint64_t unit = 1;
  while (unit < (std::uint64_t{1} << 40) && bytes >= unit * 1024) unit *= 1024;
  if (again > bytes || bytes - again > unit / 1000 + 1)
    finding(fmt::format("format_byte_size({}) = {} reads back as {}", bytes, shown, again));
  return 0;
}
