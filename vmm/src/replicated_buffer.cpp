#include "vmm/replicated_buffer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "broadcast_plan.hpp"
#include "vmm/detail/cleanup.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/error.hpp"
#include "vmm/provider.hpp"

namespace vmm {

namespace detail {

std::vector<std::vector<replica_copy>> broadcast_rounds(std::size_t root, const push_matrix& can_push) {
  const std::size_t n = can_push.size();
  if (root >= n) throw invalid_argument(fmt::format("broadcast from replica {} of {}", root, n));
  std::vector<std::size_t> holders{root};
  std::vector<bool> has(n, false);
  has[root] = true;
  std::vector<std::vector<replica_copy>> rounds;
  while (holders.size() < n) {
    std::vector<replica_copy> round;
    std::vector<bool> targeted = has;
    for (const std::size_t from : holders) {
      // Of the replicas `from` can reach, the one that can pass the bytes on to the most that
      // nobody has reached yet (so that a chain is entered in the middle, not at an end).
      std::optional<std::size_t> best;
      std::size_t best_reach = 0;
      for (std::size_t to = 0; to < n; ++to) {
        if (targeted[to] || !can_push[from][to]) continue;
        std::size_t reach = 0;
        for (std::size_t next = 0; next < n; ++next)
          reach += !targeted[next] && next != to && can_push[to][next];
        if (!best || reach > best_reach) {
          best = to;
          best_reach = reach;
        }
      }
      if (best) {
        targeted[*best] = true;
        round.push_back({from, *best});
      }
    }
    if (round.empty())
      throw invalid_argument(fmt::format("broadcast from replica {}: {} of {} replicas cannot be reached",
                                         root, n - holders.size(), n));
    for (const replica_copy& copy : round) {
      has[copy.to] = true;
      holders.push_back(copy.to);
    }
    rounds.push_back(std::move(round));
  }
  return rounds;
}

std::optional<std::pair<std::size_t, std::size_t>> unreachable_pair(const push_matrix& can_push) {
  const std::size_t n = can_push.size();
  for (std::size_t from = 0; from < n; ++from) {
    std::vector<bool> seen(n, false);
    std::vector<std::size_t> next{from};
    seen[from] = true;
    while (!next.empty()) {
      const std::size_t at = next.back();
      next.pop_back();
      for (std::size_t to = 0; to < n; ++to)
        if (!seen[to] && can_push[at][to]) {
          seen[to] = true;
          next.push_back(to);
        }
    }
    for (std::size_t to = 0; to < n; ++to)
      if (!seen[to]) return std::pair{from, to};
  }
  return std::nullopt;
}

}  // namespace detail

namespace {

constexpr const char* name = "replicated_buffer";

// Everything that needs no driver, so that bad input is reported alike with and without one.
void check_locations(const std::vector<location>& locations, const replicated_buffer_options& options) {
  if (locations.empty()) throw invalid_argument(fmt::format("{}: no locations (a replica needs one)", name));
  options.policy.check();
  for (std::size_t i = 0; i < locations.size(); ++i) {
    const location where = locations[i];
    if (where.kind != memory_kind::device && where.kind != memory_kind::os_host)
      throw invalid_argument(fmt::format(
          "{}: {} cannot hold a replica (replicas live in GPU memory, or in OS host memory without a GPU)",
          name, to_string(where)));
    if (where.kind != locations.front().kind)
      throw invalid_argument(fmt::format(
          "{}: {} cannot be reached from {} by peer copies: the replicas of one buffer are all GPU "
          "memory or all OS host memory",
          name, to_string(where), to_string(locations.front())));
    if (where.id < 0 || where.id >= replica_table_size)
      throw invalid_argument(fmt::format("{}: {} is outside the view's table of location ids 0 to {}", name,
                                         to_string(where), replica_table_size - 1));
    for (std::size_t j = 0; j < i; ++j)
      if (locations[j] == where)
        throw invalid_argument(
            fmt::format("{}: {} is named twice (one replica per location)", name, to_string(where)));
  }
  if (options.owner && std::find(locations.begin(), locations.end(), *options.owner) == locations.end())
    throw invalid_argument(fmt::format("{}: the owner {} holds no replica", name, to_string(*options.owner)));
}

std::vector<location> locations_of(const std::vector<std::shared_ptr<chunk_pool>>& pools) {
  std::vector<location> result;
  for (const auto& pool : pools) {
    if (pool == nullptr) throw invalid_argument(fmt::format("{}: a pool is null", name));
    result.push_back(pool->provider()->capabilities().where);
  }
  return result;
}

std::vector<std::shared_ptr<chunk_pool>> default_pools(const std::vector<location>& locations,
                                                       const replicated_buffer_options& options) {
  check_locations(locations, options);
  std::vector<std::shared_ptr<chunk_pool>> pools;
  for (const location& where : locations) pools.push_back(default_pool(where));
  return pools;
}

accessor accessor_of(location where) noexcept {
  return where.kind == memory_kind::device ? accessor::device(where.id) : accessor::host();
}

bool is_host_memory(location where) noexcept {
  return where.kind == memory_kind::os_host || where.kind == memory_kind::pinned_host;
}

}  // namespace

// One replica: the user's mapping (read-only, or read-write for the owner) in a growable
// buffer, and writable aliases of its chunks over [0, capacity) for the buffer's copies.
// Members in this order: the copy stream outlives every mapping ordered after it.
struct replicated_buffer::replica {
  struct piece {
    std::size_t offset;  // where the alias starts in the replica
    chunk_view view;
  };

