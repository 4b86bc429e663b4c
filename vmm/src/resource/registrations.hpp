#pragma once
// A memory_resource's registrations (vmm/memory_registration.hpp): the ranges registered
// through it, each with its registrar, its allocation's tag and the handle of the
// registration in force (none while the resource sleeps). Shared by the resource and the
// memory_registration objects, which may outlive it.
//
// Lock order: the resource's locks (all_locked, an arena's mutex) before this table's
// mutex; a memory_registration takes only the table's.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "vmm/memory_registration.hpp"

namespace vmm::detail {

class registration_table : public std::enable_shared_from_this<registration_table> {
 public:
  // Registers [address, address + bytes) through `registrar` and records it (nothing is
  // recorded if the registrar throws).
  memory_registration add(std::uintptr_t address, std::size_t bytes, std::uint32_t tag,
                          std::shared_ptr<memory_registrar> registrar);
  // Whether a registration starts in [address, address + bytes). Cheap when there is none.
  [[nodiscard]] bool any_in(std::uintptr_t address, std::size_t bytes) const;
  // sleep(): deregisters every registration in force.
  void withdraw_all() noexcept;
  // wake(): registers again those withdrawn whose tag `waking` names. If a registrar throws,
  // the ones this call registered are deregistered again and the exception goes on.
  void renew(const std::function<bool(std::uint32_t)>& waking);
  // The resource is going: deregisters what is in force, forgets everything; returns how
  // many registrations there were.
  std::size_t close() noexcept;
  [[nodiscard]] std::size_t size() const noexcept { return count_.load(std::memory_order_relaxed); }

  // For memory_registration.
  void end(std::uint64_t id) noexcept;
  [[nodiscard]] void* handle(std::uint64_t id) const noexcept;
  [[nodiscard]] bool holds(std::uint64_t id) const noexcept;

 private:
  struct record {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
    std::uint32_t tag = 0;
    std::shared_ptr<memory_registrar> registrar;
    void* handle = nullptr;
    bool in_force = false;
  };
  mutable std::mutex mutex_;
  std::map<std::uint64_t, record> records_;
  std::uint64_t next_id_ = 1;
  std::atomic<std::size_t> count_{0};
};

}  // namespace vmm::detail
