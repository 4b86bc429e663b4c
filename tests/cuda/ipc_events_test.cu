// Stream-ordered hand-off of GPU memory between two processes with interprocess events
// (vmm::ipc::handoff_producer here, handoff_consumer in tests/helpers/ipc_kernel_peer.cu):
// a kernel in the consumer reads what a kernel here wrote, and nothing but the events
// orders them. Each round holds one side's stream at a gate while the other side queues
// its work, so that an event that did not order anything would show as stale data:
//  - round 1 holds the producer's stream: the consumer's read must wait for the write;
//  - round 2 holds the consumer's stream: the producer's overwrite must wait for the read.

#include <climits>
#include <vector>

#include "../helpers/ipc_peer_protocol.hpp"
#include "cuda_support.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/ipc/exporter.hpp"
#include "vmm/ipc/handoff.hpp"

namespace vmm::testing {
namespace {

__global__ void fill_ints(int* target, std::size_t n, int value) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) target[i] = value;
}

class ipc_events : public gpu_test {
 protected:
  void SetUp() override {
    gpu_test::SetUp();
    if (IsSkipped()) return;
    load_kernel(fill_ints);
    provider_ = provider_for(location::device(0));
  }
  std::shared_ptr<memory_provider> provider_;
};

TEST_F(ipc_events, a_kernel_in_another_process_reads_what_a_kernel_here_wrote_in_stream_order) {
  const std::size_t g = provider_->capabilities().granularity;
  cuda_stream stream;
  growable_buffer buffer(chunk_pool::create(provider_, {.release_threshold = 0}),
                         {.max_size = 8 * g, .policy = chunk_policy::fixed(g), .stream = stream.get()});
  buffer.resize(2 * g);  // two chunks, so that the import maps more than one handle
  int* data = static_cast<int*>(buffer.data());
  const std::size_t n = buffer.size() / sizeof(int);
  fill_ints<<<128, 256, 0, stream.get()>>>(data, n, -1);
  VMM_CUDA_CHECK(cudaGetLastError());
  stream.synchronize();

  peer_process peer({VMM_IPC_KERNEL_PEER_PATH});
  ipc::exporter exporter;
  ipc::send_manifest(peer.socket(), exporter.export_buffer(buffer));
  ipc::handoff_producer producer(peer.socket(), provider_);

  // Round 1: this stream is held while the consumer queues its read behind `ready`.
  {
    stream_gate gate(stream.get());
    fill_ints<<<128, 256, 0, stream.get()>>>(data, n, 1001);
    VMM_CUDA_CHECK(cudaGetLastError());
    producer.publish(stream.get());
    producer.wait_consumed(stream.get());
    receive_go(peer.socket());  // the consumer's read is queued
    gate.open();
  }
  const kernel_peer_report first = receive_kernel_report(peer.socket());
  EXPECT_EQ(first.min, 1001);
  EXPECT_EQ(first.max, 1001);

  // Round 2: the consumer's stream is held; the overwrite queued here after wait_consumed
  // must not run before the consumer's read.
  fill_ints<<<128, 256, 0, stream.get()>>>(data, n, 2002);
  VMM_CUDA_CHECK(cudaGetLastError());
  producer.publish(stream.get());
  producer.wait_consumed(stream.get());
  receive_go(peer.socket());  // the consumer's read is queued behind its gate
  fill_ints<<<128, 256, 0, stream.get()>>>(data, n, 3003);
  VMM_CUDA_CHECK(cudaGetLastError());
  send_go(peer.socket());  // the consumer opens its gate
  const kernel_peer_report second = receive_kernel_report(peer.socket());
  EXPECT_EQ(second.min, 2002);
  EXPECT_EQ(second.max, 2002);
  EXPECT_TRUE(exited_cleanly(peer.wait()));

  std::vector<int> after(n);
  VMM_CUDA_CHECK(cudaMemcpyAsync(after.data(), data, n * sizeof(int), cudaMemcpyDeviceToHost, stream.get()));
  stream.synchronize();
  EXPECT_EQ(after, std::vector<int>(n, 3003));
  EXPECT_EQ(producer.rounds(), 2u);
}

}  // namespace
}  // namespace vmm::testing
