#pragma once
/// @file
/// One interface over a kind of physical memory and the address space it is mapped in: the
/// GPU's (through the CUDA driver), pinned host memory (through the driver, HOST_NUMA), and
/// plain host memory (through the OS: memfd, mmap, mprotect). Everything above this layer
/// is written once against it.
///
///     auto gpu = vmm::provider_for(vmm::location::device(0));
///     const std::size_t g = gpu->capabilities().granularity;
///     std::uintptr_t at = gpu->allocate_range(4 * g);          // addresses, no memory
///     vmm::physical_handle memory = gpu->create(g);             // memory, no address
///     gpu->map(at, g, memory);
///     gpu->set_access(at, g, gpu->capabilities().grants(vmm::access_mode::read_write));
///
/// Most code uses the RAII primitives over these calls (address_range, physical_allocation,
/// mapping) or the containers above them.
///
/// The contract mirrors the driver's VMM API, and every provider enforces it the same way,
/// before any driver or OS call, so that a bad argument is a vmm::invalid_argument naming
/// the problem on every provider (the checks are written once, in this class's public
/// functions, against the provider's vmm::address_space; the private virtuals only call the
/// driver or the OS):
///  - sizes and addresses are multiples of the granularity;
///  - map() places one whole physical allocation inside one range, over no other mapping;
///    unmap() and set_access() cover whole mappings with no gap;
///  - free_range() takes exactly an allocated range with nothing mapped in it;
///  - a physical allocation may be destroyed while mapped: its memory lives until the last
///    mapping of it goes.
/// Besides the argument errors each function lists, a call that reaches the driver or the
/// OS throws what they report: vmm::out_of_memory for CUDA_ERROR_OUT_OF_MEMORY, ENOMEM and
/// ENOSPC, vmm::driver_error or vmm::os_error for any other refusal.
/// Stream work on the memory (copies, fills, events) goes through executor()
/// (vmm/stream_executor.hpp); sharing with other processes is vmm::ipc's. All member
/// functions are thread-safe.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "vmm/address_space.hpp"
#include "vmm/error.hpp"
#include "vmm/location.hpp"
#include "vmm/stream_executor.hpp"
#include "vmm/unique_fd.hpp"

namespace vmm {

/// How physical memory travels to another process (vmm::ipc picks one per chunk).
enum class handle_kind : std::uint8_t {
  none = 0,      ///< it cannot be exported (pinned host memory)
  posix_fd = 1,  ///< a file descriptor, passed over a Unix socket between processes of one host
  fabric = 2,    ///< a CUmemFabricHandle (64 bytes), passed as plain bytes within an NVLink
                 ///< domain; needs a device that supports it and an IMEX channel
};

/// "none", "posix fd", "fabric".
const char* to_string(handle_kind kind) noexcept;

/// What a provider offers, filled once when it is made.
struct provider_capabilities {
  location where;
  /// Sizes and addresses must be multiples of this.
  std::size_t granularity = 0;
  /// The granularity the driver recommends for performance (>= granularity).
  std::size_t recommended_granularity = 0;
  /// Bytes of physical memory at this location (the GPU's total memory; for host memory,
  /// the provider's commit budget): the basis for default reservation sizes.
  std::size_t physical_memory_size = 0;
  /// Who uses the memory unless told otherwise (grants()): the owning GPU for GPU memory;
  /// the host and the GPUs given for pinned host memory; the host for OS memory.
  std::vector<accessor> default_accessors;
  /// How the memory is shared with other processes, best first: fabric where the device
  /// and an IMEX channel allow it (probed: the attribute alone is not enough), else
  /// posix_fd where export_fd() works, else none.
  handle_kind export_kind = handle_kind::none;
  /// Why export_kind is not fabric, in words (e.g. "cuMemCreate with
  /// CU_MEM_HANDLE_TYPE_FABRIC returned CUDA_ERROR_NOT_PERMITTED: no IMEX channel").
  std::string fabric_unavailable_reason;
  /// Whether the host may dereference mapped memory (OS and pinned host memory).
  bool host_accessible = false;
  /// Whether executor() completes all work before returning (host memory).
  bool synchronous = false;

  /// `mode` for each of default_accessors: what set_access() is given by default. Throws
  /// nothing but std::bad_alloc.
  [[nodiscard]] std::vector<access_grant> grants(access_mode mode) const;
};

/// See the file comment. Non-virtual public functions check the contract and keep the
/// address space's book; a few private virtuals do the work.
class memory_provider {
 public:
  virtual ~memory_provider() = default;
  memory_provider(const memory_provider&) = delete;
  memory_provider& operator=(const memory_provider&) = delete;

