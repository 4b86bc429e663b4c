#include "resource/sleep_wake.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "vmm/detail/cleanup.hpp"
#include "vmm/detail/retirement.hpp"
#include "vmm/error.hpp"

namespace vmm::detail {
namespace {

constexpr std::size_t wake_run_bytes = std::size_t{64} << 20;  // bytes granted per call in wake()

// The threads that give host copies back after a wake (memory_resource::wake), each counted
// under the resource that started it. A resource waits for its own before it sleeps again
// and when it is destroyed; the process waits for all of them when it exits, since they use
// the retirement list, the executors and the pools, statics of their own, and a resource
// may live until exit (vmm_torch's do). The exit wait is a static made after those (in
// instance(), after retired_count()), so destroyed before them; the count itself is never
// destroyed, so that a resource destroyed later in the exit can still ask it.
class host_releases_running {
 public:
  static host_releases_running& instance() {
    (void)retired_count();  // the retirement list exists before the exit wait, and outlives it
    static host_releases_running* const running = new host_releases_running;
    static const exit_wait waits_at_exit{running};
    return *running;
  }
  host_releases_running(const host_releases_running&) = delete;
  host_releases_running& operator=(const host_releases_running&) = delete;
  void add(const void* owner) {
    std::lock_guard lock(mutex_);
    running_.push_back(owner);
  }
  void remove(const void* owner) noexcept {
    std::lock_guard lock(mutex_);
    running_.erase(std::find(running_.begin(), running_.end(), owner));
    finished_.notify_all();
  }
  // Waits until no thread that `owner` started runs; with nullptr, until none at all runs.
  void wait_for(const void* owner) noexcept {
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [&] {
      return owner == nullptr ? running_.empty()
                              : std::find(running_.begin(), running_.end(), owner) == running_.end();
    });
  }

 private:
  struct exit_wait {
    host_releases_running* running;
    ~exit_wait() { running->wait_for(nullptr); }
  };
  host_releases_running() = default;
  std::mutex mutex_;
  std::condition_variable finished_;
  std::vector<const void*> running_;  // one entry per thread: the resource that started it
};

}  // namespace

void sleep_wake::prepare_sleep() {
  if (asleep_.load()) throw invalid_argument("memory_resource: sleep while asleep already");
  wait_for_host_release();  // the last wake's host memory is back before more is taken
}

void sleep_wake::sleep(std::span<const allocation_tag> offload, stream_ref stream) {
  // The runs of allocations to save, adjacent ones of one tag together.
  const auto offloaded = [&](std::uint32_t tag) {
    return std::any_of(offload.begin(), offload.end(), [&](allocation_tag t) { return t.value == tag; });
  };
  std::vector<saved_run> runs;
  std::vector<std::uint32_t> tags;
  std::size_t total = 0;
  for (std::size_t i = 0; i < arenas_.count(); ++i) {
    arena& a = arenas_.at(i);
    std::vector<const block*> blocks;
    a.allocated().for_each([&](const block* b) { blocks.push_back(b); });
    std::sort(blocks.begin(), blocks.end(),
              [](const block* x, const block* y) { return x->offset < y->offset; });
    for (const block* b : blocks) {
      if (std::find(tags.begin(), tags.end(), b->tag) == tags.end()) tags.push_back(b->tag);
      if (!offloaded(b->tag)) continue;
      const std::uintptr_t address = a.base() + b->offset;
      if (!runs.empty() && runs.back().tag == b->tag && runs.back().address + runs.back().bytes == address) {
        runs.back().bytes += b->size;
      } else {
        runs.push_back({address, b->size, total, b->tag});
      }
      total += b->size;
    }
  }
  for (std::size_t i = 1; i < runs.size(); ++i) runs[i].offset = runs[i - 1].offset + runs[i - 1].bytes;

  // The host copies first: if they cannot be had, nothing has changed. Each run is copied
  // piece by piece as the host memory under it becomes ready.
  std::unique_ptr<host_copies> saved;
  const bool reused = total != 0 && saved_ && saved_->size() >= total;
  if (total != 0) {
    if (reused) {
      saved = std::move(saved_);
    } else {
      saved_.reset();  // kept copies too small: the host has them back before more is asked
      saved = std::make_unique<host_copies>(total, clock_.executor());
    }
    std::size_t next_run = 0;
    try {
      saved->prepare([&](std::size_t begin, std::size_t n) {
        for (; next_run < runs.size() && runs[next_run].offset < begin + n; ++next_run) {
          const saved_run& run = runs[next_run];
          const std::size_t from = std::max(begin, run.offset);
          const std::size_t to = std::min(begin + n, run.offset + run.bytes);
          clock_.executor().copy(saved->data() + from,
                                 reinterpret_cast<std::byte*>(run.address) + (from - run.offset), to - from,
                                 stream);
          if (to < run.offset + run.bytes) break;  // the rest of it lies in the next piece
        }
      });
    } catch (...) {
      // Copies queued into the host memory may still run: they finish before it goes, or
      // before kept copies are kept again (nothing changed).
      cleanup("memory_resource: sleep", [&] { clock_.executor().synchronize(stream); });
      if (reused) saved_ = std::move(saved);
      throw;
    }
  }
  clock_.executor().synchronize(stream);
  // Nothing can fail from here: the transports let go of the memory before its pages go.
  registrations_.withdraw_all();
  supply_.give_back_all();
  if (saved) saved_ = std::move(saved);  // nothing saved: copies kept before stay kept
  saved_runs_ = std::move(runs);
  asleep_tags_ = std::move(tags);
  asleep_.store(true);
}

