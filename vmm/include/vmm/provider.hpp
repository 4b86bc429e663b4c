#pragma once
/// @file
/// One interface over a kind of physical memory: the GPU's (through the CUDA driver),
/// pinned host memory (through the driver, HOST_NUMA), and plain host memory (through the
/// OS: memfd, mmap, mprotect). Everything above this layer is written once against it.
///
/// The contract mirrors the driver's VMM API, and every provider enforces it the same way,
/// before any driver or OS call, so that a bad argument is a vmm::invalid_argument naming
/// the problem on every provider:
///  - sizes and addresses are multiples of granularity();
///  - map() places one whole physical allocation inside one reservation, over no other
///    mapping; unmap() and set_access() cover whole mappings with no gap;
///  - free_range() takes exactly a reserved range with nothing mapped in it;
///  - a physical allocation may be released while mapped: its memory lives until the last
///    mapping of it goes.
/// All member functions are thread-safe.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "vmm/error.hpp"
#include "vmm/location.hpp"

struct CUstream_st;  // CUstream and cudaStream_t are both pointers to this.

namespace vmm {

/// A CUDA stream (CUstream or cudaStream_t); nullptr is the legacy default stream.
/// Host providers ignore it and work synchronously.
using stream_handle = ::CUstream_st*;

/// An opaque handle to physical memory: a CUmemGenericAllocationHandle, or a memfd.
using physical_handle = std::uint64_t;

/// An opaque handle to a point in a stream's work (a CUevent; 0 where there is no stream:
/// host providers work synchronously, so every point is already passed).
using event_handle = std::uint64_t;

/// How physical memory travels to another process (vmm::ipc picks one per chunk).
enum class handle_kind : std::uint8_t {
  none = 0,      ///< it cannot be exported (pinned host memory)
  posix_fd = 1,  ///< a file descriptor, passed over a Unix socket between processes of one host
  fabric = 2,    ///< a CUmemFabricHandle (64 bytes), passed as plain bytes within an NVLink
                 ///< domain; needs a device that supports it and an IMEX channel
};

/// "none", "posix fd", "fabric".
const char* to_string(handle_kind kind) noexcept;

/// The 64 bytes that name physical memory to another process through the fabric
/// (CUmemFabricHandle). Plain bytes: they travel in a message, not as a file descriptor.
struct fabric_handle {
  std::array<std::byte, 64> bytes{};
  friend bool operator==(const fabric_handle&, const fabric_handle&) = default;
};

/// The 64 bytes that name an interprocess event to another process of the same host
/// (CUipcEventHandle; a fixed token on host providers, whose events are always complete).
struct interprocess_event_handle {
  std::array<std::byte, 64> bytes{};
  friend bool operator==(const interprocess_event_handle&, const interprocess_event_handle&) = default;
};

/// What a host provider's interprocess event handle holds: no process can mistake it for a
/// GPU event's handle, nor open a GPU event's handle as it.
interprocess_event_handle host_event_token() noexcept;

/// Access granted to one accessor (a device, or the host) over a mapped range.
struct access_grant {
  location accessor;
  access_mode mode = access_mode::read_write;
};

/// The interface every kind of physical memory implements. See the file comment for the
/// contract; every function throws vmm::invalid_argument when it is broken, and
/// vmm::driver_error / vmm::os_error / vmm::out_of_memory when the call beneath fails.
class memory_provider {
 public:
  virtual ~memory_provider() = default;
  memory_provider(const memory_provider&) = delete;
  memory_provider& operator=(const memory_provider&) = delete;

  /// Where this provider's physical memory lives.
  [[nodiscard]] virtual location where() const noexcept = 0;
  /// The minimum granularity: sizes and addresses must be multiples of it.
  [[nodiscard]] virtual std::size_t granularity() const noexcept = 0;
  /// The granularity the driver recommends for performance (>= granularity()).
  [[nodiscard]] virtual std::size_t recommended_granularity() const noexcept = 0;
  /// Who set_access(addr, size, mode) grants access to: the owning device for GPU memory;
  /// the host and the accessor device for pinned host memory; the host for OS memory.
  [[nodiscard]] virtual std::span<const location> default_accessors() const noexcept = 0;
  /// Whether export_fd() works for this memory (pinned host memory cannot be exported).
  [[nodiscard]] virtual bool can_export() const noexcept = 0;

