#pragma once
/// @file
/// The CUDA runtime's errors in the benchmark programs, said one way: check() throws
/// bench_failure naming the call and the error; report() prints the same on stderr
/// instead, for cleanup paths (destructors, teardown after a failure). CUDA C++ only.

#include <cuda_runtime.h>
#include <errno.h>  // program_invocation_short_name

#include <cstdio>
#include <string>

#include "failure.hpp"

namespace vmm::bench {

/// "cudaErrorMemoryAllocation (out of memory)".
inline std::string describe(cudaError_t result) {
  return std::string(cudaGetErrorName(result)) + " (" + cudaGetErrorString(result) + ")";
}

/// @throws bench_failure "<call> failed: <describe(result)>" unless `result` is cudaSuccess.
inline void check(cudaError_t result, const std::string& call) {
  if (result != cudaSuccess) throw bench_failure(call + " failed: " + describe(result));
}

/// Prints "<program>: <call> failed: <error name>" unless `result` is cudaSuccess.
inline void report(cudaError_t result, const char* call) noexcept {
  if (result != cudaSuccess)
    std::fprintf(stderr, "%s: %s failed: %s\n", program_invocation_short_name, call,
                 cudaGetErrorName(result));
}

}  // namespace vmm::bench
