#pragma once
// Plain host memory through the OS, with the driver's semantics (see vmm/provider.hpp):
// memfd_create + fallocate is physical memory (committed on create, within a commit budget;
// ENOMEM/ENOSPC and the budget become vmm::out_of_memory), mmap(PROT_NONE, MAP_NORESERVE)
// is an address range, mmap(MAP_FIXED | MAP_SHARED) of the memfd is a mapping, mprotect
// sets access, and a dup of the memfd is an export. Unmapping puts a PROT_NONE reservation
// back over the range, as cuMemUnmap leaves the range allocated. No CUDA at all: this
// provider is what CI runs everything on.
//
// Why a commit budget: memfd pages are shared memory, charged to the process's memory
// cgroup, and committing past what the machine has does not fail a call: the kernel's OOM
// killer ends the process and its neighbours. So create() refuses, as cuMemCreate does on
// a full GPU, once the provider's committed bytes would pass the budget.
//
// Why seals: a peer that receives a memfd could truncate it, and every process that maps
// it would die of SIGBUS at its next access. Every memfd is created with MFD_ALLOW_SEALING
// and sealed against shrinking, growing and further seals before anyone else can see it;
// import_fd() refuses a descriptor without those seals.

#include <atomic>
#include <unordered_map>
#include <string>

#include "vmm/provider.hpp"

namespace vmm::detail {

class os_host_provider final : public memory_provider {
 public:
  explicit os_host_provider(os_host_options options);

  // The committed bytes now (memory created here and not yet destroyed).
  [[nodiscard]] std::size_t committed() const noexcept { return committed_.load(); }

 private:
  // A range is a PROT_NONE anonymous mapping (padded, then trimmed to the alignment);
  // memory is a sealed memfd (the handle is its descriptor).
  std::uintptr_t do_allocate_range(std::size_t size, std::size_t alignment) override;
  void do_free_range(std::uintptr_t address, std::size_t size) override;  // munmap
  // memfd_create, then fallocate (commit_on_create) or ftruncate, then the seals.
  physical_handle do_create(std::size_t size) override;
  void do_destroy(physical_handle handle) override;  // close: the pages live while mapped
  // mmap MAP_SHARED | MAP_FIXED over the range, PROT_NONE until set_access.
  void do_map(std::uintptr_t address, std::size_t size, physical_handle handle) override;
  void do_unmap(std::uintptr_t address, std::size_t size) override;  // PROT_NONE anonymous back
  // mprotect with the host's grant; a grant to any other accessor is refused.
  void do_set_access(std::uintptr_t address, std::size_t size, std::span<const access_grant> grants) override;
  int do_export_fd(physical_handle handle) override;                // a dup of the memfd
  physical_handle do_import_fd(int fd, std::size_t size) override;  // fstat + seals checked, a dup

  bool commit_on_create_ = true;
  std::atomic<std::size_t> committed_{0};
  std::unordered_map<physical_handle, std::size_t> created_;  // ours (not imported): budgeted
};

// Throws out_of_memory for ENOMEM and ENOSPC, os_error otherwise: "<call> failed ...".
[[noreturn]] void throw_errno(int error, const std::string& call);

// The bytes of host memory that can be committed safely now: MemAvailable and what the
// memory cgroup (v2 or v1) still allows, whichever is less, less headroom (1/8, at least
// 256 MiB). Never less than `floor`.
std::size_t safe_commit_budget(std::size_t floor);

}  // namespace vmm::detail
