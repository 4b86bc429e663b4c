// replicated_table: a lookup table that every GPU reads, kept as one replica per GPU. The
// host loads it in batches (each batch one H2D copy, then peer copies along the broadcast
// tree), patches a few entries, and checks every replica. A kernel on GPU d would read
// table.view().on(d) (see vmm/replicated_buffer.hpp). With fewer than two GPUs that reach
// each other it runs on three OS host-memory providers of their own location ids instead:
// same code, and a write into a replica faults there too (the replicas are read-only).

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/provider.hpp"
#include "vmm/replicated_buffer.hpp"

namespace {

// One pool per replica: a pool per GPU when at least two GPUs reach each other, else pools
// of three OS host providers (ids 0, 1, 2).
std::vector<std::shared_ptr<vmm::chunk_pool>> replica_pools() {
  std::vector<std::shared_ptr<vmm::chunk_pool>> pools;
  std::string why;
  if (vmm::gpu_available(&why) && vmm::device_count() >= 2 && vmm::can_access_peer(0, 1) &&
      vmm::can_access_peer(1, 0)) {
    for (int d = 0; d < 2; ++d) pools.push_back(vmm::default_pool(vmm::location::device(d)));
    return pools;
  }
  fmt::print("fewer than two GPUs that reach each other ({}): replicas in OS host memory\n",
             why.empty() ? "one GPU" : why);
  for (int id = 0; id < 3; ++id)
    pools.push_back(vmm::chunk_pool::create(vmm::make_os_host_provider({.id = id})));
  return pools;
}

// The entries of one replica, read back through its provider's executor.
std::vector<std::uint64_t> read_back(const vmm::replicated_vector<std::uint64_t>& table,
                                     const vmm::chunk_pool& pool) {
  std::vector<std::uint64_t> host(table.size());
  vmm::stream_executor& executor = pool.provider()->executor();
  executor.copy(host.data(), table.data(pool.provider()->capabilities().where),
                host.size() * sizeof(std::uint64_t), {});
  executor.synchronize({});
  return host;
}

}  // namespace

int main() try {
  const auto pools = replica_pools();
  vmm::replicated_vector<std::uint64_t> table(pools, {.max_size = std::size_t{256} << 20});

  // Loading in batches: every replica grows in place (its address stays) and gets each batch.
  std::vector<std::uint64_t> batch(256 * 1024);  // 2 MiB a batch
  for (int i = 0; i < 16; ++i) {
    std::iota(batch.begin(), batch.end(), table.size());
    table.append(batch);
  }
  // A patch: entries 1000-1002 change, in every replica.
  const std::uint64_t patch[] = {7, 8, 9};
  table.update(1000, patch);
  // The reader on another stream waits for the copies (here, the legacy default stream).
  table.bytes().enqueue_wait({});

  std::size_t wrong = 0;
  for (const auto& pool : pools) {
    const std::vector<std::uint64_t> host = read_back(table, *pool);
    for (std::size_t i = 0; i < host.size(); ++i) {
      const std::uint64_t expected = i >= 1000 && i < 1003 ? patch[i - 1000] : i;
      wrong += host[i] != expected;
    }
    fmt::print("replica on {}: {} entries at {}\n", vmm::to_string(pool->provider()->capabilities().where),
               host.size(), fmt::ptr(table.data(pool->provider()->capabilities().where)));
  }
  const auto rounds = table.bytes().broadcast_plan(table.bytes().locations().front());
  fmt::print("{} replicas of {} MiB; a broadcast takes {} round(s) of peer copies; {} wrong entries\n",
             pools.size(), table.size() * sizeof(std::uint64_t) >> 20, rounds.size(), wrong);
  return wrong == 0 ? 0 : 1;
} catch (const std::exception& error) {
  fmt::print(stderr, "replicated_table: {}\n", error.what());
  return 1;
}