  replica(std::shared_ptr<chunk_pool> from, const replicated_buffer_options& options, std::size_t max_size,
          access_mode mode, std::vector<access_grant> writers)
      : pool(std::move(from)),
        executor(&pool->provider()->executor()),
        copies(*executor),
        memory(
            pool,
            growable_buffer_options{.max_size = max_size,
                                    .policy = options.policy,
                                    .stream = copies.get(),
                                    .access = {{accessor_of(pool->provider()->capabilities().where), mode}}}),
        writable_grants(std::move(writers)) {}
  replica(const replica&) = delete;
  replica& operator=(const replica&) = delete;
  // Orders the retirement of the mappings (after the copy stream) after the GPU's legacy
  // default stream too, where the user's kernels run unless told otherwise.
  ~replica() {
    detail::cleanup("replicated_buffer: ordering a replica's retirement after its GPU's default stream", [&] {
      const stream_event legacy(*executor, stream_ref());
      legacy.enqueue_wait(copies.get());
    });
  }

  // Queues copies of [offset, offset + bytes) from `source` into this replica's aliases on
  // `stream`, through `by` (an executor that reaches both).
  void write(const void* source, std::size_t offset, std::size_t bytes, stream_executor& by,
             stream_ref stream) {
    const auto* from = static_cast<const std::byte*>(source);
    for (const piece& p : pieces) {
      const std::size_t end = p.offset + p.view.size();
      if (end <= offset || p.offset >= offset + bytes) continue;
      const std::size_t lo = std::max(p.offset, offset);
      const std::size_t hi = std::min(end, offset + bytes);
      by.copy(static_cast<std::byte*>(p.view.data()) + (lo - p.offset), from + (lo - offset), hi - lo,
              stream);
    }
  }

  std::shared_ptr<chunk_pool> pool;
  stream_executor* executor;
  owned_stream copies;   // the stream this replica sends on, and grows and retires after
  stream_event arrived;  // the last copy into this replica
  growable_buffer memory;
  std::vector<access_grant> writable_grants;
  std::vector<piece> pieces;  // ascending, back to back over [0, memory.capacity())
};

replicated_buffer::replicated_buffer(std::vector<location> locations, replicated_buffer_options options)
    : replicated_buffer(default_pools(locations, options), std::move(options)) {}

replicated_buffer::replicated_buffer(std::vector<std::shared_ptr<chunk_pool>> pools,
                                     replicated_buffer_options options)
    : locations_(locations_of(pools)) {
  check_locations(locations_, options);
  const std::size_t n = pools.size();
  const bool gpus = locations_.front().kind == memory_kind::device;
  can_push_.assign(n, std::vector<bool>(n, true));
  if (gpus)
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t b = 0; b < n; ++b)
        if (a != b) can_push_[a][b] = can_access_peer(locations_[a].id, locations_[b].id);
  if (const auto pair = detail::unreachable_pair(can_push_))
    throw invalid_argument(fmt::format(
        "{}: the replica on {} cannot be reached from the one on {} by peer copies (no peer access "
        "along any path, cuDeviceCanAccessPeer)",
        name, to_string(locations_[pair->second]), to_string(locations_[pair->first])));
  std::size_t max_size = options.max_size;
  if (max_size == 0) {
    max_size = std::numeric_limits<std::size_t>::max();
    for (const auto& pool : pools)
      max_size = std::min(max_size, pool->provider()->capabilities().physical_memory_size);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const bool owns = options.owner && *options.owner == locations_[i];
    if (owns) owner_ = i;
    // Whoever pushes into this replica writes through its aliases.
    std::vector<access_grant> writers{{accessor_of(locations_[i]), access_mode::read_write}};
    if (gpus)
      for (std::size_t from = 0; from < n; ++from)
        if (from != i && can_push_[from][i])
          writers.push_back({accessor_of(locations_[from]), access_mode::read_write});
    replicas_.push_back(std::make_unique<replica>(pools[i], options, max_size,
                                                  owns ? access_mode::read_write : access_mode::read_only,
                                                  std::move(writers)));
  }
}

