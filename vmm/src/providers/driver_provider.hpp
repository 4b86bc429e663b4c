#pragma once
// Physical memory through the CUDA driver's VMM API: GPU memory (location DEVICE) and
// pinned host memory (location HOST_NUMA, accessible from the GPUs given). One class serves
// both: they differ only in the allocation's location, who gets access by default, and
// whether the handle can be exported. Each call runs with a primary context current (the
// memory's device, or the first GPU given for pinned memory) and restores the caller's.
// Every driver provider shares one address space: the CUDA unified address space.

#include <memory>
#include <string>
#include <vector>

#include "driver/device.hpp"
#include "vmm/provider.hpp"

namespace vmm::detail {

// The CUDA unified address space, one per process, shared by every driver provider.
const std::shared_ptr<vmm::address_space>& cuda_address_space();

// GPU memory of `ordinal`.
std::shared_ptr<memory_provider> make_device_provider(int ordinal);
// Pinned host memory on NUMA node `node`, accessible to the host and `devices`.
std::shared_ptr<memory_provider> make_pinned_host_provider(int node, std::vector<int> devices);
// The same, accessible to the host and every GPU.
std::shared_ptr<memory_provider> make_pinned_host_provider_for_all_devices(int node);

// The executor that runs work in GPU `ordinal`'s primary context; `pinned` splits fills at
// mapping boundaries (the driver refuses a memset of host-NUMA memory that spans two
// allocations, though copies over it work). Created on first use, never destroyed.
stream_executor& driver_executor_for(int ordinal, bool pinned);

class driver_provider final : public memory_provider {
 public:
  // The capabilities are filled by the factories above; `context_device` is the device
  // whose primary context the calls run in; `properties` how cuMemCreate makes memory.
  driver_provider(provider_capabilities capabilities, int context_device, CUmemAllocationProp properties);

 private:
  // One driver call each, in context_'s primary context; the driver's result becomes the
  // error vmm names it (driver/driver_api.hpp).
  std::uintptr_t do_allocate_range(std::size_t size, std::size_t alignment) override;  // cuMemAddressReserve
  void do_free_range(std::uintptr_t address, std::size_t size) override;               // cuMemAddressFree
  physical_handle do_create(std::size_t size) override;                                // cuMemCreate
  void do_destroy(physical_handle handle) override;                                    // cuMemRelease
  void do_map(std::uintptr_t address, std::size_t size, physical_handle handle) override;  // cuMemMap
  void do_unmap(std::uintptr_t address, std::size_t size) override;                        // cuMemUnmap
  // cuMemSetAccess; the host of pinned memory as its HOST_NUMA node.
  void do_set_access(std::uintptr_t address, std::size_t size, std::span<const access_grant> grants) override;
  int do_export_fd(physical_handle handle) override;                // cuMemExportToShareableHandle
  physical_handle do_import_fd(int fd, std::size_t size) override;  // cuMemImportFromShareableHandle

  driver::primary_context context_;
  CUmemAllocationProp properties_;
  std::string name_;
};

}  // namespace vmm::detail
