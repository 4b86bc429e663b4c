// The driver layer, capability queries and the error model, with and without a GPU.

#include <gtest/gtest.h>

#include <cstring>
#include <new>

#include "provider_kinds.hpp"
#include "vmm/address_range.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/error.hpp"
#include "vmm/physical_allocation.hpp"
#include "vmm/retirement.hpp"

namespace vmm::testing {
namespace {

TEST(driver, without_a_gpu_driver_requests_fail_cleanly_and_the_os_provider_works) {
  std::string why;
  if (gpu_available(&why)) GTEST_SKIP() << "a GPU is present: covered by the GPU tests";
  EXPECT_FALSE(why.empty());
  try {
    (void)provider_for(location::device(0));
    ADD_FAILURE() << "provider_for(device 0) succeeded without a driver";
  } catch (const driver_unavailable& error) {
    EXPECT_NE(std::strstr(error.what(), "libcuda.so.1"), nullptr) << error.what();
  }
  EXPECT_THROW((void)device_count(), driver_unavailable);
  EXPECT_THROW((void)query_device(0), driver_unavailable);
  const system_capabilities caps = query_capabilities();
  EXPECT_FALSE(caps.driver_loaded);
  EXPECT_EQ(caps.driver_problem, why);
  physical_allocation memory(provider_for(location::os_host()), 1);
  EXPECT_EQ(memory.size(), caps.os_host_granularity.minimum);
}

TEST(driver, capabilities_describe_every_gpu) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const system_capabilities caps = query_capabilities();
  ASSERT_TRUE(caps.driver_loaded);
  EXPECT_GE(caps.driver_version, 12000);
  ASSERT_EQ(caps.devices.size(), static_cast<std::size_t>(device_count()));
  for (const device_capabilities& d : caps.devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory, 0u);
    ASSERT_TRUE(d.vmm_supported) << d.name;
    EXPECT_TRUE(std::has_single_bit(d.device_granularity.minimum));
    EXPECT_EQ(d.device_granularity.recommended % d.device_granularity.minimum, 0u);
    EXPECT_EQ(provider_for(location::device(d.ordinal))->capabilities().granularity,
              d.device_granularity.minimum);
    EXPECT_TRUE(caps.peer_access[static_cast<std::size_t>(d.ordinal)][static_cast<std::size_t>(d.ordinal)]);
  }
}

TEST(driver, unknown_devices_are_named_in_the_error) {
  std::string why;
  if (!gpu_available(&why)) {
    EXPECT_THROW((void)provider_for(location::device(9999)), driver_unavailable);
    return;
  }
  try {
    (void)provider_for(location::device(9999));
    ADD_FAILURE() << "device 9999 was accepted";
  } catch (const invalid_argument& error) {
    EXPECT_NE(std::strstr(error.what(), "9999"), nullptr) << error.what();
  }
  EXPECT_THROW((void)provider_for(location::device(-1)), invalid_argument);
  EXPECT_THROW((void)can_access_peer(0, 9999), invalid_argument);
}

TEST(errors, out_of_memory_is_a_bad_alloc_and_keeps_its_message) {
  try {
    throw out_of_memory("cuMemCreate(size=4) on gpu 0 failed: CUDA_ERROR_OUT_OF_MEMORY");
  } catch (const std::bad_alloc& error) {
    EXPECT_STREQ(error.what(), "cuMemCreate(size=4) on gpu 0 failed: CUDA_ERROR_OUT_OF_MEMORY");
  }
}

TEST(errors, os_provider_unknown_location_ids_and_bad_granularity_are_refused) {
  EXPECT_THROW((void)provider_for(location{memory_kind::os_host, 3}), invalid_argument);
  EXPECT_THROW((void)make_os_host_provider({.granularity = 3 << 20}), invalid_argument);
  EXPECT_THROW((void)make_os_host_provider({.granularity = 1024}), invalid_argument);
  EXPECT_EQ(make_os_host_provider({.granularity = 64 << 10})->capabilities().granularity,
            std::size_t{64} << 10);
}

// Counts cleanup failures instead of printing them.
int cleanup_failures = 0;
void count_failure(const char*) noexcept {
  ++cleanup_failures;
}

TEST(errors, destructors_report_failures_instead_of_throwing) {
  auto provider = provider_for(location::os_host());
  const auto previous = set_cleanup_failure_handler(&count_failure);
  cleanup_failures = 0;
  {
    physical_allocation memory(provider, 1);
    provider->destroy(memory.get());  // behind the owner's back: its destructor must fail
  }
  set_cleanup_failure_handler(previous);
  EXPECT_EQ(cleanup_failures, 1);
}

// The OS provider's handles are file descriptors, so the next allocation takes the number of
// one destroyed behind its owner's back. The owner's failed destroy must not be tried again
// then: it would destroy the new allocation under its owner.
TEST(errors, a_handle_destroyed_behind_its_owners_back_is_given_up_not_destroyed_again) {
  auto provider = make_os_host_provider({});
  const auto previous = set_cleanup_failure_handler(&count_failure);
  cleanup_failures = 0;
  physical_handle lost = 0;
  {
    physical_allocation memory(provider, 1);
    lost = memory.get();
    provider->destroy(lost);
  }
  physical_allocation next(provider, 1);
  ASSERT_EQ(next.get(), lost) << "the lowest free descriptor is taken again";
  collect_retired(true);  // a retry of the failed destroy would run here
  EXPECT_EQ(provider->address_space().usage().handles, 1u) << "the new allocation was destroyed";
  next.reset();
  set_cleanup_failure_handler(previous);
  EXPECT_EQ(cleanup_failures, 1) << "only the owner's destroy of the lost handle failed";
  EXPECT_EQ(provider->address_space().usage().handles, 0u);
}

template <class Kind>
class exhaustion : public provider_test<Kind> {};
TYPED_TEST_SUITE(exhaustion, all_memory_kinds, memory_kind_names);

TYPED_TEST(exhaustion, reserving_more_address_space_than_exists_is_out_of_memory) {
  EXPECT_THROW((void)this->provider_->allocate_range(std::size_t{1} << 62), std::bad_alloc);
}

TEST(exhaustion, creating_more_device_memory_than_exists_is_out_of_memory) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  auto provider = provider_for(location::device(0));
  const std::size_t too_much =
      round_up(query_device(0).total_memory * 2, provider->capabilities().granularity);
  EXPECT_THROW((void)provider->create(too_much), out_of_memory);
}

}  // namespace
}  // namespace vmm::testing
