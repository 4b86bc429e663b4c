#pragma once
// The retirement list behind vmm/retirement.hpp.

#include <memory>
#include <vector>

#include "vmm/retirement.hpp"
#include "vmm/stream_executor.hpp"

namespace vmm::detail {

// Keeps `held` (whose destructor unmaps, frees and gives back) until every event in
// `passed` is done; destroys it at once when they are done already. Never throws: if the
// list cannot take it, waits for the events and destroys it here.
void retire(std::vector<stream_event> passed, std::shared_ptr<void> held) noexcept;

}  // namespace vmm::detail
