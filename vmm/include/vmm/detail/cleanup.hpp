#pragma once
// Cleanup paths (destructors, reset()) never throw: they run the call and report a failure.
//
// Internal (vmm/detail/): installed for vmm::ipc and vmm::store, which build on it, and
// not part of vmm's interface: it may change in any release without notice.

#include <utility>

namespace vmm::detail {

// Reports the exception being handled, unless it only says the driver has already shut
// down (process exit: the driver freed everything itself).
void report_current_exception(const char* context) noexcept;

// Runs `fn`; returns whether it finished without throwing (what it threw is reported).
template <class Fn>
bool cleanup(const char* context, Fn&& fn) noexcept {
  try {
    std::forward<Fn>(fn)();
    return true;
  } catch (...) {
    report_current_exception(context);
    return false;
  }
}

}  // namespace vmm::detail
