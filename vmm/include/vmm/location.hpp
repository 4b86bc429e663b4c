#pragma once
/// @file
/// Where physical memory lives, and what access a mapping grants.

#include <compare>
#include <cstdint>
#include <string>

namespace vmm {

/// The kinds of physical memory vmm manages.
enum class memory_kind : std::uint8_t {
  device,       ///< GPU memory, through the CUDA driver (cuMemCreate, location DEVICE).
  pinned_host,  ///< Page-locked host memory through the driver (location HOST_NUMA).
  os_host,      ///< Plain host memory through the OS (memfd + mmap); no CUDA at all.
};

/// A place physical memory lives: a GPU, a host NUMA node through the driver, or the OS.
struct location {
  memory_kind kind = memory_kind::os_host;
  int id = 0;  ///< device ordinal, host NUMA node, or 0 for os_host.

  /// Memory of GPU `ordinal`.
  static constexpr location device(int ordinal) noexcept { return {memory_kind::device, ordinal}; }
  /// Pinned host memory on NUMA node `node`, allocated through the driver.
  static constexpr location pinned_host(int node = 0) noexcept {
    return {memory_kind::pinned_host, node};
  }
  /// Plain host memory from the OS.
  static constexpr location os_host() noexcept { return {memory_kind::os_host, 0}; }

  friend constexpr auto operator<=>(const location&, const location&) = default;
};

/// "gpu 0", "pinned host (numa 0)", "os host".
std::string to_string(const location& where);

/// The access a mapping grants.
enum class access_mode : std::uint8_t {
  none,        ///< Mapped but inaccessible (PROT_NONE / no access descriptor).
  read_only,   ///< Reads work; writes fault (CU_MEM_ACCESS_FLAGS_PROT_READ / PROT_READ).
  read_write,  ///< Reads and writes.
};

/// "none", "read-only", "read-write".
const char* to_string(access_mode mode) noexcept;

}  // namespace vmm
