#pragma once
// What the GPU tests share: runtime_support.hpp, and a fixture that skips with the reason
// where there is no GPU.

#include <gtest/gtest.h>

#include <string>

#include "runtime_support.hpp"
#include "vmm/capabilities.hpp"

namespace vmm::testing {

// Every test here needs GPU 0 and a CUDA runtime that can start on it.
class gpu_test : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "no GPU here: " << why;
    // Starts the runtime on GPU 0's primary context, the one vmm's driver layer uses.
    const cudaError_t started = cudaSetDevice(0);
    if (started == cudaErrorInsufficientDriver)
      GTEST_SKIP() << "the driver is older than the CUDA runtime these tests were built with: "
                   << cudaGetErrorString(started);
    cuda_check(started, "cudaSetDevice(0)");
    VMM_CUDA_CHECK(cudaFree(nullptr));
  }
};

}  // namespace vmm::testing
