// ring_records: variable-length records through a doubly mapped ring buffer on the GPU.
//
// A producer kernel writes records of uneven lengths into a vmm::ring_buffer; many of them
// straddle the wrap point. A consumer kernel reads each one through a plain pointer, as if
// the ring were a flat array (the memory behind [C, 2C) is the memory behind [0, C)), and
// stores the record's length and a checksum of its bytes. The host then checks every
// record against what the producer was meant to write.
//
// Producer and consumer alternate kernel launches on one stream: the coherency rule of
// vmm/chunk_view.hpp (aliases agree across kernel launches, not within a grid) holds, and
// the head/tail counters in the ring's control block carry the state from launch to launch.
// On a machine without a GPU it prints one line saying so and exits 0.

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/ring_buffer.hpp"

namespace {

constexpr std::uint32_t record_count = 20000;
constexpr std::uint32_t header_bytes = 8;  // {length, id}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

__host__ __device__ std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return x ^ (x >> 33);
}

// Mostly small records, now and then a large one (up to an eighth of the ring).
__host__ __device__ std::uint32_t record_length(std::uint32_t id, std::uint64_t capacity) {
  const std::uint64_t r = mix(id + 1);
  const std::uint64_t limit = (r & 15) == 0 ? capacity / 8 : 4096;
  return header_bytes + static_cast<std::uint32_t>((r >> 8) % limit);
}

__host__ __device__ std::uint8_t payload_byte(std::uint32_t id, std::uint32_t j) {
  return static_cast<std::uint8_t>(mix((std::uint64_t{id} << 32) | j) >> 56);
}

// Order-independent, so that a block can sum it in parallel.
__host__ __device__ std::uint64_t byte_term(std::uint32_t j, std::uint8_t byte) {
  return mix((std::uint64_t{j} << 8) | byte);
}

// One block: thread 0 runs the single-producer side of the protocol, the block writes.
__global__ void produce(vmm::ring_buffer_view ring, std::uint32_t first, std::uint32_t* next) {
  __shared__ std::byte* place;
  for (std::uint32_t id = first; id < record_count; ++id) {
    const std::uint32_t length = record_length(id, ring.capacity);
    if (threadIdx.x == 0) place = ring.reserve(length);  // nullptr: the ring is full
    __syncthreads();
    std::byte* const target = place;
    __syncthreads();
    if (target == nullptr) {
      if (threadIdx.x == 0) *next = id;
      return;
    }
    // A plain pointer: the record is contiguous even where it runs past the wrap point.
    auto* bytes = reinterpret_cast<std::uint8_t*>(target);
    if (threadIdx.x == 0) {
      const std::uint32_t header[2] = {length, id};
      memcpy(bytes, header, sizeof header);
    }
    for (std::uint32_t j = threadIdx.x; j < length - header_bytes; j += blockDim.x)
      bytes[header_bytes + j] = payload_byte(id, j);
    __syncthreads();  // the whole record is written before it is published
    if (threadIdx.x == 0) {
      __threadfence();
      ring.publish(length);
    }
  }
  if (threadIdx.x == 0) *next = record_count;
}

struct record_seen {
  std::uint32_t length;
  std::uint32_t straddled;  // 1 when the record ran past the wrap point
  std::uint64_t checksum;
};

// One block: thread 0 runs the single-consumer side, the block sums each record's bytes.
__global__ void consume(vmm::ring_buffer_view ring, record_seen* seen) {
  __shared__ const std::byte* place;
  __shared__ std::uint32_t header[2];
  __shared__ unsigned long long sum;
  for (;;) {
    if (threadIdx.x == 0) {
      place = ring.peek(header_bytes);
      if (place != nullptr) {
        memcpy(header, place, sizeof header);
        place = ring.peek(header[0]);
      }
      sum = 0;
    }
    __syncthreads();
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(place);
    if (bytes == nullptr) return;
    const std::uint32_t length = header[0];
    const std::uint32_t id = header[1];
    std::uint64_t local = 0;
    for (std::uint32_t j = threadIdx.x; j < length - header_bytes; j += blockDim.x)
      local += byte_term(j, bytes[header_bytes + j]);
    atomicAdd(&sum, static_cast<unsigned long long>(local));
    __syncthreads();
    if (threadIdx.x == 0) {
      if (id < record_count)
        seen[id] = {length, *ring.tail % ring.capacity + length > ring.capacity ? 1u : 0u, sum};
      ring.consume(length);  // only now may the producer overwrite the bytes
    }
    __syncthreads();
  }
}

