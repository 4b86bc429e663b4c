#include "vmm/detail/retirement.hpp"

#include <algorithm>
#include <mutex>

#include "vmm/detail/cleanup.hpp"

namespace vmm {
namespace {

struct retired {
  std::vector<stream_event> passed;
  std::shared_ptr<void> held;
  detail::retirable* releasable = nullptr;  // `held` as a retirable, or null: destroying it is the release
  std::vector<std::shared_ptr<const stream_event>> shared;  // points other owners wait for too

  [[nodiscard]] bool done() const {
    return std::all_of(passed.begin(), passed.end(), [](const stream_event& e) { return e.done(); }) &&
           std::all_of(shared.begin(), shared.end(), [](const auto& e) { return e->done(); });
  }
  void synchronize() const {
    for (const stream_event& e : passed) e.synchronize();
    for (const auto& e : shared) e->synchronize();
  }
};

struct retirement_list {
  std::mutex mutex;
  std::vector<retired> entries;
};

retirement_list& list() {
  static auto* const instance = new retirement_list();  // never destroyed: used at exit
  return *instance;
}

// Moves out of the list the entries that are done (all of them after waiting, with wait).
std::vector<retired> take_done(bool wait) {
  std::vector<retired> taken;
  std::vector<retired> pending;
  {
    std::lock_guard lock(list().mutex);
    pending.swap(list().entries);
  }
  std::vector<retired> keep;
  for (retired& entry : pending) {
    // An event that cannot be queried belongs to a broken context (a kernel fault): the
    // work is over either way, and the failure is reported.
    bool done = true;
    detail::cleanup("collect_retired: waiting for a stream", [&] {
      if (wait) entry.synchronize();
      done = entry.done();
    });
    (done ? taken : keep).push_back(std::move(entry));
  }
  if (!keep.empty()) {
    std::lock_guard lock(list().mutex);
    for (retired& entry : keep) list().entries.push_back(std::move(entry));
  }
  return taken;
}

// Puts `entry` back on the list for a later collection; gives up what it holds when the
// list cannot take it.
void keep(retired entry) noexcept {
  try {
    std::lock_guard lock(list().mutex);
    list().entries.push_back(std::move(entry));  // leaves `entry` as it was if it throws
  } catch (...) {
    if (entry.releasable != nullptr) entry.releasable->abandon();
  }
}

// Releases what `entry` holds, or keeps it for a later collection to try again.
void release(retired& entry) noexcept {
  if (entry.releasable != nullptr && !entry.releasable->release()) {
    keep(std::move(entry));
    return;
  }
  entry.held.reset();
}

}  // namespace

void collect_retired(bool wait) {
  std::vector<retired> done = take_done(wait);
  for (retired& entry : done) release(entry);  // outside the list's lock
}

std::size_t retired_count() {
  std::lock_guard lock(list().mutex);
  return list().entries.size();
}

namespace detail {

namespace {

void retire_entry(retired entry) noexcept {
  bool done = true;  // as in take_done: a failed query means the work is over
  cleanup("retire: querying a stream", [&] { done = entry.done(); });
  if (!done) {
    try {
      std::lock_guard lock(list().mutex);
      list().entries.push_back(std::move(entry));
      return;
    } catch (...) {
      cleanup("retire: waiting for a stream", [&] { entry.synchronize(); });
    }
  }
  cleanup("retire: collecting earlier retirements", [] { collect_retired(false); });
  release(entry);
}

}  // namespace

void retire(std::vector<stream_event> passed, std::shared_ptr<void> held) noexcept {
  retire_entry(retired{std::move(passed), std::move(held)});
}

void retire(std::vector<stream_event> passed, std::shared_ptr<retirable> held) noexcept {
  retirable* const releasable = held.get();
  retire_entry(retired{std::move(passed), std::move(held), releasable});
}

void retire(std::vector<std::shared_ptr<const stream_event>> passed, std::shared_ptr<void> held) noexcept {
  retire_entry(retired{{}, std::move(held), nullptr, std::move(passed)});
}

void retry_later(std::shared_ptr<retirable> held) noexcept {
  retirable* const releasable = held.get();
  keep(retired{{}, std::move(held), releasable});
}

void collect_retirement(const std::weak_ptr<void>& held) noexcept {
  retired taken;
  {
    std::lock_guard lock(list().mutex);
    auto& entries = list().entries;
    const auto found = std::find_if(entries.begin(), entries.end(), [&](const retired& entry) {
      return !held.owner_before(entry.held) && !entry.held.owner_before(held);
    });
    if (found == entries.end()) return;
    taken = std::move(*found);
    entries.erase(found);
  }
  cleanup("collect_retirement: waiting for a stream", [&] { taken.synchronize(); });
  release(taken);  // outside the list's lock
}

}  // namespace detail
}  // namespace vmm
