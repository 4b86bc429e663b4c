#pragma once
/// @file
/// VMM_HOST_DEVICE: marks the few inline functions that kernels call too (ring buffer and
/// stripe layout views) as host and device functions under nvcc; empty for host compilers.

#if defined(__CUDACC__)
#define VMM_HOST_DEVICE __host__ __device__
#else
#define VMM_HOST_DEVICE
#endif