void sleep_wake::wake(std::span<const allocation_tag> tags, stream_ref stream, after_wake then) {
  if (!asleep_.load()) throw invalid_argument("memory_resource: wake while awake");
  const auto waking = [&](std::uint32_t tag) {
    return tags.empty() ||
           std::any_of(tags.begin(), tags.end(), [&](allocation_tag t) { return t.value == tag; });
  };
  // The pages under the allocations of the waking tags, in order of arena and page.
  struct needed_page {
    arena* where;
    std::size_t arena_index;
    std::size_t page;
  };
  std::vector<needed_page> needed;
  for (std::size_t i = 0; i < arenas_.count(); ++i) {
    arena& a = arenas_.at(i);
    std::vector<bool> wanted;
    a.allocated().for_each([&](const block* b) {
      if (!waking(b->tag)) return;
      const auto [first, count] = a.page_span(b->offset, b->size);
      if (wanted.size() < first + count) wanted.resize(first + count);
      for (std::size_t p = first; p < first + count; ++p) wanted[p] = true;
    });
    for (std::size_t p = 0; p < wanted.size(); ++p)
      if (wanted[p] && !a.mapped(p)) needed.push_back({&a, i, p});
  }
  // Take every page first: a wake that cannot have them all gives them back.
  std::vector<shared_chunk> taken;
  taken.reserve(needed.size());
  std::size_t needed_bytes = 0;
  for (const needed_page& n : needed) needed_bytes += n.where->page_size();
  std::size_t taken_bytes = 0;
  try {
    while (taken.size() < needed.size()) {
      const std::size_t size = needed[taken.size()].where->page_size();
      taken.push_back(supply_.fresh_page(size, taken_bytes));
      taken_bytes += size;
    }
  } catch (const out_of_memory& error) {
    taken.clear();
    supply_.trim_pool();
    throw out_of_memory(
        fmt::format("memory_resource: wake needs {} bytes ({} pages); {} bytes were missing: {}",
                    needed_bytes, needed.size(), needed_bytes - taken_bytes, error.what()));
  }
  // A pipeline: the pages are mapped and granted a run at a time (the driver's cost is per
  // handle), and the copy of a saved run is queued as soon as every page it
  // touches is granted, so that the copies of the first runs overlap the driver's work on
  // the later ones. `copies`: each waking saved run, after how many of `needed` must be
  // granted before it is copied (0: every page it touches stayed mapped).
  std::vector<std::pair<std::size_t, const saved_run*>> copies;
  for (const saved_run& run : saved_runs_) {
    if (!waking(run.tag)) continue;
    const std::size_t index = arenas_.index_containing(run.address);  // a saved run is an allocation's
    const arena& a = arenas_.at(index);
    const auto [first, count] = a.page_span(run.address - a.base(), run.bytes);
    // The last needed page at or below the run's last page, if it is one of the run's.
    const auto after =
        std::upper_bound(needed.begin(), needed.end(), std::pair{index, first + count - 1},
                         [](const std::pair<std::size_t, std::size_t>& key, const needed_page& n) {
                           return key < std::pair{n.arena_index, n.page};
                         });
    const bool touches =
        after != needed.begin() && std::prev(after)->arena_index == index && std::prev(after)->page >= first;
    copies.emplace_back(touches ? static_cast<std::size_t>(after - needed.begin()) : 0, &run);
  }
  std::sort(copies.begin(), copies.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::size_t copied = 0;
  const auto copy_ready = [&](std::size_t granted) {
    for (; copied < copies.size() && copies[copied].first <= granted; ++copied) {
      const saved_run& run = *copies[copied].second;
      saved_->for_each_piece(run.offset, run.bytes, [&](std::size_t from, std::size_t n) {
        clock_.executor().copy(reinterpret_cast<std::byte*>(run.address) + (from - run.offset),
                               saved_->data() + from, n, stream);
      });
    }
  };
  std::size_t mapped_now = 0;
  try {
    copy_ready(0);
    for (std::size_t i = 0; i < needed.size();) {
      std::size_t j = i + 1;
      const std::size_t run_pages = std::max<std::size_t>(1, wake_run_bytes / needed[i].where->page_size());
      while (j < needed.size() && j - i < run_pages && needed[j].where == needed[i].where &&
             needed[j].page == needed[j - 1].page + 1)
        ++j;
      for (std::size_t k = i; k < j; ++k) {
        supply_.map_fresh(*needed[k].where, needed[k].page, std::move(taken[k]));
        ++mapped_now;
      }
      supply_.grant(*needed[i].where, needed[i].page, j - i);
      copy_ready(j);
      i = j;
    }
    clock_.executor().synchronize(stream);
    // The registrations of the waking allocations, over the new pages and restored bytes;
    // a registrar that throws has had the ones renewed here withdrawn again.
    registrations_.renew(waking);
  } catch (...) {
    // Copies queued into the pages may still run: they finish before the pages go.
    if (copied != 0) cleanup("memory_resource: wake", [&] { clock_.executor().synchronize(stream); });
    for (std::size_t i = 0; i < mapped_now; ++i) supply_.unmap_fresh(*needed[i].where, needed[i].page);
    throw;
  }
  std::erase_if(asleep_tags_, waking);
  std::erase_if(saved_runs_, [&](const saved_run& run) { return waking(run.tag); });
  supply_.note_created(needed.size());
  if (asleep_tags_.empty()) {
    saved_runs_.clear();
    if (then == after_wake::give_back_host_copies) give_back_host_copies();
    asleep_.store(false);
  }
}

void sleep_wake::give_back_host_copies() {
  if (clock_.synchronous()) {
    // Host memory (the OS provider): nothing to unpin, so the copies go back here, and no
    // thread is left running behind the call.
    saved_.reset();
    return;
  }
  // Pinned copies go back to the system on a thread of their own: unpinning and unmapping
  // them costs about as much as the rest of the wake (docs/design/memory_resource.md,
  // "Sleep and wake"), and nothing waits for it. The next sleep() and the destructor wait for
  // it. The thread holds what it uses (the copies use the executor, a static): it may outlive
  // the resource.
  wait_for_host_release();
  host_releases_running& running = host_releases_running::instance();
  running.add(this);
  released_on_a_thread_ = true;
  try {
    std::thread([owner = this, &running, saved = std::move(saved_)]() mutable noexcept {
      saved.reset();
      running.remove(owner);  // last: the resource's destructor waits for this
    }).detach();
  } catch (const std::system_error&) {
    // No thread to be had: the copies went with the closure that could not start.
    running.remove(this);
  }
}

void sleep_wake::wait_for_host_release() noexcept {
  if (released_on_a_thread_) host_releases_running::instance().wait_for(this);
}

// ---- access, dependencies, statistics -----------------------------------------------------

}  // namespace vmm::detail
