#pragma once
// What GPU test programs and their helper processes share, without GoogleTest: checked
// runtime calls, owners for streams, graphs, device and pinned memory, and a gate that holds
// a stream at a host function until it is opened (so that work queued behind it is pending
// for as long as a test needs, with no sleeping).

#include <cuda_runtime.h>

#include <cstddef>
#include <latch>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace vmm::testing {

// Throws when a runtime call fails (GoogleTest reports it as the test's failure).
inline void cuda_check(cudaError_t result, const char* call) {
  if (result != cudaSuccess)
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorName(result) + " (" +
                             cudaGetErrorString(result) + ")");
}
#define VMM_CUDA_CHECK(call) ::vmm::testing::cuda_check((call), #call)

// Selects `device` for the runtime calls of the guard's life, then GPU 0 again.
class on_device {
 public:
  explicit on_device(int device) { VMM_CUDA_CHECK(cudaSetDevice(device)); }
  on_device(const on_device&) = delete;
  on_device& operator=(const on_device&) = delete;
  ~on_device() { cudaSetDevice(0); }
};

// A non-blocking stream: no implicit order with the legacy default stream.
class cuda_stream {
 public:
  cuda_stream() { VMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  ~cuda_stream() { cudaStreamDestroy(stream_); }
  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }
  void synchronize() const { VMM_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

// cudaMalloc'd memory: what the vector's contents are compared against.
template <class T>
class device_array {
 public:
  explicit device_array(std::size_t size) : size_(size) {
    VMM_CUDA_CHECK(cudaMalloc(&data_, size * sizeof(T)));
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { cudaFree(data_); }
  [[nodiscard]] T* get() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  // The contents, after the work queued on `stream`.
  [[nodiscard]] std::vector<T> to_host(cudaStream_t stream) const {
    std::vector<T> result(size_);
    VMM_CUDA_CHECK(cudaMemcpyAsync(result.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost, stream));
    VMM_CUDA_CHECK(cudaStreamSynchronize(stream));
    return result;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_;
};

// Page-locked host memory: copies from it are truly asynchronous.
template <class T>
class pinned_array {
 public:
  explicit pinned_array(std::size_t size) : size_(size) {
    VMM_CUDA_CHECK(cudaMallocHost(&data_, size * sizeof(T)));
  }
  pinned_array(const pinned_array&) = delete;
  pinned_array& operator=(const pinned_array&) = delete;
  ~pinned_array() { cudaFreeHost(data_); }
  [[nodiscard]] std::span<T> span() const noexcept { return {data_, size_}; }

 private:
  T* data_ = nullptr;
  std::size_t size_;
};

// A captured graph, instantiated.
class cuda_graph {
 public:
  // Ends the capture begun on `stream` and instantiates what it recorded.
  explicit cuda_graph(cudaStream_t stream) {
    VMM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    VMM_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  cuda_graph(const cuda_graph&) = delete;
  cuda_graph& operator=(const cuda_graph&) = delete;
  ~cuda_graph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  void launch(cudaStream_t stream) const { VMM_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Loads `kernel` now. With lazy loading (the default since CUDA 12.2) a kernel's first
// launch loads its module, which waits for the device: launched first behind a stream_gate,
// it would wait for the gate forever. Call this for every kernel queued behind a gate.
template <class Kernel>
void load_kernel(Kernel* kernel) {
  cudaFuncAttributes attributes{};
  VMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
}

// Holds `stream` at a host function until open(): everything queued behind it stays pending,
// deterministically. The destructor opens the gate and waits for the stream, so the host
// function is done with the latch before it goes (also when an assertion ends a test early).
// Nothing queued behind it may need the device to be idle first (see load_kernel).
class stream_gate {
 public:
  explicit stream_gate(cudaStream_t stream) : stream_(stream) {
    VMM_CUDA_CHECK(cudaLaunchHostFunc(stream_, &wait_until_open, this));
  }
  stream_gate(const stream_gate&) = delete;
  stream_gate& operator=(const stream_gate&) = delete;
  ~stream_gate() {
    open();
    cudaStreamSynchronize(stream_);
  }
  void open() noexcept {
    if (!open_) latch_.count_down();
    open_ = true;
  }

 private:
  static void CUDART_CB wait_until_open(void* gate) { static_cast<stream_gate*>(gate)->latch_.wait(); }
  cudaStream_t stream_;
  std::latch latch_{1};
  bool open_ = false;
};

}  // namespace vmm::testing