  /// What this provider offers, where its memory lives and its granularity among them
  /// (see provider_capabilities).
  [[nodiscard]] const provider_capabilities& capabilities() const noexcept { return capabilities_; }
  /// The address space the memory is mapped in, with its stated sharing rule.
  [[nodiscard]] vmm::address_space& address_space() const noexcept { return *space_; }
  /// Copies, fills and events for this memory.
  [[nodiscard]] stream_executor& executor() const noexcept { return *executor_; }

  /// Allocates `size` bytes of address space aligned to `alignment` (0: the granularity).
  /// Nothing is accessible in it until memory is mapped and access is set.
  /// @throws vmm::invalid_argument size is 0 or not a multiple of the granularity, or the
  ///         alignment is not a power of two multiple of it.
  /// @throws vmm::out_of_memory no address space of that size is left.
  /// @throws vmm::driver_error, vmm::os_error the driver or the OS refused it otherwise.
  [[nodiscard]] std::uintptr_t allocate_range(std::size_t size, std::size_t alignment = 0);
  /// Frees a range from allocate_range(): the whole range, with nothing mapped in it.
  /// @throws vmm::invalid_argument it is not such a range, or something is mapped in it.
  /// @throws vmm::driver_error, vmm::os_error the driver or the OS refused.
  void free_range(std::uintptr_t address, std::size_t size);

  /// Creates `size` bytes of physical memory, committed now.
  /// @throws vmm::invalid_argument size is 0 or not a multiple of the granularity.
  /// @throws vmm::out_of_memory the memory is not there.
  /// @throws vmm::driver_error, vmm::os_error the driver or the OS refused it otherwise.
  [[nodiscard]] physical_handle create(std::size_t size);
  /// Destroys a handle from create(), import_fd() or adopt(). Mappings of it stay valid.
  /// @throws vmm::invalid_argument the handle is not live.
  /// @throws vmm::driver_error, vmm::os_error the driver or the OS refused.
  void destroy(physical_handle handle);

  /// Maps the whole of `handle` at `address` (inside a range, over nothing mapped).
  /// The range is inaccessible until set_access().
  /// @throws vmm::invalid_argument the contract is broken (the message says how).
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error the map was refused.
  void map(std::uintptr_t address, std::size_t size, physical_handle handle);
  /// Unmaps [address, address + size): whole mappings with no gap between them.
  /// Not stream-ordered: the caller makes sure no queued work still uses the range.
  /// @throws vmm::invalid_argument the range is not exactly whole mappings.
  /// @throws vmm::driver_error, vmm::os_error the unmap was refused.
  void unmap(std::uintptr_t address, std::size_t size);
  /// Sets access over [address, address + size), which must be wholly mapped (with memory
  /// of any provider of this address space). One call over many mappings costs the driver
  /// one step per handle in the range.
  /// @throws vmm::invalid_argument the range is not whole mappings, `grants` is empty, or
  ///         it names an accessor that cannot be given this memory.
  /// @throws vmm::driver_error, vmm::os_error the driver or the OS refused the access.
  void set_access(std::uintptr_t address, std::size_t size, std::span<const access_grant> grants);

  /// Exports a handle as a new file descriptor, owned by the caller.
  /// @throws vmm::invalid_argument the memory cannot be exported (export_kind none), or
  ///         the handle is not live.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error the export failed.
  [[nodiscard]] unique_fd export_fd(physical_handle handle);
  /// Imports physical memory of `size` bytes from a file descriptor made by export_fd(),
  /// possibly of another process. The caller keeps `fd`.
  /// @throws vmm::invalid_argument the fd is not such memory or holds another size (where
  ///         the driver cannot tell the size at import, the first map() says so instead).
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error the import failed.
  [[nodiscard]] physical_handle import_fd(int fd, std::size_t size);

 protected:
  /// `space` is shared by every provider whose memory may share a range (see
  /// vmm/address_space.hpp); `executor` outlives the provider.
  memory_provider(provider_capabilities capabilities, std::shared_ptr<vmm::address_space> space,
                  stream_executor& executor);