replicated_buffer::replicated_buffer(replicated_buffer&& other) noexcept
    : locations_(std::move(other.locations_)),
      can_push_(std::move(other.can_push_)),
      replicas_(std::move(other.replicas_)),
      owner_(std::exchange(other.owner_, std::nullopt)),
      size_(std::exchange(other.size_, 0)) {
  other.locations_.clear();
  other.can_push_.clear();
  other.replicas_.clear();
}

replicated_buffer& replicated_buffer::operator=(replicated_buffer&& other) noexcept {
  if (this != &other) {
    replicated_buffer old(std::move(*this));  // this buffer's replicas retire with `old`
    locations_ = std::exchange(other.locations_, {});
    can_push_ = std::exchange(other.can_push_, {});
    replicas_ = std::exchange(other.replicas_, {});
    owner_ = std::exchange(other.owner_, std::nullopt);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}
replicated_buffer::~replicated_buffer() = default;

std::size_t replicated_buffer::index_of(location where) const {
  const auto it = std::find(locations_.begin(), locations_.end(), where);
  if (it == locations_.end())
    throw invalid_argument(fmt::format("{}: no replica lives at {}", name, to_string(where)));
  return static_cast<std::size_t>(it - locations_.begin());
}

const void* replicated_buffer::data(location where) const {
  return replicas_[index_of(where)]->memory.data();
}

void* replicated_buffer::owner_data() const {
  if (!owner_) throw invalid_argument(fmt::format("{}: owner_data() of a buffer without an owner", name));
  return replicas_[*owner_]->memory.data();
}

std::optional<location> replicated_buffer::owner() const noexcept {
  if (!owner_) return std::nullopt;
  return locations_[*owner_];
}

std::size_t replicated_buffer::capacity() const noexcept {
  if (replicas_.empty()) return 0;
  std::size_t result = std::numeric_limits<std::size_t>::max();
  for (const auto& r : replicas_) result = std::min(result, r->memory.capacity());
  return result;
}

std::size_t replicated_buffer::max_size() const noexcept {
  if (replicas_.empty()) return 0;
  std::size_t result = std::numeric_limits<std::size_t>::max();
  for (const auto& r : replicas_) result = std::min(result, r->memory.max_size());
  return result;
}

void replicated_buffer::fill_table(std::uintptr_t (&table)[replica_table_size]) const noexcept {
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    table[static_cast<std::size_t>(locations_[i].id)] =
        reinterpret_cast<std::uintptr_t>(replicas_[i]->memory.data());
}

std::vector<std::vector<replica_copy>> replicated_buffer::broadcast_plan(location root) const {
  return detail::broadcast_rounds(index_of(root), can_push_);
}

std::size_t replicated_buffer::root_for(std::size_t offset, std::size_t bytes, const update_source& source,
                                        std::size_t size) const {
  if (replicas_.empty()) throw invalid_argument(fmt::format("{}: update of a moved-from buffer", name));
  if (offset > size || bytes > size - offset)
    throw invalid_argument(
        fmt::format("{}: update of [{}, {} + {}) passes the size {}", name, offset, offset, bytes, size));
  if (bytes > source.size)
    throw invalid_argument(
        fmt::format("{}: update of {} bytes from a source of {} bytes", name, bytes, source.size));
  if (bytes > 0 && source.data == nullptr)
    throw invalid_argument(fmt::format("{}: the source is null", name));
  const bool gpus = locations_.front().kind == memory_kind::device;
  if (is_host_memory(source.where)) return 0;
  if (source.where.kind == memory_kind::device && gpus) {
    const auto it = std::find(locations_.begin(), locations_.end(), source.where);
    if (it != locations_.end()) return static_cast<std::size_t>(it - locations_.begin());
    throw invalid_argument(
        fmt::format("{}: the source is memory of {}, which holds no replica (copy it to a "
                    "replica's GPU first)",
                    name, to_string(source.where)));
  }
  throw invalid_argument(fmt::format("{}: a source in {} cannot update replicas in {}", name,
                                     to_string(source.where), to_string(locations_.front())));
}

void replicated_buffer::update(std::size_t offset, std::size_t bytes, const update_source& source,
                               stream_ref stream) {
  const std::size_t root = root_for(offset, bytes, source, size_);
  if (bytes > 0) broadcast(root, source.data, offset, bytes, stream);
}

void replicated_buffer::publish(std::size_t offset, std::size_t bytes, stream_ref stream) {
  if (!owner_) throw invalid_argument(fmt::format("{}: publish() of a buffer without an owner", name));
  if (offset > size_ || bytes > size_ - offset)
    throw invalid_argument(
        fmt::format("{}: publish of [{}, {} + {}) passes the size {}", name, offset, offset, bytes, size_));
  if (bytes > 0) broadcast(*owner_, nullptr, offset, bytes, stream);
}

void replicated_buffer::broadcast(std::size_t root, const void* from, std::size_t offset, std::size_t bytes,
                                  stream_ref stream) {
  replica& first = *replicas_[root];
  // After the last broadcast's copies, whatever stream that one was queued on: this one
  // overwrites what they read and wrote.
  for (const auto& r : replicas_) r->arrived.enqueue_wait(stream, *first.executor);
  if (from != nullptr) first.write(from, offset, bytes, *first.executor, stream);
  first.arrived = stream_event(*first.executor, stream);
  for (const std::vector<replica_copy>& round : detail::broadcast_rounds(root, can_push_)) {
    for (const replica_copy& copy : round) {
      replica& sender = *replicas_[copy.from];
      replica& receiver = *replicas_[copy.to];
      sender.arrived.enqueue_wait(sender.copies.get(), *sender.executor);
      // The sender reads its own replica through its user mapping (readable by its GPU).
      receiver.write(static_cast<const std::byte*>(sender.memory.data()) + offset, offset, bytes,
                     *sender.executor, sender.copies.get());
      // Recorded by the sender's executor: an event lives in the context of its stream.
      receiver.arrived = stream_event(*sender.executor, sender.copies.get());
    }
  }
  for (const auto& r : replicas_) r->arrived.enqueue_wait(stream, *first.executor);
}

void replicated_buffer::enqueue_wait(stream_ref stream) const {
  for (const auto& r : replicas_) r->arrived.enqueue_wait(stream, *replicas_.front()->executor);
}

void replicated_buffer::enqueue_wait(location where, stream_ref stream) const {
  const replica& r = *replicas_[index_of(where)];
  r.arrived.enqueue_wait(stream, *r.executor);
}

template <class Write>
void replicated_buffer::grow_to(std::size_t bytes, Write&& write) {
  if (replicas_.empty()) throw invalid_argument(fmt::format("{}: growth of a moved-from buffer", name));
  if (bytes > max_size())
    throw out_of_memory(fmt::format("{}: {} bytes asked for, but a replica holds at most {} (max_size)", name,
                                    bytes, max_size()));
  // Each replica grows with its own strong guarantee; the rollbacks retire again what the
  // replicas before a failure mapped, and the new aliases go with them, unless all succeed.
  std::vector<std::unique_ptr<detail::capacity_rollback>> rollbacks;
  std::vector<std::optional<replica::piece>> added;
  rollbacks.reserve(replicas_.size());
  added.reserve(replicas_.size());
  for (const auto& r : replicas_) {
    rollbacks.push_back(std::make_unique<detail::capacity_rollback>(r->memory, r->copies.get()));
    added.emplace_back();
    const std::size_t before = r->memory.capacity();
    if (bytes > before) r->memory.reserve(bytes, r->copies.get());
    const std::size_t after = r->memory.capacity();
    if (after > before)
      added.back() = replica::piece{
          before, alias(r->memory, before, after - before, r->writable_grants, r->copies.get())};
  }
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (added[i]) replicas_[i]->pieces.reserve(replicas_[i]->pieces.size() + 1);
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (added[i]) replicas_[i]->pieces.push_back(std::move(*added[i]));
  try {
    std::forward<Write>(write)();
  } catch (...) {
    for (std::size_t i = 0; i < replicas_.size(); ++i)
      if (added[i]) replicas_[i]->pieces.pop_back();  // the rollbacks retire their chunks
    throw;
  }
  for (const auto& rollback : rollbacks) rollback->dismiss();
}

void replicated_buffer::resize(std::size_t bytes) {
  grow_to(bytes, [] {});
  size_ = bytes;
}

void replicated_buffer::reserve(std::size_t bytes) {
  grow_to(bytes, [] {});
}

void replicated_buffer::append(const update_source& source, stream_ref stream) {
  if (source.size > max_size() - std::min(size_, max_size()))
    throw out_of_memory(
        fmt::format("{}: {} + {} bytes pass max_size {}", name, size_, source.size, max_size()));
  const std::size_t end = size_ + source.size;
  const std::size_t root = root_for(size_, source.size, source, end);  // checks before any growth
  if (source.size == 0) return;
  grow_to(end, [&] { broadcast(root, source.data, size_, source.size, stream); });
  size_ = end;
}

}  // namespace vmm
