// A registration's handle (vmm/memory_registration.hpp): the record itself lives in its
// resource's registration table, which the handle asks and ends.

#include "vmm/memory_registration.hpp"

#include <utility>

#include "resource/registrations.hpp"

namespace vmm {

memory_registration::memory_registration(std::shared_ptr<detail::registration_table> table,
                                         std::uint64_t id) noexcept
    : table_(std::move(table)), id_(id) {}

memory_registration::memory_registration(memory_registration&& other) noexcept
    : table_(std::move(other.table_)), id_(std::exchange(other.id_, 0)) {}

memory_registration& memory_registration::operator=(memory_registration&& other) noexcept {
  if (this != &other) {
    reset();
    table_ = std::move(other.table_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

memory_registration::~memory_registration() {
  reset();
}

void* memory_registration::handle() const noexcept {
  return table_ ? table_->handle(id_) : nullptr;
}

memory_registration::operator bool() const noexcept {
  return table_ && table_->holds(id_);
}

void memory_registration::reset() noexcept {
  if (!table_) return;
  table_->end(id_);
  table_.reset();
  id_ = 0;
}

}  // namespace vmm
