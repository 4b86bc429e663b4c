// The memory resource's table of allocated blocks (vmm/src/resource/block_table.hpp) against
// std::map: inserts, lookups and erases in a random order, with offsets crowded together so
// that probe runs are long and erases shift entries back across the table's wrap-around.

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "resource/block_table.hpp"

namespace vmm::detail {
namespace {

TEST(block_table, matches_a_map_through_random_inserts_and_erases) {
  std::mt19937_64 random(7);
  std::vector<std::unique_ptr<block>> storage;
  std::map<std::uint64_t, block*> model;
  block_table table;
  EXPECT_EQ(table.find(0), nullptr);
  for (int step = 0; step < 200000; ++step) {
    // 4096 possible offsets, multiples of the 256-byte unit: the table holds up to all of them.
    const std::uint64_t offset = (random() % 4096) << free_index::unit_shift;
    const auto known = model.find(offset);
    if (known == model.end() && random() % 3 != 0) {
      storage.push_back(std::make_unique<block>());
      storage.back()->offset = offset;
      table.reserve_one();
      table.insert(storage.back().get());
      model.emplace(offset, storage.back().get());
    } else if (known != model.end()) {
      table.erase(offset);
      model.erase(known);
    } else {
      table.erase(offset);  // not there: nothing changes
    }
    ASSERT_EQ(table.size(), model.size());
    if (step % 1000 == 0) {
      for (std::uint64_t probe = 0; probe < 4096; ++probe) {
        const std::uint64_t at = probe << free_index::unit_shift;
        const auto it = model.find(at);
        ASSERT_EQ(table.find(at), it == model.end() ? nullptr : it->second) << "offset " << at;
      }
      std::size_t visited = 0;
      table.for_each([&](const block* b) {
        ++visited;
        ASSERT_EQ(model.at(b->offset), b);
      });
      ASSERT_EQ(visited, model.size());
    }
  }
}

}  // namespace
}  // namespace vmm::detail
