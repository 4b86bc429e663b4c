#include "vmm/address_space.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "vmm/error.hpp"

namespace vmm {

address_space::address_space(std::string name) : name_(std::move(name)) {}

address_space_usage address_space::usage() const {
  std::lock_guard lock(mutex_);
  return usage_;
}

void address_space::check_size(std::size_t size, std::size_t granularity, const char* who,
                               const char* what) const {
  if (size == 0) throw invalid_argument(fmt::format("{}: {} size is zero", who, what));
  if (size % granularity != 0)
    throw invalid_argument(
        fmt::format("{}: {} size {} is not a multiple of the granularity {}", who, what, size, granularity));
}

void address_space::check_address(std::uintptr_t address, std::size_t granularity, const char* who,
                                  const char* what) const {
  if (address == 0 || address % granularity != 0)
    throw invalid_argument(fmt::format("{}: {} address {:#x} is not aligned to the granularity {}", who, what,
                                       address, granularity));
}

void address_space::add_range(std::uintptr_t address, std::size_t size) {
  ranges_.emplace(address, size);
  ++usage_.ranges;
  usage_.range_bytes += size;
}

void address_space::check_free(const char* who, std::uintptr_t address, std::size_t size) const {
  auto it = ranges_.find(address);
  if (it == ranges_.end())
    throw invalid_argument(fmt::format("{}: free of {:#x}, which is not an allocated range", who, address));
  if (it->second != size)
    throw invalid_argument(fmt::format("{}: free of {:#x} with size {}, but {} bytes were allocated", who,
                                       address, size, it->second));
  auto mapping = mappings_.lower_bound(address);
  if (mapping != mappings_.end() && mapping->first < address + size)
    throw invalid_argument(
        fmt::format("{}: free of {:#x} while {:#x} is still mapped in it", who, address, mapping->first));
}

void address_space::remove_range(std::uintptr_t address) noexcept {
  auto it = ranges_.find(address);
  if (it == ranges_.end()) return;
  --usage_.ranges;
  usage_.range_bytes -= it->second;
  ranges_.erase(it);
}

void address_space::add_handle(const char* who, physical_handle handle, std::size_t size) {
  // The driver may hand out the same handle again when one process imports the same memory
  // twice; each import is destroyed once, so the book counts them.
  auto [it, added] = handles_.try_emplace(handle, held{size, 0});
  if (!added && it->second.size != size)
    throw invalid_argument(fmt::format("{}: physical handle {:#x} is live with {} bytes, not {}", who, handle,
                                       it->second.size, size));
  ++it->second.count;
  ++usage_.handles;
  usage_.handle_bytes += size;
}

std::size_t address_space::handle_size(const char* who, physical_handle handle) const {
  auto it = handles_.find(handle);
  if (it == handles_.end())
    throw invalid_argument(fmt::format("{}: unknown physical handle {:#x}", who, handle));
  return it->second.size;
}

void address_space::remove_handle(physical_handle handle) noexcept {
  auto it = handles_.find(handle);
  if (it == handles_.end()) return;
  --usage_.handles;
  usage_.handle_bytes -= it->second.size;
  if (--it->second.count == 0) handles_.erase(it);
}

void address_space::check_map(const char* who, std::uintptr_t address, std::size_t size,
                              physical_handle handle, std::size_t granularity) const {
  check_address(address, granularity, who, "map");
  check_size(size, granularity, who, "map");
  if (const std::size_t handle_bytes = handle_size(who, handle); handle_bytes != size)
    throw invalid_argument(
        fmt::format("{}: map of {} bytes at {:#x}, but the handle holds {} bytes (whole handles only)", who,
                    size, address, handle_bytes));
  if (address > UINTPTR_MAX - size)
    throw invalid_argument(fmt::format("{}: map of {} bytes at {:#x} runs past the end of the address space",
                                       who, size, address));
  auto range = ranges_.upper_bound(address);
  if (range == ranges_.begin() || std::prev(range)->first + std::prev(range)->second < address + size)
    throw invalid_argument(
        fmt::format("{}: map of [{:#x}, +{}) is not inside one allocated range", who, address, size));
  auto next = mappings_.lower_bound(address);
  if (next != mappings_.end() && next->first < address + size)
    throw invalid_argument(fmt::format("{}: map of [{:#x}, +{}) overlaps the mapping at {:#x}", who, address,
                                       size, next->first));
  if (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.size > address)
    throw invalid_argument(fmt::format("{}: map of [{:#x}, +{}) overlaps the mapping at {:#x}", who, address,
                                       size, std::prev(next)->first));
}

void address_space::add_mapping(std::uintptr_t address, std::size_t size, physical_handle handle) {
  mappings_.emplace(address, mapped{size, handle});
  ++usage_.mappings;
  usage_.mapped_bytes += size;
}

void address_space::check_covered(const char* who, std::uintptr_t address, std::size_t size,
                                  std::size_t granularity, const char* what) const {
  check_address(address, granularity, who, what);
  check_size(size, granularity, who, what);
  if (address > UINTPTR_MAX - size)
    throw invalid_argument(
        fmt::format("{}: {} of {} bytes at {:#x} runs past the end of the "
                    "address space",
                    who, what, size, address));
  std::uintptr_t cursor = address;
  auto it = mappings_.find(address);
  while (cursor < address + size) {
    if (it == mappings_.end() || it->first != cursor)
      throw invalid_argument(fmt::format("{}: {} of [{:#x}, +{}): {:#x} is not the start of a mapping", who,
                                         what, address, size, cursor));
    cursor += it->second.size;
    ++it;
  }
  if (cursor != address + size)
    throw invalid_argument(fmt::format("{}: {} of [{:#x}, +{}) ends inside the mapping that ends at {:#x}",
                                       who, what, address, size, cursor));
}

void address_space::remove_mappings(std::uintptr_t address, std::size_t size) noexcept {
  const auto first = mappings_.lower_bound(address);
  const auto last = mappings_.lower_bound(address + size);
  for (auto it = first; it != last; ++it) {
    --usage_.mappings;
    usage_.mapped_bytes -= it->second.size;
  }
  mappings_.erase(first, last);
}

std::vector<std::pair<std::uintptr_t, std::size_t>> address_space::mapped_pieces(std::uintptr_t address,
                                                                                 std::size_t size) const {
  std::lock_guard lock(mutex_);
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

}  // namespace vmm
