#pragma once
// The retirement list behind vmm/retirement.hpp.
//
// Internal (vmm/detail/): installed for vmm::ipc and vmm::store, which build on it, and
// not part of vmm's interface: it may change in any release without notice.

#include <memory>
#include <vector>

#include "vmm/retirement.hpp"
#include "vmm/stream_executor.hpp"

namespace vmm::detail {

// What the list holds: memory an object stopped using (a mapped_range).
class retirable {
 public:
  virtual ~retirable() = default;
  // Unmaps, frees and gives back what it holds. Returns false when some of it could not be
  // let go (the failure was reported): what is left stays held, and the list calls release()
  // again at its next collection.
  virtual bool release() noexcept = 0;
  // Gives up what release() could not let go, for when the list cannot keep it: the memory
  // stays mapped for the rest of the process, and no pool lends its chunks again.
  virtual void abandon() noexcept = 0;
};

// Keeps `held` (whose destructor unmaps, frees and gives back) until every event in
// `passed` is done; destroys it at once when they are done already. Never throws: if the
// list cannot take it, waits for the events and destroys it here.
void retire(std::vector<stream_event> passed, std::shared_ptr<void> held) noexcept;

// As above, for memory whose release may fail: the list calls release() once the events
// are done, and keeps what could not be released for the next collection to try again. A
// shared_ptr of a type derived from retirable converts to both forms: pass it as this one.
void retire(std::vector<stream_event> passed, std::shared_ptr<retirable> held) noexcept;

// As the first form, with points shared with other owners (one point recorded for many
// pieces of memory that may be retired at different times). Every point must be non-null.
void retire(std::vector<std::shared_ptr<const stream_event>> passed, std::shared_ptr<void> held) noexcept;

// Keeps `held`, whose release() just failed, for the next collection to try again.
void retry_later(std::shared_ptr<retirable> held) noexcept;

// Takes out of the list the retirement whose object is `held` (the same object given to
// retire()), waits for its events and destroys (or releases) it here, for a caller that needs what it
// holds gone now (an address to map again) and cannot wait for every retirement of the
// process. Returns at once when no retirement in the list holds it: it was never retired,
// is destroyed already, or another thread's collect_retired() is destroying it now (the
// caller then sees `held` expire shortly). A release that fails puts it back on the list.
// Never throws: a failed wait is reported.
void collect_retirement(const std::weak_ptr<void>& held) noexcept;

}  // namespace vmm::detail
