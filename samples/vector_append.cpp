// vector_append: a device_vector filled from the host in batches, the way a loader or a
// stream of results would fill it. The vector grows in place: data() never moves, so no
// element is copied twice and pointers handed to kernels stay valid; each new chunk is at
// least 1/8 of the size, so the chunk count (what the driver's costs scale with) stays small.
// Runs on GPU 0 when there is one, otherwise on the OS host-memory provider: same code.

#include <fmt/format.h>

#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/device_vector.hpp"

int main() try {
  std::string why;
  const bool gpu = vmm::gpu_available(&why);
  const vmm::location where = gpu ? vmm::location::device(0) : vmm::location::os_host();
  if (!gpu) fmt::print("no GPU ({}): using the OS host-memory provider\n", why);

  // 1 GiB of address space is reserved now; memory is mapped only as the vector grows.
  vmm::device_vector<double> values(where, {.max_size = std::size_t{1} << 30});
  const double* const address = values.data();
  fmt::print("memory: {}, address {}\n", vmm::to_string(where), fmt::ptr(address));

  std::vector<double> batch(128 * 1024);  // 1 MiB a batch
  fmt::print("{:>6} {:>12} {:>12} {:>7}\n", "batch", "size", "capacity", "chunks");
  for (int i = 0; i < 100; ++i) {
    std::iota(batch.begin(), batch.end(), static_cast<double>(values.size()));
    const std::size_t capacity = values.capacity();
    values.append(batch);  // one copy on the vector's stream; maps a chunk only when full
    if (values.data() != address) {
      fmt::print(stderr, "vector_append: data() moved from {} to {}\n", fmt::ptr(address),
                 fmt::ptr(values.data()));
      return 1;
    }
    if (values.capacity() != capacity)
      fmt::print("{:>6} {:>12} {:>12} {:>7}\n", i, values.size(), values.capacity(), values.chunk_count());
  }

  // Reading back synchronizes the vector's stream.
  const std::vector<double> host = values.to_host();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < host.size(); ++i) wrong += host[i] != static_cast<double>(i);
  fmt::print("{} elements ({} MiB) in {} chunks; data() never moved; {} wrong elements\n", values.size(),
             values.size() * sizeof(double) >> 20, values.chunk_count(), wrong);
  return wrong == 0 ? 0 : 1;
} catch (const std::exception& error) {
  fmt::print(stderr, "vector_append: {}\n", error.what());
  return 1;
}
