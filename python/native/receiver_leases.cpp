// Frees held for receivers (receiver_leases.hpp).

#include "receiver_leases.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>

#include "vmm/error.hpp"

namespace vmm_python {

vmm::unique_fd receiver_leases::lease(const void* ptr) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0)
    throw vmm::os_error(errno, "a lease for a shared allocation: pipe2 failed");
  vmm::unique_fd read_end(ends[0]);
  vmm::unique_fd write_end(ends[1]);
  std::lock_guard lock(mutex_);
  std::vector<vmm::unique_fd>& reads = leases_[ptr];
  // An allocation shared again and again while it lives keeps only the leases still held.
  std::erase_if(reads, [](const vmm::unique_fd& lease) { return ended(lease); });
  reads.push_back(std::move(read_end));
  recount();
  return write_end;
}

bool receiver_leases::ended(const vmm::unique_fd& read_end) noexcept {
  pollfd entry{read_end.get(), POLLIN, 0};
  // Nobody writes into a lease: any event (POLLHUP, or POLLERR) means no writer is left.
  return ::poll(&entry, 1, 0) == 1 && entry.revents != 0;
}

bool receiver_leases::hold(const pending_free& free) {
  std::lock_guard lock(mutex_);
  const auto found = leases_.find(free.ptr);
  if (found == leases_.end()) return false;
  std::vector<vmm::unique_fd>& reads = found->second;
  std::erase_if(reads, [](const vmm::unique_fd& read_end) { return ended(read_end); });
  if (reads.empty()) {
    leases_.erase(found);
    recount();
    return false;
  }
  kept_.push_back(free);
  recount();
  return true;
}

std::vector<pending_free> receiver_leases::released() {
  std::lock_guard lock(mutex_);
  std::vector<pending_free> done;
  done.reserve(kept_.size());
  std::vector<pending_free> still_kept;
  still_kept.reserve(kept_.size());
  for (const pending_free& free : kept_) {
    std::vector<vmm::unique_fd>& reads = leases_.at(free.ptr);
    std::erase_if(reads, [](const vmm::unique_fd& read_end) { return ended(read_end); });
    if (reads.empty()) {
      leases_.erase(free.ptr);
      done.push_back(free);
    } else {
      still_kept.push_back(free);
    }
  }
  kept_ = std::move(still_kept);
  recount();
  return done;
}

receiver_leases::held_figures receiver_leases::held() const {
  std::lock_guard lock(mutex_);
  held_figures figures;
  figures.frees = kept_.size();
  for (const pending_free& free : kept_) figures.bytes += free.size;
  return figures;
}

void receiver_leases::recount() noexcept {
  entries_.store(leases_.size() + kept_.size(), std::memory_order_release);
}

}  // namespace vmm_python