  /// Reserves `size` bytes of address space aligned to `alignment` (0: granularity()).
  /// Nothing is accessible in it until memory is mapped and access is set.
  /// @throws vmm::invalid_argument size is 0 or not a multiple of granularity(), or the
  ///         alignment is not a power of two multiple of granularity().
  /// @throws vmm::out_of_memory no address space of that size is left.
  [[nodiscard]] virtual std::uintptr_t reserve(std::size_t size, std::size_t alignment = 0) = 0;
  /// Frees a range returned by reserve(). It must be the whole range, with nothing mapped.
  virtual void free_range(std::uintptr_t address, std::size_t size) = 0;

  /// Creates `size` bytes of physical memory (committed now).
  /// @throws vmm::invalid_argument size is 0 or not a multiple of granularity().
  /// @throws vmm::out_of_memory the memory is not there.
  [[nodiscard]] virtual physical_handle create(std::size_t size) = 0;
  /// Releases a handle from create() or import_fd(). Mappings of it stay valid.
  virtual void release(physical_handle handle) = 0;
  /// The size of a live handle from create() or import_fd().
  [[nodiscard]] virtual std::size_t size_of(physical_handle handle) const = 0;

  /// Maps the whole of `handle` at `address` (inside a reservation, over nothing mapped).
  /// The range is inaccessible until set_access().
  virtual void map(std::uintptr_t address, std::size_t size, physical_handle handle) = 0;
  /// Unmaps [address, address + size): whole mappings with no gap between them.
  /// Not stream-ordered: the caller makes sure no queued work still uses the range.
  virtual void unmap(std::uintptr_t address, std::size_t size) = 0;
  /// Sets access over [address, address + size), which must be wholly mapped. One call
  /// over many mappings costs one driver call per handle in the range.
  virtual void set_access(std::uintptr_t address, std::size_t size,
                          std::span<const access_grant> grants) = 0;
  /// Grants `mode` to default_accessors().
  void set_access(std::uintptr_t address, std::size_t size, access_mode mode);

  /// Exports a handle as a new file descriptor, owned by the caller.
  /// @throws vmm::invalid_argument the memory cannot be exported (see can_export()).
  [[nodiscard]] virtual int export_fd(physical_handle handle) = 0;
  /// Imports physical memory of `size` bytes from a file descriptor from export_fd(),
  /// possibly of another process. The caller keeps ownership of `fd`.
  /// @throws vmm::invalid_argument the fd is not such memory, or its size differs.
  [[nodiscard]] virtual physical_handle import_fd(int fd, std::size_t size) = 0;

  // Sharing with other processes (vmm::ipc).

  /// The handle kind this memory is exported as, best first: fabric where the device and an
  /// IMEX channel allow it (probed once: the attribute alone is not enough), else posix_fd
  /// where export_fd() works, else none.
  [[nodiscard]] virtual handle_kind export_handle_kind() const noexcept = 0;
  /// Why export_handle_kind() is not fabric, in words (e.g. "cuMemCreate with
  /// CU_MEM_HANDLE_TYPE_FABRIC returned CUDA_ERROR_NOT_PERMITTED: no IMEX channel"); empty
  /// when fabric handles are available.
  [[nodiscard]] virtual std::string fabric_unavailable_reason() const = 0;
  /// Exports a handle as a fabric handle.
  /// @throws vmm::invalid_argument fabric handles are not available here (the message
  ///         carries fabric_unavailable_reason()), or the handle is not live.
  [[nodiscard]] virtual fabric_handle export_fabric(physical_handle handle) = 0;
  /// Imports `size` bytes of physical memory from a fabric handle, possibly of another
  /// process or node.
  /// @throws vmm::invalid_argument fabric handles are not available here.
  /// @throws vmm::driver_error the driver refused the handle (CUDA_ERROR_NOT_PERMITTED: this
  ///         process has no access to the exporter's IMEX channel).
  [[nodiscard]] virtual physical_handle import_fabric(const fabric_handle& handle, std::size_t size) = 0;

