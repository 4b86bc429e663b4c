#pragma once
// The broadcast tree of replicated_buffer, apart so that tests can give it any peer matrix.

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "vmm/replicated_buffer.hpp"

namespace vmm::detail {

// can_push[a][b]: replica a can write into replica b's memory (a == b: true).
using push_matrix = std::vector<std::vector<bool>>;

// The rounds of copies that bring the bytes from replica `root` to every replica: in each
// round every replica that has them (in the order they got them) pushes to one that has not
// and that no one else pushes to in that round: the one that can pass them on to the most
// replicas still waiting (the first of those, on a tie). N replicas take N - 1 copies,
// each into another replica (no link carries the bytes twice), in ceil(log2 N) rounds when
// every pair is connected and along the chain when only neighbours are.
// Throws vmm::invalid_argument when a replica cannot be reached from the root.
std::vector<std::vector<replica_copy>> broadcast_rounds(std::size_t root, const push_matrix& can_push);

// The first (from, to) such that `to` cannot be reached from `from` over can_push, if any.
std::optional<std::pair<std::size_t, std::size_t>> unreachable_pair(const push_matrix& can_push);

}  // namespace vmm::detail
