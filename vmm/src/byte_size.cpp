#include "vmm/byte_size.hpp"

#include <fmt/format.h>

#include <array>
#include <cstddef>

#include "vmm/error.hpp"

namespace vmm {
namespace {

// The text as a message quotes it.
std::string quoted(std::string_view text) {
  return fmt::format("\"{}\"", printable(text, 64));
}

[[noreturn]] void refuse(std::string_view text, std::string_view why) {
  throw invalid_argument(
      fmt::format("byte size {}: {} (expected a size such as 4096, 64M, 64MiB or 1.5G)", quoted(text), why));
}

bool is_digit(char c) noexcept {
  return c >= '0' && c <= '9';
}

// The shift of a unit letter (K 10, M 20, G 30, T 40), or 0 for another character.
int shift_of(char letter) noexcept {
  switch (letter) {
    case 'K':
    case 'k':
      return 10;
    case 'M':
    case 'm':
      return 20;
    case 'G':
    case 'g':
      return 30;
    case 'T':
    case 't':
      return 40;
    default:
      return 0;
  }
}

__extension__ using wide = unsigned __int128;  // __extension__: -Wpedantic knows no __int128
constexpr wide past_uint64 = wide{1} << 64;
// Decimals beyond this many cannot change a whole number of bytes below 2^64 at 2^40 a unit
// without also being refused, and keep the arithmetic inside 128 bits.
constexpr std::size_t most_decimals = 18;

}  // namespace

std::uint64_t parse_byte_size(std::string_view text) {
  if (text.empty()) refuse(text, "empty");
  if (text.find_first_of(" \t\n\v\f\r") != std::string_view::npos) refuse(text, "whitespace is not allowed");
  if (text.front() == '-') refuse(text, "negative");
  if (text.front() == '+') refuse(text, "a sign is not allowed");

  std::size_t at = 0;
  wide whole = 0;
  while (at < text.size() && is_digit(text[at])) {
    whole = whole * 10 + static_cast<unsigned>(text[at] - '0');
    if (whole >= past_uint64) refuse(text, "2^64 bytes or more");
    ++at;
  }
  if (at == 0) refuse(text, "no digits before the unit");

  wide fraction = 0;
  wide fraction_scale = 1;
  if (at < text.size() && text[at] == '.') {
    const std::size_t first = ++at;
    while (at < text.size() && is_digit(text[at])) {
      if (at - first == most_decimals) refuse(text, "more than 18 decimals");
      fraction = fraction * 10 + static_cast<unsigned>(text[at] - '0');
      fraction_scale *= 10;
      ++at;
    }
    if (at == first) refuse(text, "no digits after the decimal point");
  }

  int shift = 0;
  const std::string_view unit = text.substr(at);
  if (!unit.empty()) {
    shift = shift_of(unit.front());
    const std::string_view rest = unit.substr(1);
    if (shift == 0) {
      refuse(text,
             fmt::format("unknown unit {}: the units are K, M, G, T and KiB, MiB, GiB, TiB", quoted(unit)));
    }
    if (rest == "B" || rest == "b")
      refuse(text, fmt::format("{} is ambiguous (powers of 1000 or 1024): write {} or {}iB", quoted(unit),
                               unit.front(), unit.front()));
    if (!rest.empty() && rest != "iB")
      refuse(text,
             fmt::format("unknown unit {}: the units are K, M, G, T and KiB, MiB, GiB, TiB", quoted(unit)));
  }

  if (fraction_scale != 1 && shift == 0) refuse(text, "a decimal needs a unit (K, M, G or T)");
  // A fraction of the unit is cut to whole bytes: 0.1K is 102 bytes.
  const wide bytes = (whole << shift) + (fraction << shift) / fraction_scale;
  if (bytes >= past_uint64) refuse(text, "2^64 bytes or more");
  return static_cast<std::uint64_t>(bytes);
}

std::string format_byte_size(std::uint64_t bytes) {
  static constexpr std::array<std::string_view, 4> units = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < (std::uint64_t{1} << 10)) return fmt::format("{}", bytes);
  std::size_t unit = 0;
  while (unit + 1 < units.size() && bytes >= (std::uint64_t{1} << (10 * (unit + 2)))) ++unit;
  const int shift = static_cast<int>(10 * (unit + 1));
  // Thousandths of the unit, cut (never rounded up past what the value is, nor to 2^64).
  const wide thousandths = (wide{bytes} * 1000) >> shift;
  const auto whole = static_cast<std::uint64_t>(thousandths / 1000);
  const auto decimals = static_cast<unsigned>(thousandths % 1000);
  if (decimals == 0) return fmt::format("{}{}", whole, units[unit]);
  std::string digits = fmt::format("{:03}", decimals);
  while (digits.back() == '0') digits.pop_back();
  return fmt::format("{}.{}{}", whole, digits, units[unit]);
}

}  // namespace vmm
