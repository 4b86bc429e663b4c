#pragma once
/// @file
/// Where physical memory lives (location), who may touch it (accessor), and how
/// (access_mode, access_grant).
///
///     vmm::location gpu = vmm::location::device(0);          // memory of GPU 0
///     vmm::access_grant grants[] = {
///         {vmm::accessor::device(0), vmm::access_mode::read_write},
///         {vmm::accessor::device(1), vmm::access_mode::read_only}};
///     vmm::striped_buffer b({0, 1}, size, {.access = {grants, grants + 2}});
///
/// The two are different ideas: a location names a kind of physical memory and where it
/// is (it picks the provider); an accessor names a processor that reads or writes through
/// a mapping (a GPU, or the host CPU). Pinned host memory lives on a NUMA node of the host
/// and is accessed by the host and by GPUs.

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
  int id = 0;  ///< device ordinal, host NUMA node, or for os_host its provider's id (os_host_options::id).

  /// Memory of GPU `ordinal`.
  static constexpr location device(int ordinal) noexcept { return {memory_kind::device, ordinal}; }
  /// Pinned host memory on NUMA node `node`, allocated through the driver.
  static constexpr location pinned_host(int node = 0) noexcept { return {memory_kind::pinned_host, node}; }
  /// Plain host memory from the OS.
  static constexpr location os_host() noexcept { return {memory_kind::os_host, 0}; }

  // Written out (not defaulted) so that nvcc-compiled code finds them inline.
  friend constexpr bool operator==(const location& a, const location& b) noexcept {
    return a.kind == b.kind && a.id == b.id;
  }
  friend constexpr std::strong_ordering operator<=>(const location& a, const location& b) noexcept {
    if (a.kind != b.kind) return a.kind <=> b.kind;
    return a.id <=> b.id;
  }
};

/// "gpu 0", "pinned host (numa 0)", "os host" (id 0), "os host 1". Throws nothing but
/// std::bad_alloc.
std::string to_string(const location& where);

/// A processor that reads and writes memory through a mapping: a GPU or the host CPU.
struct accessor {
  enum class kind_type : std::uint8_t { host, device };
  kind_type kind = kind_type::host;
  int device_ordinal = 0;  ///< the GPU, when kind is device

  /// GPU `ordinal`.
  static constexpr accessor device(int ordinal) noexcept { return {kind_type::device, ordinal}; }
  /// The host CPU.
  static constexpr accessor host() noexcept { return {kind_type::host, 0}; }

  friend constexpr bool operator==(const accessor& a, const accessor& b) noexcept {
    return a.kind == b.kind && (a.kind == kind_type::host || a.device_ordinal == b.device_ordinal);
  }
};

/// "gpu 0", "the host". Throws nothing but std::bad_alloc.
std::string to_string(const accessor& who);

/// The access a mapping grants.
enum class access_mode : std::uint8_t {
  none,        ///< Mapped but inaccessible (PROT_NONE / no access descriptor).
  read_only,   ///< Reads work; writes fault (CU_MEM_ACCESS_FLAGS_PROT_READ / PROT_READ).
  read_write,  ///< Reads and writes.
};

/// "none", "read-only", "read-write".
const char* to_string(access_mode mode) noexcept;

/// Access granted to one accessor over a mapped range.
struct access_grant {
  accessor who;
  access_mode mode = access_mode::read_write;
};

}  // namespace vmm
