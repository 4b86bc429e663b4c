#pragma once
// The state behind vmm::memory_resource: it composes the parts of the resource, each of
// which owns its data (docs/design/memory_resource.md has the design):
//
// - arena_set: the arenas (address ranges carved into blocks, arena.hpp);
// - stream_clock: the streams' records, their recorded points and epochs, the host's waits;
// - page_supply: the physical pages held, spare or mapped, and where more come from;
// - placement: each stream's arenas and the choice of the block a request is carved from;
// - sleep_wake: the host copies of sleep and wake;
//
// and keeps the bytes in use, the registrations and the locks.
//
// Locks. Each arena has a mutex; an allocation or a free on a stream takes only the mutex
// of the arena it lands in (fast path: a block whose pages are mapped). Everything that
// maps, unmaps or moves pages, or reaches across arenas (another stream's blocks, pages to
// stitch), runs on the slow path: the resource's mutex, then every arena's mutex in the
// order the arenas were made. A stream record's mutex is taken after any arena mutex, and
// so is the registrations' (resource/registrations.hpp).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "resource/arena_set.hpp"
#include "resource/page_supply.hpp"
#include "resource/placement.hpp"
#include "resource/registrations.hpp"
#include "resource/sleep_wake.hpp"
#include "resource/stream_clock.hpp"
#include "resource/usage.hpp"
#include "vmm/memory_resource.hpp"

namespace vmm::detail {

class resource_state {
 public:
  resource_state(std::shared_ptr<chunk_pool> pool, memory_resource_properties properties,
                 reuse_policies policies);
  ~resource_state();
  resource_state(const resource_state&) = delete;
  resource_state& operator=(const resource_state&) = delete;

  void* allocate(stream_ref stream, std::size_t bytes, std::size_t alignment, bool sync,
                 std::uint32_t tag = 0);
  void deallocate(stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment, bool sync) noexcept;
  void trim_to(std::size_t bytes_to_keep);
  void synchronize();
  void set_release_threshold(std::size_t bytes);
  void set_access(std::span<const access_grant> grants);
  access_mode access(const accessor& who) const;
  void wait_for(stream_ref waiting, stream_ref freeing);
  void sleep(std::span<const allocation_tag> offload, stream_ref stream);
  void wake(std::span<const allocation_tag> tags, stream_ref stream, after_wake then);
  bool asleep() const noexcept { return sleep_wake_.asleep(); }
  memory_resource_statistics statistics() const;
  memory_resource::allocation_pages pages_of(const void* ptr, std::size_t bytes) const;
  memory_registration register_memory(void* ptr, std::size_t bytes,
                                      std::shared_ptr<memory_registrar> registrar);
  void reset_high_water_marks();
  bool owns(const void* ptr) const noexcept {
    return arenas_.containing(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
  }

  const memory_resource_properties& properties() const noexcept { return properties_; }
  const reuse_policies& policies() const noexcept { return policies_; }
  const std::shared_ptr<memory_provider>& provider() const noexcept { return pool_->provider(); }
  const std::shared_ptr<chunk_pool>& pool() const noexcept { return pool_; }

 private:
  using stream_entry = placement::stream_entry;
  // Locks every arena (after the resource's mutex) for the slow path.
  class all_locked {
   public:
    explicit all_locked(const resource_state& state);

   private:
    std::unique_lock<std::mutex> resource_;
    std::vector<std::unique_lock<arena_mutex>> arenas_;
  };

  // The entry of `stream` (`sync`: of the calls without a stream), made on first use. The
  // lookup takes no lock.
  stream_entry& entry_of(stream_ref stream, bool sync);
  void* slow_allocate(stream_entry& entry, std::uint64_t size, std::uint64_t alignment, bool sync,
                      std::size_t requested, std::uint32_t tag);
  void* slow_allocate_locked(stream_entry& entry, std::size_t kind, std::uint64_t size,
                             std::uint64_t alignment, bool sync, std::size_t requested);
  // Under all_locked: notes the points that have passed (waiting for them with `wait`) and
  // makes what was freed before them free for every stream (stream_clock::refresh).
  void refresh_points(stream_record* caller, bool wait);
  void release_idle(std::size_t bytes_to_keep);  // under all_locked
  // The out_of_memory of a request that cannot be had, with the numbers (under all_locked).
  [[noreturn]] void refuse_request(std::size_t requested, std::uint64_t size, const std::string& why) const;
  // Reports a deallocation refused (deallocate is noexcept) and counts it.
  [[gnu::cold, gnu::noinline]] void refuse_deallocation(std::uintptr_t address, std::size_t bytes,
                                                        const std::string& why) noexcept;

  std::shared_ptr<chunk_pool> pool_;
  memory_resource_properties properties_;
  reuse_policies policies_;
  std::size_t page_;
  mutable std::mutex mutex_;  // the slow path
  const std::shared_ptr<registration_table> registrations_ = std::make_shared<registration_table>();
  usage used_;
  std::atomic<std::size_t> bad_deallocations_{0};
  std::chrono::nanoseconds slow_path_time_{};
  arena_set arenas_;
  stream_clock clock_;
  page_supply supply_;
  placement placement_;
  sleep_wake sleep_wake_;
};

}  // namespace vmm::detail
