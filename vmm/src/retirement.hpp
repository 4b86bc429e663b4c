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

// Takes out of the list the retirement whose object is `held` (the same object given to
// retire()), waits for its events and destroys it here, for a caller that needs what it
// holds gone now (an address to map again) and cannot wait for every retirement of the
// process. Returns at once when no retirement in the list holds it: it was never retired,
// is destroyed already, or another thread's collect_retired() is destroying it now (the
// caller then sees `held` expire shortly). Never throws: a failed wait is reported.
void collect_retirement(const std::weak_ptr<void>& held) noexcept;

}  // namespace vmm::detail
