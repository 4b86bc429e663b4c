// Every public header compiles in a .cu file, and its inline API works there: compiled and
// linked by nvcc, run on the host (CI has nvcc but no GPU), with the device-side inline
// functions compiled into a kernel that runs where there is a GPU. Regression: comparing
// two vmm::location in nvcc-compiled code failed to link (the defaulted comparison was not
// emitted inline).

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "cuda_support.hpp"
#include "vmm/address_range.hpp"
#include "vmm/address_space.hpp"
#include "vmm/append.hpp"
#include "vmm/append_view.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/chunk_view.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/host_device.hpp"
#include "vmm/ipc/exporter.hpp"
#include "vmm/ipc/fabric.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/handoff.hpp"
#include "vmm/ipc/importer.hpp"
#include "vmm/ipc/interprocess_event.hpp"
#include "vmm/ipc/manifest.hpp"
#include "vmm/ipc/protocol_error.hpp"
#include "vmm/ipc/resource_sharing.hpp"
#include "vmm/location.hpp"
#include "vmm/mapped_range.hpp"
#include "vmm/mapping.hpp"
#include "vmm/memory_registration.hpp"
#include "vmm/physical_allocation.hpp"
#include "vmm/provider.hpp"
#include "vmm/replicated_buffer.hpp"
#include "vmm/retirement.hpp"
#include "vmm/ring_buffer.hpp"
#include "vmm/ring_buffer_view.hpp"
#include "vmm/shared_chunk.hpp"
#include "vmm/stream_executor.hpp"
#include "vmm/stream_ref.hpp"
#include "vmm/stripe_layout.hpp"
#include "vmm/striped_buffer.hpp"
#include "vmm/unique_fd.hpp"

namespace vmm::testing {
namespace {

__global__ void locate_on_device(stripe_layout layout, std::uint64_t offset, std::uint32_t* device) {
  *device = layout.locate(offset).device;
}

TEST(headers_in_cuda, inline_comparisons_and_values_link_and_work) {
  EXPECT_TRUE(location::device(1) == location::device(1));
  EXPECT_FALSE(location::device(1) == location::device(2));
  EXPECT_TRUE(location::os_host() < location::device(0) || location::device(0) < location::os_host());
  const std::set<location> places{location::device(0), location::pinned_host(0), location::os_host()};
  EXPECT_EQ(places.size(), 3u);
  EXPECT_TRUE(accessor::device(3) == accessor::device(3));
  EXPECT_FALSE(accessor::host() == accessor::device(0));
  EXPECT_TRUE(stream_ref() == stream_ref(nullptr));
  EXPECT_FALSE(stream_ref::per_thread() == stream_ref());
  const stripe_layout layout = make_stripe_layout(8u << 20, 2u << 20, 2, stripe_mode::round_robin);
  EXPECT_EQ(layout.locate(3u << 20).device, 1u);
  EXPECT_EQ(to_string(location::device(2)), "gpu 2");
  EXPECT_EQ(std::string(to_string(handle_kind::posix_fd)), "posix fd");
  const ipc::fabric_handle zero{};
  EXPECT_TRUE(zero == ipc::fabric_handle{});
  // Host memory end to end through nvcc-compiled templates.
  device_vector<int> numbers(location::os_host(), {.max_size = 8u << 20});
  numbers.push_back(7);
  EXPECT_EQ(numbers.to_host(), std::vector<int>{7});
  stream_event done(host_executor(), stream_ref());
  EXPECT_TRUE(done.done());
  // append_from_kernel's host path as nvcc compiles it: a host function pushing into OS host
  // memory (no CUDA runtime call is made for it).
  const auto squares = [](append_view<int> view, std::size_t first, stream_ref) {
    for (std::uint64_t i = first; i < view.limit(10); ++i) view.push(static_cast<int>(i * i));
  };
  EXPECT_EQ(append_from_kernel(numbers, squares, stream_ref(), {.input_count = 10}), 10u);
  EXPECT_EQ(numbers.to_host(), (std::vector<int>{7, 0, 1, 4, 9, 16, 25, 36, 49, 64, 81}));
  // A resource shared and a pointer imported, on host memory, from nvcc-compiled code.
  const ipc::resource_description described{7, location::device(0), 2u << 20, access_mode::read_write};
  EXPECT_TRUE(ipc::parse_resource_description(ipc::serialize(described)) == described);
  memory_resource resource(location::os_host(),
                           {.handle_type = handle_kind::posix_fd, .max_size = 64u << 20});
  ipc::resource_exporter exporter(resource);
  ipc::imported_resource imported(exporter.export_resource());
  void* p = resource.allocate_sync(5000);
  std::memset(p, 0x3c, 5000);
  auto [sender, receiver] = ipc::make_socket_pair();
  ipc::send_pointer(sender.get(), exporter.export_pointer(p, 5000));
  ipc::imported_pointer shared = imported.receive_pointer(receiver.get());
  EXPECT_EQ(static_cast<const unsigned char*>(shared.data())[4999], 0x3c);
  EXPECT_THROW((void)imported.allocate_sync(64), invalid_argument);
  shared.reset();
  resource.deallocate_sync(p, 5000);
}

class headers_in_cuda_gpu : public gpu_test {};

TEST_F(headers_in_cuda_gpu, device_side_inline_functions_run_in_a_kernel) {
  const stripe_layout layout = make_stripe_layout(8u << 20, 2u << 20, 2, stripe_mode::round_robin);
  std::uint32_t* device = nullptr;
  VMM_CUDA_CHECK(cudaMallocManaged(&device, sizeof *device));
  locate_on_device<<<1, 1>>>(layout, 3u << 20, device);
  VMM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(*device, 1u);
  VMM_CUDA_CHECK(cudaFree(device));
}

}  // namespace
}  // namespace vmm::testing
