#pragma once
// Sleep and wake of a memory resource (memory_resource::sleep, wake): the host copies of
// the offloaded allocations, the tags not woken yet, and the threads that give pinned host
// copies back after a wake. Asleep, the resource holds no physical page; its blocks and
// addresses stay, and wake maps pages under them again and copies the saved bytes back.
// Runs under every lock of the resource.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "resource/arena_set.hpp"
#include "resource/host_copies.hpp"
#include "resource/page_supply.hpp"
#include "resource/registrations.hpp"
#include "resource/stream_clock.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm::detail {

class sleep_wake {
 public:
  sleep_wake(arena_set& arenas, stream_clock& clock, page_supply& supply,
             registration_table& registrations) noexcept
      : arenas_(arenas), clock_(clock), supply_(supply), registrations_(registrations) {}
  sleep_wake(const sleep_wake&) = delete;
  sleep_wake& operator=(const sleep_wake&) = delete;

  [[nodiscard]] bool asleep() const noexcept { return asleep_.load(); }
  // Before sleep(): throws invalid_argument when asleep already; waits until the last
  // wake's host copies are back, before more are taken.
  void prepare_sleep();
  // Copies the allocations of the tags in `offload` to host memory in `stream`'s order and
  // gives every page back (memory_resource::sleep). Throws out_of_memory when the host
  // copies cannot be had, and what the executor throws: nothing changed then.
  void sleep(std::span<const allocation_tag> offload, stream_ref stream);
  // Maps pages under the allocations of `tags` (every tag: empty) and copies their bytes
  // back (memory_resource::wake). Throws invalid_argument when awake, out_of_memory when
  // the pages cannot be had (nothing changed), and what the executor and the registrars throw.
  void wake(std::span<const allocation_tag> tags, stream_ref stream, after_wake then);
  // Awake: the host copies the last wake kept go back.
  void drop_kept_copies() noexcept {
    if (!asleep_.load()) saved_.reset();
  }
  // The host copies, asleep or kept, go back (the resource's destructor).
  void drop_copies() noexcept {
    wait_for_host_release();
    saved_.reset();
  }
  [[nodiscard]] std::size_t host_copy_bytes() const noexcept { return saved_ ? saved_->size() : 0; }

 private:
  struct saved_run {
    std::uintptr_t address;
    std::size_t bytes;
    std::size_t offset;  // in saved_
    std::uint32_t tag;
  };
  void wait_for_host_release() noexcept;
  // After the last wake: gives saved_ back (on a thread of its own unless the executor is
  // synchronous).
  void give_back_host_copies();

  arena_set& arenas_;
  stream_clock& clock_;
  page_supply& supply_;
  // Registrations with transports, withdrawn by sleep and renewed by wake
  // (vmm/memory_registration.hpp).
  registration_table& registrations_;
  std::atomic<bool> asleep_{false};
  std::vector<std::uint32_t> asleep_tags_;
  // The host copies: while asleep, of the sleep; while awake, those a wake kept for the
  // next sleep (after_wake::keep_host_copies), pinned, or none.
  std::unique_ptr<host_copies> saved_;
  std::vector<saved_run> saved_runs_;
  // The host copies of the last wake are given back on a detached thread of their own (a
  // resource may live until the process exits, so nothing may have to join it), counted
  // in host_releases_running under this resource. Until a wake starts one, waiting for
  // them asks nothing (a resource destroyed at exit then touches no static).
  bool released_on_a_thread_ = false;
};

}  // namespace vmm::detail
