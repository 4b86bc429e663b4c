// The kernels of samples/store_share.cpp: the producer's fill and the consumers' check, on
// memory a vmm-store buffer maps (GPU memory of GPU 0, readable by every GPU it grants).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace {

__host__ __device__ std::uint32_t value(std::size_t i, std::uint32_t seed) {
  return static_cast<std::uint32_t>(i * 2654435761u) ^ seed;
}

__global__ void fill_kernel(std::uint32_t* data, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    data[i] = value(i, seed);
}

__global__ void check_kernel(const std::uint32_t* data, std::size_t n, std::uint32_t seed,
                             unsigned long long* wrong) {
  unsigned long long mine = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    mine += data[i] != value(i, seed) ? 1 : 0;
  if (mine != 0) atomicAdd(wrong, mine);
}

void check(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
}

}  // namespace

void fill_on_gpu(std::uint32_t* data, std::size_t n, std::uint32_t seed) {
  check(cudaSetDevice(0), "cudaSetDevice");
  fill_kernel<<<256, 256>>>(data, n, seed);
  check(cudaGetLastError(), "fill kernel launch");
  check(cudaDeviceSynchronize(), "fill kernel");
}

std::size_t mismatches_on_gpu(const std::uint32_t* data, std::size_t n, std::uint32_t seed, int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  unsigned long long* wrong = nullptr;
  check(cudaMalloc(&wrong, sizeof *wrong), "cudaMalloc");
  check(cudaMemset(wrong, 0, sizeof *wrong), "cudaMemset");
  check_kernel<<<256, 256>>>(data, n, seed, wrong);
  check(cudaGetLastError(), "check kernel launch");
  unsigned long long host = 0;
  check(cudaMemcpy(&host, wrong, sizeof host, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaFree(wrong), "cudaFree");
  return static_cast<std::size_t>(host);
}