int run() {
  std::string why;
  if (!vmm::gpu_available(&why)) {
    std::printf("ring_records: no GPU here (%s); nothing to run\n", why.c_str());
    return 0;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  const vmm::location where = vmm::location::device(0);
  const std::size_t capacity = 4 * vmm::provider_for(where)->capabilities().granularity;
  std::uint64_t straddled = 0;
  int rounds = 0;
  std::vector<record_seen> seen(record_count);
  double seconds = 0;
  std::uint64_t head = 0;
  {
    vmm::ring_buffer ring(where, capacity, {.stream = stream});
    std::printf("ring of %zu MiB at %p; its second copy at %p aliases the first\n", capacity >> 20,
                static_cast<void*>(ring.data()), static_cast<void*>(ring.data() + capacity));
    record_seen* device_seen = nullptr;
    std::uint32_t* next = nullptr;
    check(cudaMalloc(&device_seen, record_count * sizeof(record_seen)), "cudaMalloc");
    check(cudaMalloc(&next, sizeof *next), "cudaMalloc");
    check(cudaMemsetAsync(device_seen, 0, record_count * sizeof(record_seen), stream), "cudaMemset");

    const auto start = std::chrono::steady_clock::now();
    std::uint32_t produced = 0;
    while (produced < record_count) {
      produce<<<1, 256, 0, stream>>>(ring.view(), produced, next);
      consume<<<1, 256, 0, stream>>>(ring.view(), device_seen);
      check(cudaGetLastError(), "kernel launch");
      check(cudaMemcpyAsync(&produced, next, sizeof produced, cudaMemcpyDeviceToHost, stream), "cudaMemcpy");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      ++rounds;
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    check(cudaMemcpy(seen.data(), device_seen, record_count * sizeof(record_seen), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
    head = ring.head();
    if (ring.tail() != head) throw std::runtime_error("the consumer left records in the ring");
    check(cudaFree(device_seen), "cudaFree");
    check(cudaFree(next), "cudaFree");
  }  // the ring waits for its stream, then unmaps both copies

  // Every record: its length, and a checksum of the bytes the consumer read.
  std::uint64_t bytes = 0;
  for (std::uint32_t id = 0; id < record_count; ++id) {
    const std::uint32_t length = record_length(id, capacity);
    std::uint64_t sum = 0;
    for (std::uint32_t j = 0; j < length - header_bytes; ++j) sum += byte_term(j, payload_byte(id, j));
    if (seen[id].length != length || seen[id].checksum != sum) {
      std::fprintf(stderr, "record %u: length %u checksum %016llx, expected %u and %016llx\n", id,
                   seen[id].length, static_cast<unsigned long long>(seen[id].checksum), length,
                   static_cast<unsigned long long>(sum));
      return 1;
    }
    straddled += seen[id].straddled;
    bytes += length;
  }
  if (bytes != head) throw std::runtime_error("the head is not the sum of the record lengths");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  std::printf("%u records, %.1f MiB (%.1f laps of the ring) in %d producer/consumer rounds, %.1f ms\n",
              record_count, static_cast<double>(bytes) / (1 << 20),
              static_cast<double>(bytes) / static_cast<double>(capacity), rounds, seconds * 1e3);
  std::printf("%llu records straddled the wrap point and were read through plain pointers; all %u checked\n",
              static_cast<unsigned long long>(straddled), record_count);
  return straddled > 0 ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ring_records: %s\n", error.what());
    return 1;
  }
}
