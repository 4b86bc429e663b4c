#pragma once
// The memory providers every typed suite runs on. A GPU kind whose driver or device is
// missing makes its tests skip with the reason; the OS kind always runs.

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "vmm/capabilities.hpp"
#include "vmm/provider.hpp"

namespace vmm::testing {

struct os_host_memory {
  static constexpr const char* name = "os_host";
  static location where() { return location::os_host(); }
};

struct device_memory {
  static constexpr const char* name = "device";
  static location where() { return location::device(0); }
};

struct pinned_host_memory {
  static constexpr const char* name = "pinned_host";
  static location where() { return location::pinned_host(0); }
};

using all_memory_kinds = ::testing::Types<os_host_memory, device_memory, pinned_host_memory>;
// The kinds whose memory the host may dereference directly.
using host_readable_memory_kinds = ::testing::Types<os_host_memory, pinned_host_memory>;
// The kinds whose physical memory can be exported as a file descriptor.
using exportable_memory_kinds = ::testing::Types<os_host_memory, device_memory>;

struct memory_kind_names {
  template <class Kind>
  static std::string GetName(int) {
    return Kind::name;
  }
};

// The provider for Kind, or nullptr with *skip_reason set when this machine lacks it.
template <class Kind>
std::shared_ptr<memory_provider> provider_or_skip_reason(std::string* skip_reason) {
  const location where = Kind::where();
  if (where.kind != memory_kind::os_host && !gpu_available(skip_reason)) return nullptr;
  try {
    return provider_for(where);
  } catch (const std::exception& error) {
    *skip_reason = error.what();
    return nullptr;
  }
}

// Base fixture: provider_ is ready, or the test is skipped with the reason.
template <class Kind>
class provider_test : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    provider_ = provider_or_skip_reason<Kind>(&reason);
    if (provider_ == nullptr) GTEST_SKIP() << "no " << Kind::name << " memory here: " << reason;
    granularity_ = provider_->capabilities().granularity;
  }

  std::shared_ptr<memory_provider> provider_;
  std::size_t granularity_ = 0;
};

}  // namespace vmm::testing
