// vmm::parse_byte_size and vmm::format_byte_size (vmm/byte_size.hpp): every spelling the
// header allows, every one it refuses with the reason, the edges of 2^64.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "vmm/byte_size.hpp"
#include "vmm/error.hpp"

namespace vmm {
namespace {

constexpr std::uint64_t KiB = std::uint64_t{1} << 10;
constexpr std::uint64_t MiB = std::uint64_t{1} << 20;
constexpr std::uint64_t GiB = std::uint64_t{1} << 30;
constexpr std::uint64_t TiB = std::uint64_t{1} << 40;

// The message parse_byte_size refuses `text` with, or "" when it accepts it.
std::string refusal_of(std::string_view text) {
  try {
    (void)parse_byte_size(text);
  } catch (const vmm::invalid_argument& error) {
    return error.what();
  }
  return "";
}

TEST(byte_size, plain_numbers_are_bytes) {
  EXPECT_EQ(parse_byte_size("0"), 0u);
  EXPECT_EQ(parse_byte_size("4096"), 4096u);
  EXPECT_EQ(parse_byte_size("007"), 7u);
  EXPECT_EQ(parse_byte_size("18446744073709551615"), std::numeric_limits<std::uint64_t>::max());
}

TEST(byte_size, every_unit_is_binary_in_both_spellings_and_either_letter_case) {
  const std::pair<std::string_view, std::uint64_t> cases[] = {
      {"1K", KiB},       {"1k", KiB},         {"1KiB", KiB},   {"1kiB", KiB},     {"64M", 64 * MiB},
      {"64m", 64 * MiB}, {"64MiB", 64 * MiB}, {"3G", 3 * GiB}, {"3GiB", 3 * GiB}, {"2T", 2 * TiB},
      {"2t", 2 * TiB},   {"2TiB", 2 * TiB},   {"0K", 0},
  };
  for (const auto& [text, bytes] : cases) EXPECT_EQ(parse_byte_size(text), bytes) << text;
}

TEST(byte_size, decimals_need_a_unit_and_are_cut_to_whole_bytes) {
  EXPECT_EQ(parse_byte_size("1.5G"), 3 * GiB / 2);
  EXPECT_EQ(parse_byte_size("1.5GiB"), 3 * GiB / 2);
  EXPECT_EQ(parse_byte_size("0.5K"), 512u);
  EXPECT_EQ(parse_byte_size("0.25T"), TiB / 4);
  EXPECT_EQ(parse_byte_size("0.1K"), 102u);  // 102.4, cut
  EXPECT_EQ(parse_byte_size("0.0001K"), 0u);
  EXPECT_EQ(parse_byte_size("1.000000000000000000G"), GiB);  // 18 decimals
  EXPECT_NE(refusal_of("1.5").find("a decimal needs a unit"), std::string::npos);
  EXPECT_NE(refusal_of("4096.0").find("a decimal needs a unit"), std::string::npos);
  EXPECT_NE(refusal_of("1.0000000000000000000G").find("more than 18 decimals"), std::string::npos);
}

TEST(byte_size, sizes_reaching_two_to_the_64_are_refused) {
  EXPECT_EQ(parse_byte_size("16777215T"), 16777215 * TiB);
  EXPECT_EQ(parse_byte_size("16777215.5T"), 16777215 * TiB + TiB / 2);
  for (const char* text : {"18446744073709551616", "16777216T", "16384P", "99999999999999999999999",
                           "17179869184G", "16777216.0T"})
    EXPECT_FALSE(refusal_of(text).empty()) << text;
  EXPECT_NE(refusal_of("18446744073709551616").find("2^64 bytes or more"), std::string::npos);
  EXPECT_NE(refusal_of("16777216T").find("2^64 bytes or more"), std::string::npos);
}

TEST(byte_size, bad_text_is_refused_with_the_text_quoted_and_the_reason) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"", "empty"},
      {"-1", "negative"},
      {"-64M", "negative"},
      {"+64M", "a sign is not allowed"},
      {" 64M", "whitespace is not allowed"},
      {"64M ", "whitespace is not allowed"},
      {"64 M", "whitespace is not allowed"},
      {"M", "no digits before the unit"},
      {".5G", "no digits before the unit"},
      {"1.G", "no digits after the decimal point"},
      {"1.", "no digits after the decimal point"},
      {"64X", "unknown unit"},
      {"64P", "unknown unit"},
      {"64B", "unknown unit"},
      {"64Mi", "unknown unit"},
      {"64MIB", "unknown unit"},
      {"64mib", "unknown unit"},
      {"64Mib", "unknown unit"},
      {"64MiBs", "unknown unit"},
      {"64MB", "ambiguous"},
      {"64kb", "ambiguous"},
      {"1e3", "unknown unit"},
      {"1,024", "unknown unit"},
      {"0x10", "unknown unit"},
      {"12.5.1K", "unknown unit"},
  };
  for (const auto& [text, why] : cases) {
    const std::string message = refusal_of(text);
    EXPECT_NE(message.find(why), std::string::npos) << "\"" << text << "\": " << message;
    EXPECT_NE(message.find(fmt::format("\"{}\"", text)), std::string::npos) << message;
  }
  // Bytes outside printable ASCII are shown escaped, never raw.
  EXPECT_NE(refusal_of("64\tM").find("\"64\\x09M\": whitespace is not allowed"), std::string::npos);
  const std::string message = refusal_of(std::string_view("4\x01\xff", 3));
  EXPECT_NE(message.find("\"4\\x01\\xff\""), std::string::npos) << message;
}

TEST(byte_size, the_formatter_picks_the_largest_unit_and_reads_back) {
  EXPECT_EQ(format_byte_size(0), "0");
  EXPECT_EQ(format_byte_size(1023), "1023");
  EXPECT_EQ(format_byte_size(KiB), "1KiB");
  EXPECT_EQ(format_byte_size(4100), "4.003KiB");  // 4.0039: cut
  EXPECT_EQ(format_byte_size(64 * MiB), "64MiB");
  EXPECT_EQ(format_byte_size(3 * GiB / 2), "1.5GiB");
  EXPECT_EQ(format_byte_size(GiB - 1), "1023.999MiB");  // three decimals, cut, not rounded
  EXPECT_EQ(format_byte_size(2 * TiB), "2TiB");
  EXPECT_EQ(format_byte_size(std::numeric_limits<std::uint64_t>::max()), "16777215.999TiB");
  for (const std::uint64_t bytes : {std::uint64_t{0}, std::uint64_t{1000}, KiB, 5 * KiB / 2, 64 * MiB,
                                    3 * GiB / 2, 1536 * MiB, 7 * TiB, 16777215 * TiB})
    EXPECT_EQ(parse_byte_size(format_byte_size(bytes)), bytes) << bytes;
  // Otherwise a little less, never more: both sides cut (what the byte_size fuzz target found
  // for 2^64 - 1 before fractions were cut).
  for (const std::uint64_t bytes :
       {std::uint64_t{4100}, GiB - 1, std::numeric_limits<std::uint64_t>::max()}) {
    const std::uint64_t again = parse_byte_size(format_byte_size(bytes));
    EXPECT_LE(again, bytes) << format_byte_size(bytes);
    EXPECT_GE(again, bytes - bytes / 1000) << format_byte_size(bytes);
  }
}

}  // namespace
}  // namespace vmm
