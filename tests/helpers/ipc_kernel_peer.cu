// The consumer process of tests/cuda/ipc_events_test.cu: imports GPU memory, and in each of
// two rounds reads it with a kernel ordered after the producer's writes by an interprocess
// event (vmm::ipc::handoff_consumer). It talks over the socket it inherits as descriptor 3.
//
// Round 1: acquire, queue the read kernel and the copy of its result, release, say "go"
//   (queued), then wait for the result and report it. The producer holds its own stream
//   meanwhile: only the event keeps the read after its write.
// Round 2: the same with this process's stream held by a gate until the producer says "go"
//   (it has queued its next write after this round's release): only the event keeps the
//   producer's overwrite after this read.
// Exit status: 0 when both rounds were reported, 1 on any error (printed).

#include <cuda_runtime.h>

#include <climits>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "../cuda/runtime_support.hpp"
#include "ipc_peer_protocol.hpp"
#include "vmm/ipc/handoff.hpp"
#include "vmm/ipc/importer.hpp"

namespace {

__global__ void reset(int* result) {
  result[0] = INT_MAX;
  result[1] = INT_MIN;
}

__global__ void min_max(const int* data, std::size_t n, int* result) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  int low = INT_MAX;
  int high = INT_MIN;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    low = min(low, data[i]);
    high = max(high, data[i]);
  }
  atomicMin(&result[0], low);
  atomicMax(&result[1], high);
}

class pinned_result {
 public:
  pinned_result() {
    VMM_CUDA_CHECK(cudaMallocHost(&host_, 2 * sizeof(int)));
    VMM_CUDA_CHECK(cudaMalloc(&device_, 2 * sizeof(int)));
  }
  pinned_result(const pinned_result&) = delete;
  pinned_result& operator=(const pinned_result&) = delete;
  ~pinned_result() {
    cudaFreeHost(host_);
    cudaFree(device_);
  }
  [[nodiscard]] int* host() const noexcept { return host_; }
  [[nodiscard]] int* device() const noexcept { return device_; }

 private:
  int* host_ = nullptr;
  int* device_ = nullptr;
};

// Queues the read of the whole import and the copy of its result on `stream`.
void queue_read(const vmm::ipc::imported_buffer& imported, const pinned_result& result, cudaStream_t stream) {
  reset<<<1, 1, 0, stream>>>(result.device());
  VMM_CUDA_CHECK(cudaGetLastError());
  min_max<<<128, 256, 0, stream>>>(static_cast<const int*>(imported.data()), imported.size() / sizeof(int),
                                   result.device());
  VMM_CUDA_CHECK(cudaGetLastError());
  VMM_CUDA_CHECK(
      cudaMemcpyAsync(result.host(), result.device(), 2 * sizeof(int), cudaMemcpyDeviceToHost, stream));
}

int run() {
  const int socket = vmm::testing::peer_socket_fd;
  VMM_CUDA_CHECK(cudaSetDevice(0));
  VMM_CUDA_CHECK(cudaFree(nullptr));
  // Loaded now: a kernel's first launch behind a held stream would wait for the device.
  cudaFuncAttributes attributes{};
  VMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, reset));
  VMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, min_max));
  const auto provider = vmm::provider_for(vmm::location::device(0));
  vmm::testing::cuda_stream stream;
  pinned_result result;
  vmm::ipc::imported_buffer imported =
      vmm::ipc::imported_buffer::receive(socket, {.provider = provider, .stream = stream.get()});
  vmm::ipc::handoff_consumer consumer(socket, provider);

  // Round 1: the producer's stream is held; the event orders this read after its write.
  consumer.acquire(stream.get());
  queue_read(imported, result, stream.get());
  consumer.finish(stream.get());
  vmm::testing::send_go(socket);
  VMM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  vmm::testing::send_kernel_report(socket, {result.host()[0], result.host()[1]});

  // Round 2: this stream is held; the event orders the producer's overwrite after this read.
  {
    vmm::testing::stream_gate gate(stream.get());
    consumer.acquire(stream.get());
    queue_read(imported, result, stream.get());
    consumer.finish(stream.get());
    vmm::testing::send_go(socket);
    vmm::testing::receive_go(socket);  // the producer has queued its overwrite
    gate.open();
  }
  VMM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  vmm::testing::send_kernel_report(socket, {result.host()[0], result.host()[1]});
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ipc_kernel_peer: %s\n", error.what());
    return 1;
  }
}
