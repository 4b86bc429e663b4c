#include "resource/registrations.hpp"

#include <utility>
#include <vector>

namespace vmm {
namespace detail {

memory_registration registration_table::add(std::uintptr_t address, std::size_t bytes, std::uint32_t tag,
                                            std::shared_ptr<memory_registrar> registrar) {
  std::lock_guard lock(mutex_);
  void* handle = registrar->register_memory(reinterpret_cast<void*>(address), bytes);
  const std::uint64_t id = next_id_++;
  try {
    records_.emplace(id, record{address, bytes, tag, registrar, handle, true});
  } catch (...) {
    registrar->deregister_memory(handle);  // the transport keeps nothing the resource does not know
    throw;
  }
  count_.store(records_.size(), std::memory_order_relaxed);
  return {shared_from_this(), id};
}

bool registration_table::any_in(std::uintptr_t address, std::size_t bytes) const {
  if (size() == 0) return false;
  std::lock_guard lock(mutex_);
  for (const auto& [id, r] : records_)
    if (r.address >= address && r.address - address < bytes) return true;
  return false;
}

void registration_table::withdraw_all() noexcept {
  std::lock_guard lock(mutex_);
  for (auto& [id, r] : records_)
    if (r.in_force) {
      r.registrar->deregister_memory(r.handle);
      r.handle = nullptr;
      r.in_force = false;
    }
}

void registration_table::renew(const std::function<bool(std::uint32_t)>& waking) {
  std::lock_guard lock(mutex_);
  std::vector<record*> renewed;
  renewed.reserve(records_.size());
  try {
    for (auto& [id, r] : records_)
      if (!r.in_force && waking(r.tag)) {
        r.handle = r.registrar->register_memory(reinterpret_cast<void*>(r.address), r.bytes);
        r.in_force = true;
        renewed.push_back(&r);
      }
  } catch (...) {
    for (record* r : renewed) {
      r->registrar->deregister_memory(r->handle);
      r->handle = nullptr;
      r->in_force = false;
    }
    throw;
  }
}

std::size_t registration_table::close() noexcept {
  std::lock_guard lock(mutex_);
  for (auto& [id, r] : records_)
    if (r.in_force) r.registrar->deregister_memory(r.handle);
  const std::size_t count = records_.size();
  records_.clear();
  count_.store(0, std::memory_order_relaxed);
  return count;
}

void registration_table::end(std::uint64_t id) noexcept {
  std::lock_guard lock(mutex_);
  const auto found = records_.find(id);
  if (found == records_.end()) return;
  if (found->second.in_force) found->second.registrar->deregister_memory(found->second.handle);
  records_.erase(found);
  count_.store(records_.size(), std::memory_order_relaxed);
}

void* registration_table::handle(std::uint64_t id) const noexcept {
  std::lock_guard lock(mutex_);
  const auto found = records_.find(id);
  return found == records_.end() ? nullptr : found->second.handle;
}

bool registration_table::holds(std::uint64_t id) const noexcept {
  std::lock_guard lock(mutex_);
  return records_.contains(id);
}

}  // namespace detail
}  // namespace vmm
