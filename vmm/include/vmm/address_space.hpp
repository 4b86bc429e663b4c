#pragma once
/// @file
/// The address space a provider's memory is mapped in, and the book of what is in it.
///
///     auto gpu0 = vmm::provider_for(vmm::location::device(0));
///     auto gpu1 = vmm::provider_for(vmm::location::device(1));
///     assert(&gpu0->address_space() == &gpu1->address_space());  // one CUDA VA space
///     vmm::address_space_usage before = gpu0->address_space().usage();
///     { vmm::growable_buffer b(...); b.resize(n); }               // ...
///     assert(gpu0->address_space().usage() == before);             // nothing leaked
///
/// Contract (what code above the providers may rely on, and nothing more):
///  - Every driver provider of a process (GPU memory of every device, pinned host memory)
///    shares one address_space: the CUDA unified virtual address space. A range allocated
///    through any of them may hold memory created by any of them, and one set_access
///    through any of them covers mappings of several devices' memory. This is what lets a
///    growable buffer spill from GPU 0 onto GPU 1 and set access once over both, and a
///    striped buffer map every device's stripes into one range.
///  - Each OS host provider has an address space of its own: its handles (memfds) mean
///    nothing to another, so memory of two OS providers never shares a range. Code that
///    combines memory of two providers checks that their address spaces are the same
///    object, and refuses otherwise.
///  - Every range, physical handle and mapping made through a provider is recorded here, and
///    every provider operation is checked against this book before the driver or the OS is
///    called (see vmm/provider.hpp): a bad argument is the same vmm::invalid_argument on
///    every provider and never reaches the driver.
///  - usage() counts what is live: tests compare it before and after an operation to prove
///    that nothing leaked (counted, not assumed).
/// Thread-safe: one mutex guards the book and the provider call it checks, so that a check
/// and the call it permits cannot be separated by another thread.

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace vmm {

/// An opaque handle to physical memory: a CUmemGenericAllocationHandle, or a memfd.
using physical_handle = std::uint64_t;

/// What an address space holds now.
struct address_space_usage {
  std::size_t ranges = 0;  ///< address ranges allocated and not freed
  std::size_t range_bytes = 0;
  std::size_t handles = 0;  ///< physical handles created or imported, not destroyed
  std::size_t handle_bytes = 0;
  std::size_t mappings = 0;  ///< handles mapped at an address
  std::size_t mapped_bytes = 0;
  friend bool operator==(const address_space_usage&, const address_space_usage&) = default;
};

class memory_provider;

/// See the file comment. Providers create their address space (driver providers share one);
/// users reach it through memory_provider::address_space().
class address_space {
 public:
  /// `name` names the space in messages ("the CUDA address space", "os host").
  explicit address_space(std::string name);
  address_space(const address_space&) = delete;
  address_space& operator=(const address_space&) = delete;

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// What is live now.
  [[nodiscard]] address_space_usage usage() const;
  /// [address, address + size) cut where one mapping ends and the next begins (memory this
  /// book does not know stays one piece). The driver refuses some operations (a memset of
  /// pinned host memory) over a range that spans two allocations: they run piece by piece.
  [[nodiscard]] std::vector<std::pair<std::uintptr_t, std::size_t>> mapped_pieces(std::uintptr_t address,
                                                                                  std::size_t size) const;

 private:
  friend class memory_provider;

  // The rules every provider's arguments are checked against, under mutex_.
  void check_size(std::size_t size, std::size_t granularity, const char* who, const char* what) const;
  void check_address(std::uintptr_t address, std::size_t granularity, const char* who,
                     const char* what) const;
  void add_range(std::uintptr_t address, std::size_t size);
  void check_free(const char* who, std::uintptr_t address, std::size_t size) const;
  void remove_range(std::uintptr_t address) noexcept;
  void add_handle(const char* who, physical_handle handle, std::size_t size);
  std::size_t handle_size(const char* who, physical_handle handle) const;
  void remove_handle(physical_handle handle) noexcept;
  void check_map(const char* who, std::uintptr_t address, std::size_t size, physical_handle handle,
                 std::size_t granularity) const;
  void add_mapping(std::uintptr_t address, std::size_t size, physical_handle handle);
  void check_covered(const char* who, std::uintptr_t address, std::size_t size, std::size_t granularity,
                     const char* what) const;
  void remove_mappings(std::uintptr_t address, std::size_t size) noexcept;

  struct mapped {
    std::size_t size;
    physical_handle handle;
  };
  struct held {
    std::size_t size;
    std::size_t count;  // imports of the same handle
  };
  std::string name_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> ranges_;
  std::unordered_map<physical_handle, held> handles_;
  std::map<std::uintptr_t, mapped> mappings_;
  address_space_usage usage_;
};

}  // namespace vmm
