#include "providers/range_registry.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "vmm/error.hpp"

namespace vmm::detail {

void range_rules::check_size(std::size_t size, const char* what) const {
  if (size == 0) throw invalid_argument(fmt::format("{}: {} size is zero", name, what));
  if (size % granularity != 0)
    throw invalid_argument(fmt::format(
        "{}: {} size {} is not a multiple of the granularity {}", name, what, size, granularity));
}

void range_rules::check_address(std::uintptr_t address, const char* what) const {
  if (address == 0 || address % granularity != 0)
    throw invalid_argument(fmt::format("{}: {} address {:#x} is not aligned to the granularity {}",
                                       name, what, address, granularity));
}

std::size_t range_rules::check_alignment(std::size_t alignment) const {
  if (alignment == 0) return granularity;
  if (!std::has_single_bit(alignment) || alignment % granularity != 0)
    throw invalid_argument(fmt::format(
        "{}: alignment {} is not a power of two multiple of the granularity {}", name,
        alignment, granularity));
  return alignment;
}

void range_registry::add_reservation(std::uintptr_t address, std::size_t size) {
  reservations_.emplace(address, size);
}

void range_registry::check_free(const range_rules& rules, std::uintptr_t address,
                                std::size_t size) const {
  auto it = reservations_.find(address);
  if (it == reservations_.end())
    throw invalid_argument(fmt::format("{}: free of {:#x}, which is not a reserved range", rules.name,
                                       address));
  if (it->second != size)
    throw invalid_argument(fmt::format("{}: free of {:#x} with size {}, but {} bytes were reserved",
                                       rules.name, address, size, it->second));
  auto mapping = mappings_.lower_bound(address);
  if (mapping != mappings_.end() && mapping->first < address + size)
    throw invalid_argument(fmt::format("{}: free of {:#x} while {:#x} is still mapped in it", rules.name,
                                       address, mapping->first));
}

void range_registry::remove_reservation(std::uintptr_t address) noexcept {
  reservations_.erase(address);
}

void range_registry::add_handle(physical_handle handle, std::size_t size) {
  handles_.emplace(handle, size);
}

std::size_t range_registry::handle_size(const range_rules& rules, physical_handle handle) const {
  auto it = handles_.find(handle);
  if (it == handles_.end())
    throw invalid_argument(fmt::format("{}: unknown physical handle {:#x}", rules.name, handle));
  return it->second;
}

void range_registry::remove_handle(physical_handle handle) noexcept { handles_.erase(handle); }

void range_registry::check_map(const range_rules& rules, std::uintptr_t address, std::size_t size,
                               physical_handle handle) const {
  rules.check_address(address, "map");
  rules.check_size(size, "map");
  if (const std::size_t handle_bytes = handle_size(rules, handle); handle_bytes != size)
    throw invalid_argument(fmt::format(
        "{}: map of {} bytes at {:#x}, but the handle holds {} bytes (whole handles only)", rules.name,
        size, address, handle_bytes));
  auto reservation = reservations_.upper_bound(address);
  if (reservation == reservations_.begin() ||
      std::prev(reservation)->first + std::prev(reservation)->second < address + size)
    throw invalid_argument(fmt::format(
        "{}: map of [{:#x}, +{}) is not inside one reserved range", rules.name, address, size));
  auto next = mappings_.lower_bound(address);
  if (next != mappings_.end() && next->first < address + size)
    throw invalid_argument(fmt::format("{}: map of [{:#x}, +{}) overlaps the mapping at {:#x}",
                                       rules.name, address, size, next->first));
  if (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.size > address)
    throw invalid_argument(fmt::format("{}: map of [{:#x}, +{}) overlaps the mapping at {:#x}",
                                       rules.name, address, size, std::prev(next)->first));
}

void range_registry::add_mapping(std::uintptr_t address, std::size_t size, physical_handle handle) {
  mappings_.emplace(address, mapped{size, handle});
}

void range_registry::check_covered(const range_rules& rules, std::uintptr_t address,
                                   std::size_t size, const char* what) const {
  rules.check_address(address, what);
  rules.check_size(size, what);
  std::uintptr_t cursor = address;
  auto it = mappings_.find(address);
  while (cursor < address + size) {
    if (it == mappings_.end() || it->first != cursor)
      throw invalid_argument(fmt::format("{}: {} of [{:#x}, +{}): {:#x} is not the start of a mapping",
                                         rules.name, what, address, size, cursor));
    cursor += it->second.size;
    ++it;
  }
  if (cursor != address + size)
    throw invalid_argument(fmt::format("{}: {} of [{:#x}, +{}) ends inside the mapping that ends at {:#x}",
                                       rules.name, what, address, size, cursor));
}

void range_registry::remove_mappings(std::uintptr_t address, std::size_t size) noexcept {
  mappings_.erase(mappings_.lower_bound(address), mappings_.lower_bound(address + size));
}

std::vector<std::pair<std::uintptr_t, std::size_t>> range_registry::split_at_mappings(
    std::uintptr_t address, std::size_t size) const {
  std::vector<std::pair<std::uintptr_t, std::size_t>> pieces;
  const std::uintptr_t end = address + size;
  std::uintptr_t cursor = address;
  auto it = mappings_.upper_bound(address);
  if (it != mappings_.begin()) --it;
  for (; it != mappings_.end() && it->first < end; ++it) {
    const std::uintptr_t mapping_end = it->first + it->second.size;
    if (mapping_end <= cursor) continue;
    if (it->first > cursor) {
      pieces.emplace_back(cursor, it->first - cursor);
      cursor = it->first;
    }
    const std::uintptr_t piece_end = std::min(mapping_end, end);
    pieces.emplace_back(cursor, piece_end - cursor);
    cursor = piece_end;
  }
  if (cursor < end) pieces.emplace_back(cursor, end - cursor);
  return pieces;
}

}  // namespace vmm::detail
