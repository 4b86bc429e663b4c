// pool_server: a long-running server whose tasks share one chunk pool. Each task reserves
// address space for the largest input it may ever see (address space is cheap), and maps
// physical memory only while it works on a request; when it is done it shrinks to nothing
// and the memory goes back to the pool, where the next task takes it without a new
// cuMemCreate. The pool's cap bounds the whole server's memory, whatever the tasks reserve;
// the server admits as many requests at once as the cap can hold at their largest, so no
// request ever meets the cap (one that did would get vmm::out_of_memory, its buffer intact).
// Runs on GPU 0 when there is one, otherwise on the OS host-memory provider.

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <random>
#include <semaphore>
#include <thread>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"

namespace {

constexpr int tasks = 4;
constexpr int requests_per_task = 25;
constexpr std::size_t largest_chunks = 32;  // the largest request, in chunks
constexpr int admitted_at_once = 3;         // the cap holds three largest requests

// One request: grow to `bytes`, fill, check a sample of what was written, give it all back.
bool serve(vmm::growable_buffer& buffer, std::size_t bytes, std::uint8_t value) {
  buffer.resize(bytes);
  auto& provider = *buffer.provider();
  provider.executor().fill(buffer.data(), value, bytes, buffer.stream());
  std::uint8_t last = 0;
  provider.executor().copy(&last, static_cast<const std::uint8_t*>(buffer.data()) + bytes - 1, 1,
                           buffer.stream());
  provider.executor().synchronize(buffer.stream());
  buffer.resize(0);
  buffer.collect_retired();
  return last == value;
}

}  // namespace

int main() try {
  std::string why;
  const bool gpu = vmm::gpu_available(&why);
  const vmm::location where = gpu ? vmm::location::device(0) : vmm::location::os_host();
  if (!gpu) fmt::print("no GPU ({}): using the OS host-memory provider\n", why);
  auto provider = vmm::provider_for(where);
  const std::size_t g = provider->capabilities().granularity;
  const std::size_t largest = largest_chunks * g;
  const std::size_t cap = admitted_at_once * largest;
  auto pool = vmm::chunk_pool::create(provider, {.cap = cap});
  fmt::print(
      "{}: {} tasks, each reserving {} MiB of address space; pool capped at {} MiB, {} requests at once\n",
      vmm::to_string(where), tasks, largest >> 20, cap >> 20, admitted_at_once);

  std::atomic<int> served{0};
  std::atomic<bool> wrong{false};
  std::counting_semaphore<admitted_at_once> admission(admitted_at_once);
  std::vector<std::thread> workers;
  for (int t = 0; t < tasks; ++t) {
    workers.emplace_back([&, t] {
      vmm::growable_buffer buffer(pool, {.max_size = largest, .policy = vmm::chunk_policy::fixed(g)});
      std::mt19937 random(static_cast<unsigned>(t));
      for (int r = 0; r < requests_per_task; ++r) {
        const std::size_t bytes = (1 + random() % largest_chunks) * g - random() % g;
        admission.acquire();
        const bool right = serve(buffer, bytes, static_cast<std::uint8_t>(t * 31 + r));
        admission.release();
        if (!right) wrong = true;
        ++served;
      }
    });
  }
  for (auto& worker : workers) worker.join();

  const vmm::pool_statistics s = pool->statistics();
  fmt::print("served {} requests; contents {}\n", served.load(), wrong ? "WRONG" : "right");
  fmt::print("pool: {} chunks created, {} reused; reserved high {} MiB (cap {} MiB), in use now {} MiB\n",
             s.chunks_created, s.chunks_reused, s.reserved_high >> 20, cap >> 20, s.used_current >> 20);
  const bool ok = !wrong && served == tasks * requests_per_task && s.reserved_high <= cap &&
                  s.used_current == 0 && s.chunks_reused > s.chunks_created;
  return ok ? 0 : 1;
} catch (const std::exception& error) {
  fmt::print(stderr, "pool_server: {}\n", error.what());
  return 1;
}