 private:
  // Takes into the book a handle of `size` bytes obtained outside this class (vmm::ipc
  // imports fabric handles through the driver), so that it can be mapped and destroyed;
  // only through physical_allocation::adopt, which owns it from then on.
  // @throws vmm::invalid_argument size is not a multiple of the granularity.
  friend class physical_allocation;
  void adopt(physical_handle handle, std::size_t size);

  // The work itself, called with the address space's lock held and the arguments checked.
  virtual std::uintptr_t do_allocate_range(std::size_t size, std::size_t alignment) = 0;
  virtual void do_free_range(std::uintptr_t address, std::size_t size) = 0;
  virtual physical_handle do_create(std::size_t size) = 0;
  virtual void do_destroy(physical_handle handle) = 0;
  virtual void do_map(std::uintptr_t address, std::size_t size, physical_handle handle) = 0;
  virtual void do_unmap(std::uintptr_t address, std::size_t size) = 0;
  virtual void do_set_access(std::uintptr_t address, std::size_t size,
                             std::span<const access_grant> grants) = 0;
  virtual int do_export_fd(physical_handle handle) = 0;
  // Returns the handle, or throws; `size` is what the exporter says the memory holds.
  virtual physical_handle do_import_fd(int fd, std::size_t size) = 0;

  provider_capabilities capabilities_;
  std::string name_;  // to_string(where), for messages
  std::shared_ptr<vmm::address_space> space_;
  stream_executor* executor_;
};

/// The process-wide provider for `where`, created on first use and kept until exit.
/// Pinned host memory from here is accessible to the host and to every GPU.
/// @throws vmm::invalid_argument the device or NUMA node does not exist.
/// @throws vmm::driver_unavailable GPU or pinned memory asked for, and there is no usable
///         driver, no GPU, or no VMM support.
[[nodiscard]] std::shared_ptr<memory_provider> provider_for(location where);

/// Settings of an OS host-memory provider.
struct os_host_options {
  /// A power-of-two multiple of the page size. provider_for(location::os_host()) uses
  /// 2 MiB, as the GPUs do.
  std::size_t granularity = std::size_t{2} << 20;
  /// The most physical memory the provider commits at once; create() beyond it is
  /// vmm::out_of_memory naming the budget. 0: the memory that can be committed safely when
  /// the provider is made (MemAvailable and the memory cgroup's limit, less headroom).
  std::size_t commit_budget = 0;
  /// true: create() commits every page (fallocate), so that running out is out_of_memory
  /// there. false: pages come at first touch, and the kernel may end the process with
  /// SIGBUS on a touch it cannot back; the budget is still kept to, as bookkeeping. Only for
  /// simulations that touch little of what they create, such as vmm-replay measuring an
  /// allocator's footprint on a trace larger than this machine's memory.
  bool commit_on_create = true;
  /// The executor of the memory's stream work. nullptr: host_executor(), synchronous.
  /// Another one (it must outlive the provider) makes the provider asynchronous, so that
  /// stream-ordered code runs on host memory with events that pass when that executor
  /// says: white-box tests script them, and vmm-replay --lag simulates a device that runs
  /// behind the host.
  stream_executor* executor = nullptr;
  /// The id of the provider's location, location{memory_kind::os_host, id} (provider_for's
  /// is 0). Host memory is one place whatever the id; distinct ids let code that keeps one
  /// thing per location (vmm::replicated_buffer's replicas) run with several locations on
  /// a machine with no GPU. The memory is not bound to a NUMA node. id >= 0.
  int id = 0;
};

/// A new OS host-memory provider with an address space of its own.
/// @throws vmm::invalid_argument the granularity is not a power-of-two multiple of the
///         page size, or the id is negative.
[[nodiscard]] std::shared_ptr<memory_provider> make_os_host_provider(os_host_options options = {});

/// A new provider of pinned host memory on NUMA node `node`, accessible to the host and to
/// the GPUs `devices` (at least one; its work runs in the first one's context).
/// @throws vmm::invalid_argument the node or a device does not exist, or `devices` is empty.
/// @throws vmm::driver_unavailable no usable driver or no host-NUMA VMM support.
[[nodiscard]] std::shared_ptr<memory_provider> make_pinned_host_provider(int node, std::vector<int> devices);

/// Rounds `size` up to a multiple of `granularity` (a power of two).
/// @throws vmm::invalid_argument the result would overflow.
[[nodiscard]] std::size_t round_up(std::size_t size, std::size_t granularity);

}  // namespace vmm
