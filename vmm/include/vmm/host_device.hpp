#pragma once
/// @file
/// VMM_HOST_DEVICE: marks the few inline functions that kernels call too (ring buffer and
/// stripe layout views) as host and device functions under nvcc; empty for host compilers.
///
///     struct counter_view {   // trivially copyable: passed to kernels by value
///       std::uint64_t* value;
///       VMM_HOST_DEVICE std::uint64_t get() const { return *value; }   // host and device
///     };
///
/// So one header serves a .cpp compiled by g++ and a .cu compiled by nvcc: the library
/// itself is plain C++ and never needs nvcc.

#if defined(__CUDACC__)
#define VMM_HOST_DEVICE __host__ __device__
#else
#define VMM_HOST_DEVICE
#endif
