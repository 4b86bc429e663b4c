#pragma once
// Plain host memory through the OS, with the driver's semantics (see vmm/provider.hpp):
// memfd_create + fallocate is physical memory (committed on create; ENOMEM/ENOSPC become
// vmm::out_of_memory), mmap(PROT_NONE, MAP_NORESERVE) is a reservation, mmap(MAP_FIXED |
// MAP_SHARED) of the memfd is a mapping, mprotect sets access, and a dup of the memfd is
// an export. Unmapping puts a PROT_NONE reservation back over the range, as cuMemUnmap
// leaves the range reserved. No CUDA at all: this provider is what CI runs everything on.

#include <mutex>

#include "providers/range_registry.hpp"
#include "vmm/provider.hpp"

namespace vmm::detail {

class os_host_provider final : public memory_provider {
 public:
  // granularity: a power-of-two multiple of the page size.
  explicit os_host_provider(std::size_t granularity);
  ~os_host_provider() override = default;

  [[nodiscard]] location where() const noexcept override { return location::os_host(); }
  [[nodiscard]] std::size_t granularity() const noexcept override { return granularity_; }
  [[nodiscard]] std::size_t recommended_granularity() const noexcept override {
    return granularity_;
  }
  [[nodiscard]] std::span<const location> default_accessors() const noexcept override;
  [[nodiscard]] bool can_export() const noexcept override { return true; }

  [[nodiscard]] std::uintptr_t reserve(std::size_t size, std::size_t alignment) override;
  void free_range(std::uintptr_t address, std::size_t size) override;
  [[nodiscard]] physical_handle create(std::size_t size) override;
  void release(physical_handle handle) override;
  [[nodiscard]] std::size_t size_of(physical_handle handle) const override;
  void map(std::uintptr_t address, std::size_t size, physical_handle handle) override;
  void unmap(std::uintptr_t address, std::size_t size) override;
  void set_access(std::uintptr_t address, std::size_t size,
                  std::span<const access_grant> grants) override;
  using memory_provider::set_access;
  [[nodiscard]] int export_fd(physical_handle handle) override;
  [[nodiscard]] physical_handle import_fd(int fd, std::size_t size) override;
  [[nodiscard]] handle_kind export_handle_kind() const noexcept override { return handle_kind::posix_fd; }
  [[nodiscard]] std::string fabric_unavailable_reason() const override;
  [[nodiscard]] fabric_handle export_fabric(physical_handle handle) override;
  [[nodiscard]] physical_handle import_fabric(const fabric_handle& handle, std::size_t size) override;
  [[nodiscard]] event_handle create_interprocess_event(interprocess_event_handle* exported) override;
  [[nodiscard]] event_handle open_interprocess_event(const interprocess_event_handle& handle) override;
  void record_event_at(event_handle event, stream_handle stream) override;
  void stream_wait_event(stream_handle stream, event_handle event) override;
  void copy(void* destination, const void* source, std::size_t n, stream_handle stream) override;
  void fill(void* destination, std::uint8_t value, std::size_t n, stream_handle stream) override;
  void synchronize(stream_handle stream) override;
  [[nodiscard]] event_handle record_event(stream_handle stream) override;
  [[nodiscard]] bool event_done(event_handle event) override;
  void wait_event(event_handle event) override;
  void destroy_event(event_handle event) noexcept override;
  [[nodiscard]] std::size_t physical_memory_size() const override;

 private:
  std::size_t granularity_;
  range_rules rules_;
  mutable std::mutex mutex_;
  range_registry registry_;
};

}  // namespace vmm::detail
