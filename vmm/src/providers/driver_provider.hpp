#pragma once
// Physical memory through the CUDA driver's VMM API: GPU memory (location DEVICE) and
// pinned host memory (location HOST_NUMA, accessible from the GPU). One class serves both:
// they differ only in the allocation's location, who gets access by default, and whether
// the handle can be exported. Each call runs with the owning device's primary context
// current and restores the caller's.

#include <mutex>
#include <string>
#include <vector>

#include "driver/device.hpp"
#include "providers/range_registry.hpp"
#include "vmm/provider.hpp"

namespace vmm::detail {

class driver_provider final : public memory_provider {
 public:
  // where: a device, or pinned host memory made accessible to device 0.
  explicit driver_provider(location where);
  ~driver_provider() override = default;

  [[nodiscard]] location where() const noexcept override { return where_; }
  [[nodiscard]] std::size_t granularity() const noexcept override { return granularity_; }
  [[nodiscard]] std::size_t recommended_granularity() const noexcept override {
    return recommended_granularity_;
  }
  [[nodiscard]] std::span<const location> default_accessors() const noexcept override {
    return default_accessors_;
  }
  [[nodiscard]] bool can_export() const noexcept override { return exportable_; }

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
  [[nodiscard]] handle_kind export_handle_kind() const noexcept override;
  [[nodiscard]] std::string fabric_unavailable_reason() const override { return fabric_reason_; }
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
  location where_;
  int device_ordinal_;  // the device whose context the calls run in
  driver::primary_context context_;
  bool exportable_;
  // Empty when fabric handles work here (probed once: cuMemCreate with the fabric handle
  // type); then properties_ request them besides POSIX fds. Otherwise why not, in words.
  std::string fabric_reason_;
  CUmemAllocationProp properties_;
  std::size_t granularity_;
  std::size_t recommended_granularity_;
  std::vector<location> default_accessors_;
  std::string name_;
  range_rules rules_;
  // The one registry of the GPU address space, shared by every driver provider.
  std::mutex& mutex_;
  range_registry& registry_;
};

}  // namespace vmm::detail
