#pragma once
// The bookkeeping every provider shares: which ranges are reserved, which physical handles
// are live and how large, and what is mapped where. Each provider checks the provider
// contract (vmm/provider.hpp) here before it calls the driver or the OS, so that a bad
// argument is the same vmm::invalid_argument on every provider, and a driver never sees it.
// Not thread-safe by itself: providers hold a mutex around check-then-act sequences.
// All driver providers share one registry (the GPU's address space is one, whatever device
// a range was reserved through or a handle created on: a range may hold several devices'
// memory); each OS provider has its own.

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vmm/provider.hpp"

namespace vmm::detail {

// The alignment rules of one provider, and its name for messages.
struct range_rules {
  std::size_t granularity;
  const char* name;

  // Throws invalid_argument unless size is a non-zero multiple of the granularity.
  void check_size(std::size_t size, const char* what) const;
  // Throws invalid_argument unless address is a non-null multiple of the granularity.
  void check_address(std::uintptr_t address, const char* what) const;
  // Validates and returns the alignment to use (0 means the granularity).
  std::size_t check_alignment(std::size_t alignment) const;
};

class range_registry {
 public:

  void add_reservation(std::uintptr_t address, std::size_t size);
  // Throws unless [address, size) is exactly a reservation with nothing mapped in it.
  void check_free(const range_rules& rules, std::uintptr_t address, std::size_t size) const;
  void remove_reservation(std::uintptr_t address) noexcept;

  void add_handle(physical_handle handle, std::size_t size);
  // Throws unless the handle is live; returns its size.
  std::size_t handle_size(const range_rules& rules, physical_handle handle) const;
  void remove_handle(physical_handle handle) noexcept;

  // Throws unless the whole handle fits at [address, size) inside one reservation, over
  // nothing mapped.
  void check_map(const range_rules& rules, std::uintptr_t address, std::size_t size,
                 physical_handle handle) const;
  void add_mapping(std::uintptr_t address, std::size_t size, physical_handle handle);
  // Throws unless [address, size) is covered exactly by whole mappings with no gap.
  void check_covered(const range_rules& rules, std::uintptr_t address, std::size_t size,
                     const char* what) const;
  void remove_mappings(std::uintptr_t address, std::size_t size) noexcept;
  // [address, address + size) cut where one mapping ends and the next begins (memory this
  // registry does not know stays one piece).
  std::vector<std::pair<std::uintptr_t, std::size_t>> split_at_mappings(std::uintptr_t address,
                                                                        std::size_t size) const;

 private:
  struct mapped {
    std::size_t size;
    physical_handle handle;
  };
  std::map<std::uintptr_t, std::size_t> reservations_;
  std::unordered_map<physical_handle, std::size_t> handles_;
  std::map<std::uintptr_t, mapped> mappings_;
};

}  // namespace vmm::detail
