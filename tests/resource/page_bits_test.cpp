// An arena's mapped-page bits (vmm/src/resource/arena.hpp, page_bits) against a page-by-page
// model: random bitmaps of scattered pages and of long runs, a `known` that cuts them
// anywhere, and searches over every kind of range.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "resource/arena.hpp"

namespace vmm::detail {
namespace {

struct model {
  std::vector<bool> mapped;  // page by page; from `known` on, not mapped
  std::size_t known = 0;

  [[nodiscard]] bool at(std::size_t p) const { return p < known && mapped[p]; }
  [[nodiscard]] std::size_t unmapped(std::size_t first, std::size_t count) const {
    std::size_t missing = 0;
    for (std::size_t p = first; p < first + count; ++p) missing += at(p) ? 0 : 1;
    return missing;
  }
  [[nodiscard]] std::pair<std::size_t, std::size_t> fewest(std::size_t low, std::size_t high,
                                                           std::size_t n) const {
    std::pair<std::size_t, std::size_t> best{low, unmapped(low, n)};
    for (std::size_t s = low + 1; s <= high && best.second != 0; ++s)
      if (const std::size_t missing = unmapped(s, n); missing < best.second) best = {s, missing};
    return best;
  }
};

// Pages mapped in runs whose lengths are drawn up to `longest` (1: each page on its own).
std::vector<bool> runs(std::mt19937_64& random, std::size_t pages, double share_mapped, std::size_t longest) {
  std::vector<bool> mapped(pages);
  std::bernoulli_distribution take(share_mapped);
  for (std::size_t p = 0; p < pages;) {
    const std::size_t run = 1 + random() % longest;
    const bool value = take(random);
    for (std::size_t i = 0; i < run && p < pages; ++i, ++p) mapped[p] = value;
  }
  return mapped;
}

std::vector<std::uint64_t> words_of(const std::vector<bool>& mapped, std::size_t known) {
  std::vector<std::uint64_t> words((mapped.size() + 63) / 64);
  for (std::size_t p = 0; p < known; ++p)
    if (mapped[p]) words[p / 64] |= std::uint64_t{1} << (p % 64);
  // Bits past `known` set too: they must not count (an arena's never are; the reader masks).
  for (std::size_t p = known; p < mapped.size(); ++p) words[p / 64] |= std::uint64_t{1} << (p % 64);
  return words;
}

TEST(page_bits, the_run_with_the_fewest_unmapped_pages_is_the_models) {
  std::mt19937_64 random(11);
  int searches = 0;
  int found_full_run = 0;
  for (int round = 0; round < 400; ++round) {
    const std::size_t pages = 1 + random() % 700;
    const double share = std::array{0.02, 0.5, 0.9, 0.98}[random() % 4];
    const std::size_t longest = std::array<std::size_t, 4>{1, 8, 64, 300}[random() % 4];
    model m{runs(random, pages, share, longest), random() % (pages + 1)};
    const std::vector<std::uint64_t> words = words_of(m.mapped, m.known);
    const page_bits bits{words, m.known};
    for (int i = 0; i < 40; ++i) {
      // Searches may reach past the bitmap (an arena's last block): those pages are unmapped.
      const std::size_t n = 1 + random() % 150;
      const std::size_t low = random() % (pages + 80);
      const std::size_t high = low + random() % 400;
      const auto expected = m.fewest(low, high, n);
      ASSERT_EQ(bits.fewest_unmapped(low, high, n), expected)
          << "pages " << pages << " known " << m.known << " low " << low << " high " << high << " n " << n;
      found_full_run += expected.second == 0 ? 1 : 0;
      ++searches;
      const std::size_t stop = random() % (n + 2);
      ASSERT_EQ(bits.unmapped(low, n, stop), std::min(m.unmapped(low, n), stop));
    }
  }
  // Both ends of the search were reached: runs with every page mapped, and runs without.
  EXPECT_GT(found_full_run, searches / 20);
  EXPECT_LT(found_full_run, searches - searches / 20);
}

TEST(page_bits, the_lowest_start_wins_a_tie_and_the_pages_past_known_are_unmapped) {
  // Pages 0-9 mapped, 10-19 not, 20-29 mapped, and `known` 25: runs of 5 at 0 and at 20
  // are both whole; the lowest start comes back. From 21 on, runs reach past `known`.
  std::vector<bool> mapped(30);
  for (std::size_t p = 0; p < 30; ++p) mapped[p] = p < 10 || p >= 20;
  const std::vector<std::uint64_t> words = words_of(mapped, 25);
  const page_bits bits{words, 25};
  EXPECT_EQ(bits.fewest_unmapped(0, 25, 5), (std::pair<std::size_t, std::size_t>{0, 0}));
  EXPECT_EQ(bits.fewest_unmapped(6, 25, 5), (std::pair<std::size_t, std::size_t>{20, 0}));
  EXPECT_EQ(bits.fewest_unmapped(21, 40, 5), (std::pair<std::size_t, std::size_t>{21, 1}));
  EXPECT_EQ(bits.fewest_unmapped(26, 40, 5), (std::pair<std::size_t, std::size_t>{26, 5}));
  EXPECT_EQ(bits.unmapped(18, 10, 100), 5u);  // 18, 19 and 25-27
  EXPECT_EQ(bits.unmapped(18, 10, 3), 3u);
  // From page 8: 8 and 9 mapped, 10-19 not, 20-24 mapped, the rest past `known`.
  EXPECT_EQ(bits.unmapped_from(8), ~(std::uint64_t{0x3} | std::uint64_t{0x1F} << 12));
}

}  // namespace
}  // namespace vmm::detail
