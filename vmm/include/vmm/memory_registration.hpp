#pragma once
/// @file
/// Registrations of a memory_resource's memory with a transport (NCCL's ncclCommRegister, an
/// RDMA memory region), kept valid across sleep() and wake().
///
///     struct nccl_registrar : vmm::memory_registrar {
///       ncclComm_t comm;
///       void* register_memory(void* p, std::size_t n) override {
///         void* handle = nullptr;
///         if (ncclCommRegister(comm, p, n, &handle) != ncclSuccess) throw std::runtime_error("...");
///         return handle;
///       }
///       void deregister_memory(void* handle) noexcept override { (void)ncclCommDeregister(comm, handle); }
///     };
///     auto nccl = std::make_shared<nccl_registrar>(comm);
///     vmm::memory_registration r = resource.register_memory(buffer, bytes, nccl);
///     resource.sleep(offload);   // deregisters r before its pages go
///     resource.wake();           // registers r again over the new pages
///
/// Rationale. A transport registers the physical memory under an address, not the address:
/// NCCL retains the allocation handles under a registered buffer and maps them for its peers,
/// an RDMA NIC pins the pages. sleep() gives every page back and wake() maps new physical memory
/// at the same addresses, so a registration made before the sleep names memory that is gone
/// (and, while the transport still retains it, memory the sleep could not give back): a
/// collective over it reads stale memory or hangs.
///
/// The choice. The resource owns the registrations' lifetime: a registration made through
/// register_memory() is deregistered by sleep(), after the host copies are taken and before
/// any page is unmapped, and registered again by the wake() that maps its allocation, after
/// the saved bytes are restored. A user who registers through the resource never sees a stale
/// registration, needs no hook around sleep and wake, and sleep frees what the transport held.
/// The other designs considered: refusing sleep while registrations exist puts the same
/// bookkeeping on every caller (and torch's registrations are made by its process group, not
/// by the code that sleeps); a hook before sleep and after wake lets the caller forget a
/// registration, and leaves unstated what a failing hook leaves behind.
///
/// Failures change nothing. deregister_memory() cannot fail (a transport's failure there is
/// the registrar's to report), so sleep() has no new way to fail. When register_memory()
/// throws during a wake, the registrations that wake renewed are deregistered again, the wake
/// gives back what it mapped, the tags stay asleep, and the registrar's exception comes out of
/// wake(): a later wake tries again. When it throws inside register_memory() of the
/// resource, nothing is recorded.
///
/// Rules. A registration covers the start of one live allocation, up to its size; that
/// allocation cannot be deallocated while registered (the deallocation is refused and
/// counted, like another bad one): end the registration first, as ncclCommDeregister comes
/// before the free. The registrar's functions run under the resource's locks: they must not
/// call the resource, nor end a registration. A registration may outlive its resource: the
/// resource's destructor deregisters what is still registered (and reports it), and the
/// handle is empty from then on.

#include <cstddef>
#include <cstdint>
#include <memory>

namespace vmm {

namespace detail {
class registration_table;
}

/// Registers memory with a transport and deregisters it: what a memory_resource calls for
/// its registrations (see the file comment).
class memory_registrar {
 public:
  virtual ~memory_registrar() = default;
  /// Registers [ptr, ptr + bytes), mapped and holding its bytes; returns the transport's
  /// handle for it. May throw any exception: the memory then counts as not registered.
  virtual void* register_memory(void* ptr, std::size_t bytes) = 0;
  /// Ends a registration made by register_memory() while its memory is still mapped. Never
  /// throws: the registrar reports its own failures.
  virtual void deregister_memory(void* handle) noexcept = 0;
};

/// A registration made by memory_resource::register_memory(): move-only; ends (deregisters)
/// on destruction or reset().
class memory_registration {
 public:
  memory_registration() noexcept = default;
  memory_registration(memory_registration&& other) noexcept;
  memory_registration& operator=(memory_registration&& other) noexcept;
  memory_registration(const memory_registration&) = delete;
  memory_registration& operator=(const memory_registration&) = delete;
  ~memory_registration();

  /// The registrar's handle for the memory under the range now; nullptr while the resource
  /// sleeps (nothing is registered then), once ended, or after the resource is gone.
  [[nodiscard]] void* handle() const noexcept;
  /// Whether the registration is still the resource's (registered now, or to be registered
  /// again by a wake).
  [[nodiscard]] explicit operator bool() const noexcept;
  /// Ends the registration now: deregisters it if registered; the object is empty after.
  void reset() noexcept;

 private:
  friend class detail::registration_table;
  memory_registration(std::shared_ptr<detail::registration_table> table, std::uint64_t id) noexcept;
  std::shared_ptr<detail::registration_table> table_;
  std::uint64_t id_ = 0;
};

}  // namespace vmm
