#include "vmm/chunk_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "vmm/detail/cleanup.hpp"
#include "vmm/error.hpp"
#include "vmm/retirement.hpp"

namespace vmm {

void pooled_chunk::return_to_pool(bool ordered, stream_ref stream) noexcept {
  if (pool_ == nullptr) return;
  std::shared_ptr<chunk_pool> pool = std::move(pool_);
  pool->give_back(std::move(memory_), ordered, stream, discarded_.exchange(false));
}

pooled_chunk& pooled_chunk::operator=(pooled_chunk&& other) noexcept {
  if (this != &other) {
    return_to_pool(false, {});
    pool_ = std::move(other.pool_);
    memory_ = std::move(other.memory_);
    discarded_ = other.discarded_.exchange(false);
  }
  return *this;
}

pooled_chunk::~pooled_chunk() {
  return_to_pool(false, {});
}

void pooled_chunk::give_back(stream_ref stream) {
  if (pool_ == nullptr) throw invalid_argument("pooled_chunk: give_back of an empty chunk");
  return_to_pool(true, stream);
}

std::shared_ptr<chunk_pool> chunk_pool::create(std::shared_ptr<memory_provider> provider,
                                               chunk_pool_options options) {
  if (provider == nullptr) throw invalid_argument("chunk_pool: the provider is null");
  return std::make_shared<chunk_pool>(private_tag{}, std::move(provider), options);
}

chunk_pool::chunk_pool(private_tag, std::shared_ptr<memory_provider> provider, chunk_pool_options options)
    : provider_(std::move(provider)), options_(options) {}

chunk_pool::~chunk_pool() = default;  // idle chunks destroy themselves

chunk_pool::idle_map::iterator chunk_pool::find_usable(idle_map::iterator first, idle_map::iterator last,
                                                       std::optional<stream_ref> stream) const {
  // Same stream first: no waiting. Then any chunk whose giving stream has moved on.
  for (auto it = first; it != last; ++it)
    if (!it->second.ordered || (stream && it->second.stream == *stream)) return it;
  for (auto it = first; it != last; ++it)
    if (it->second.ready.done()) return it;
  return last;
}

pooled_chunk chunk_pool::lend(idle_map::iterator it) {
  physical_allocation memory = std::move(it->second.memory);
  idle_.erase(it);
  statistics_.used_current += memory.size();
  ++statistics_.chunks_reused;
  note_usage();
  return pooled_chunk(shared_from_this(), std::move(memory));
}

pooled_chunk chunk_pool::create_counted(std::size_t size) {
  try {
    physical_allocation memory(provider_, size);
    std::lock_guard lock(mutex_);
    ++statistics_.chunks_created;
    return pooled_chunk(shared_from_this(), std::move(memory));
  } catch (...) {
    std::lock_guard lock(mutex_);
    statistics_.reserved_current -= size;
    statistics_.used_current -= size;
    throw;
  }
}

pooled_chunk chunk_pool::acquire(std::size_t size, stream_ref stream) {
  return acquire_for(size, stream);
}

pooled_chunk chunk_pool::acquire(std::size_t size, any_stream_t) {
  return acquire_for(size, std::nullopt);
}

pooled_chunk chunk_pool::acquire_for(std::size_t size, std::optional<stream_ref> stream) {
  if (size == 0) throw invalid_argument("chunk_pool: acquire of 0 bytes");
  size = round_up(size, granularity());
  // Memory retired in stream order and now unused may come back to this pool: collect it
  // before creating fresh memory.
  collect_retired(false);
  for (int attempt = 0;; ++attempt) {
    std::vector<physical_allocation> evicted;  // destroyed after the lock is dropped
    {
      std::lock_guard lock(mutex_);
      auto [first, last] = idle_.equal_range(size);
      if (auto it = find_usable(first, last, stream); it != last) return lend(it);
      if (size > options_.cap || statistics_.reserved_current > options_.cap - size) {
        evicted = evict_until(options_.cap > size ? options_.cap - size : 0);
        if (statistics_.reserved_current + size > options_.cap)
          throw out_of_memory(fmt::format(
              "chunk_pool on {}: a chunk of {} bytes would pass the cap of {} bytes ({} reserved, {} "
              "in use)",
              to_string(provider_->capabilities().where), size, options_.cap, statistics_.reserved_current,
              statistics_.used_current));
      }
      // Counted now, so that concurrent requests cannot pass the cap together.
      statistics_.reserved_current += size;
      statistics_.used_current += size;
      note_usage();
    }
    evicted.clear();
    try {
      return create_counted(size);
    } catch (const out_of_memory&) {
      if (attempt > 0) throw;
      // The memory is full: wait for what was retired in stream order, give back what sits
      // idle here, and try once more.
      collect_retired(true);
      std::lock_guard lock(mutex_);
      evicted = evict_until(0);
    }
  }
}

pooled_chunk chunk_pool::acquire_idle(std::size_t max_size, stream_ref stream) {
  return acquire_idle_for(max_size, stream);
}

pooled_chunk chunk_pool::acquire_idle(std::size_t max_size, any_stream_t) {
  return acquire_idle_for(max_size, std::nullopt);
}

pooled_chunk chunk_pool::acquire_idle_for(std::size_t max_size, std::optional<stream_ref> stream) {
  std::lock_guard lock(mutex_);
  auto end = idle_.upper_bound(max_size);
  // Largest first: walk the sizes downwards.
  while (end != idle_.begin()) {
    const std::size_t size = std::prev(end)->first;
    auto first = idle_.lower_bound(size);
    if (auto it = find_usable(first, end, stream); it != end) return lend(it);
    end = first;
  }
  return {};
}

void chunk_pool::give_back(physical_allocation memory, bool ordered, stream_ref stream,
                           bool discarded) noexcept {
  if (!memory) return;
  const std::size_t size = memory.size();
  std::vector<physical_allocation> evicted;
  if (!discarded) {
    detail::cleanup("chunk_pool: give_back", [&] {
      stream_event ready = ordered ? stream_event(provider_->executor(), stream) : stream_event();
      std::lock_guard lock(mutex_);
      // Piecewise: `memory` moves into the map's node only once the node exists, so a
      // failed allocation leaves it here, to be destroyed and uncounted below.
      idle_.emplace(std::piecewise_construct, std::forward_as_tuple(size),
                    std::forward_as_tuple(std::move(memory), stream, ordered, std::move(ready)));
      statistics_.used_current -= size;
      if (statistics_.reserved_current > options_.release_threshold)
        evicted = evict_until(options_.release_threshold);
    });
  }
  // Discarded, or taking it back failed: the memory is destroyed here, and the books say so.
  if (memory) {
    memory.reset();
    std::lock_guard lock(mutex_);
    statistics_.used_current -= size;
    statistics_.reserved_current -= size;
    ++statistics_.chunks_released;
  }
}

std::vector<physical_allocation> chunk_pool::evict_until(std::size_t target) {
  std::vector<physical_allocation> evicted;
  // Largest first: fewest handles destroyed for the bytes.
  for (auto it = idle_.end(); it != idle_.begin() && statistics_.reserved_current > target;) {
    --it;
    if (it->second.ordered && !it->second.ready.done()) continue;
    statistics_.reserved_current -= it->first;
    ++statistics_.chunks_released;
    evicted.push_back(std::move(it->second.memory));
    it = idle_.erase(it);
  }
  return evicted;
}

void chunk_pool::note_usage() {
  statistics_.reserved_high = std::max(statistics_.reserved_high, statistics_.reserved_current);
  statistics_.used_high = std::max(statistics_.used_high, statistics_.used_current);
}

void chunk_pool::trim_to(std::size_t bytes_to_keep) {
  std::vector<physical_allocation> evicted;
  std::lock_guard lock(mutex_);
  evicted = evict_until(bytes_to_keep);
}

pool_statistics chunk_pool::statistics() const {
  std::lock_guard lock(mutex_);
  return statistics_;
}

void chunk_pool::reset_high_water_marks() {
  std::lock_guard lock(mutex_);
  statistics_.reserved_high = statistics_.reserved_current;
  statistics_.used_high = statistics_.used_current;
}

void chunk_pool::set_release_threshold(std::size_t bytes) {
  std::vector<physical_allocation> evicted;
  std::lock_guard lock(mutex_);
  options_.release_threshold = bytes;
  if (statistics_.reserved_current > bytes) evicted = evict_until(bytes);
}

void chunk_pool::set_cap(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  options_.cap = bytes;
}

chunk_pool_options chunk_pool::options() const {
  std::lock_guard lock(mutex_);
  return options_;
}

std::shared_ptr<chunk_pool> default_pool(location where) {
  static auto* const pools = new std::map<location, std::shared_ptr<chunk_pool>>();
  static auto* const mutex = new std::mutex();
  std::lock_guard lock(*mutex);
  auto& pool = (*pools)[where];
  if (pool == nullptr) pool = chunk_pool::create(provider_for(where));
  return pool;
}

}  // namespace vmm