  /// Creates an event that another process can open (cuEventCreate with
  /// CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, then cuIpcGetEventHandle) and writes
  /// its handle to *exported. Nothing is recorded yet: it counts as passed. Destroy it with
  /// destroy_event(); vmm::interprocess_event does both. Host providers: a fixed token
  /// (host_event_token()), and event 0, which is always passed (they work synchronously).
  [[nodiscard]] virtual event_handle create_interprocess_event(interprocess_event_handle* exported) = 0;
  /// Opens an event made by create_interprocess_event() in another process
  /// (cuIpcOpenEventHandle). Destroy it with destroy_event().
  /// @throws vmm::invalid_argument the handle is not one this provider can open (a GPU
  ///         event's handle given to a host provider).
  /// @throws vmm::driver_error the driver refused the handle (the host token given to a GPU,
  ///         or a handle created in this same process).
  [[nodiscard]] virtual event_handle open_interprocess_event(const interprocess_event_handle& handle) = 0;
  /// Records `event` (from record_event(), create_interprocess_event() or
  /// open_interprocess_event()) at the current end of `stream`'s queued work, replacing
  /// its previous point. Host providers: nothing to do.
  virtual void record_event_at(event_handle event, stream_handle stream) = 0;
  /// Makes work queued on `stream` from now on wait until `event` has passed, without
  /// blocking the host (cuStreamWaitEvent). Host providers: nothing to do.
  virtual void stream_wait_event(stream_handle stream, event_handle event) = 0;

  /// Copies n bytes between any two addresses this provider's accessors can read/write
  /// (host memory included), in order on `stream`.
  virtual void copy(void* destination, const void* source, std::size_t n,
                    stream_handle stream = nullptr) = 0;
  /// Sets n bytes to `value`, in order on `stream`.
  virtual void fill(void* destination, std::uint8_t value, std::size_t n,
                    stream_handle stream = nullptr) = 0;
  /// Waits for all work queued on `stream`.
  virtual void synchronize(stream_handle stream = nullptr) = 0;

  /// Records the point `stream` has reached in its queued work. Destroy the handle with
  /// destroy_event(); vmm::stream_event does both.
  [[nodiscard]] virtual event_handle record_event(stream_handle stream) = 0;
  /// Whether the work queued before `event` is done (never blocks).
  [[nodiscard]] virtual bool event_done(event_handle event) = 0;
  /// Blocks until the work queued before `event` is done.
  virtual void wait_event(event_handle event) = 0;
  /// Destroys a handle from record_event(). Never throws.
  virtual void destroy_event(event_handle event) noexcept = 0;

  /// Bytes of physical memory at this location (the GPU's total memory, or the host's RAM):
  /// the basis for default reservation sizes.
  [[nodiscard]] virtual std::size_t physical_memory_size() const = 0;

 protected:
  memory_provider() = default;
};

/// The process-wide provider for `where`, created on first use and kept until exit.
/// @throws vmm::invalid_argument the device or NUMA node does not exist.
/// @throws vmm::driver_unavailable GPU or pinned memory asked for, and there is no usable
///         driver, no GPU, or no VMM support.
[[nodiscard]] std::shared_ptr<memory_provider> provider_for(location where);

/// A new OS host-memory provider with its own granularity (a power-of-two multiple of the
/// page size). provider_for(location::os_host()) uses 2 MiB, as the GPUs do.
[[nodiscard]] std::shared_ptr<memory_provider> make_os_host_provider(std::size_t granularity);

/// Rounds `size` up to a multiple of `granularity` (a power of two).
/// @throws vmm::invalid_argument the result would overflow.
[[nodiscard]] std::size_t round_up(std::size_t size, std::size_t granularity);

}  // namespace vmm
