// The benchmarks' own options (bench/bench_args.hpp): every bad value is refused with the
// option named, before anything runs.

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "../bench/bench_args.hpp"

namespace vmm::bench {
namespace {

std::string refusal_of(auto parse) {
  try {
    parse();
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

TEST(bench_args, sizes_take_suffixes_and_refuse_the_rest) {
  EXPECT_EQ(parse_size("--cap=", "4096"), 4096u);
  EXPECT_EQ(parse_size("--cap=", "64M"), std::uint64_t{64} << 20);
  EXPECT_EQ(parse_size("--cap=", "4G"), std::uint64_t{4} << 30);
  // vmm::parse_byte_size's spellings: the IEC ones and decimals too.
  EXPECT_EQ(parse_size("--cap=", "64MiB"), std::uint64_t{64} << 20);
  EXPECT_EQ(parse_size("--cap=", "1.5G"), std::uint64_t{3} << 29);
  EXPECT_EQ(parse_size("--cap=", "2T"), std::uint64_t{2} << 40);
  for (const char* bad : {"", "0", "0K", "-1", "4X", "4G1", "1e3", "4GB", "99999999999999G"})
    EXPECT_NE(refusal_of([&] { (void)parse_size("--cap=", bad); }).find("--cap="), std::string::npos) << bad;
}

TEST(bench_args, counts_refuse_what_is_not_a_whole_number_in_range) {
  EXPECT_EQ(parse_count("--runs=", "8", 1), 8);
  for (const char* bad : {"", "0", "8.5", "x", "99999999999"})
    EXPECT_NE(refusal_of([&] { (void)parse_count("--runs=", bad, 1); }).find("--runs="), std::string::npos)
        << bad;
}

TEST(bench_args, ratios_refuse_text_infinity_and_values_out_of_range) {
  EXPECT_DOUBLE_EQ(parse_ratio("--oversubscribe=", "1.5", 0, 64), 1.5);
  EXPECT_DOUBLE_EQ(parse_ratio("--oversubscribe=", "64", 0, 64), 64);
  for (const char* bad : {"", "0", "-1", "1.5x", "abc", "inf", "nan", "65", "1e400"})
    EXPECT_NE(refusal_of([&] { (void)parse_ratio("--oversubscribe=", bad, 0, 64); }).find("--oversubscribe="),
              std::string::npos)
        << bad;
}

}  // namespace
}  // namespace vmm::bench
