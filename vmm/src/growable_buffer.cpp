#include "vmm/growable_buffer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>

#include "cleanup.hpp"
#include "vmm/error.hpp"

namespace vmm {

std::size_t chunk_policy::next_chunk(std::size_t mapped, std::size_t required,
                                     std::size_t granularity) const {
  if (fixed_size_ != 0) return round_up(fixed_size_, granularity);
  const std::size_t needed = round_up(required - mapped, granularity);
  const std::size_t amortized = std::bit_floor(required / slack_divisor_);
  return std::max({needed, amortized, granularity});
}

namespace {

std::shared_ptr<chunk_pool> require(std::shared_ptr<chunk_pool> pool) {
  if (pool == nullptr) throw invalid_argument("growable_buffer: the pool is null");
  return pool;
}

growable_buffer_options checked(growable_buffer_options options, const memory_provider& provider) {
  std::size_t all_memory = provider.physical_memory_size();
  for (const auto& spill : options.spill_to) {
    if (spill == nullptr) throw invalid_argument("growable_buffer: a spill pool is null");
    if (spill->provider()->where().kind != provider.where().kind)
      throw invalid_argument(fmt::format("growable_buffer: cannot spill from {} memory to {} memory",
                                         to_string(provider.where()), to_string(spill->provider()->where())));
    all_memory += spill->provider()->physical_memory_size();
  }
  if (options.max_size == 0) options.max_size = all_memory;
  options.max_size = round_up(options.max_size, provider.granularity());
  return options;
}

}  // namespace

growable_buffer::growable_buffer(std::shared_ptr<chunk_pool> pool, growable_buffer_options options)
    : pool_(require(std::move(pool))),
      options_(checked(std::move(options), *pool_->provider())),
      range_(pool_->provider(), options_.max_size) {}

growable_buffer::growable_buffer(location where, growable_buffer_options options)
    : growable_buffer(default_pool(where), std::move(options)) {}

growable_buffer::growable_buffer(growable_buffer&& other) noexcept
    : pool_(std::move(other.pool_)),
      options_(std::move(other.options_)),
      range_(std::move(other.range_)),
      chunks_(std::move(other.chunks_)),
      retirements_(std::move(other.retirements_)),
      mapped_(std::exchange(other.mapped_, 0)),
      size_(std::exchange(other.size_, 0)) {}

growable_buffer& growable_buffer::operator=(growable_buffer&& other) noexcept {
  if (this != &other) {
    growable_buffer old(std::move(*this));  // released by old's destructor
    pool_ = std::move(other.pool_);
    options_ = std::move(other.options_);
    range_ = std::move(other.range_);
    chunks_ = std::move(other.chunks_);
    retirements_ = std::move(other.retirements_);
    mapped_ = std::exchange(other.mapped_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

growable_buffer::~growable_buffer() {
  if (chunks_.empty()) return;
  detail::cleanup("growable_buffer: release", [&] {
    retire_beyond(0);
    release_retired(true);
  });
}

std::size_t growable_buffer::active_chunks() const noexcept {
  return retirements_.empty() ? chunks_.size() : retirements_.front().first_chunk;
}

chunk_pool& growable_buffer::pool_at(std::size_t index) const {
  return index == 0 ? *pool_ : *options_.spill_to[index - 1];
}

std::vector<access_grant> growable_buffer::grants() const {
  if (!options_.access.empty()) return options_.access;
  std::vector<access_grant> result;
  for (std::size_t i = 0; i <= options_.spill_to.size(); ++i)
    for (const location& accessor : pool_at(i).provider()->default_accessors())
      if (std::none_of(result.begin(), result.end(), [&](const access_grant& g) { return g.accessor == accessor; }))
        result.push_back({accessor, access_mode::read_write});
  return result;
}

void growable_buffer::resize(std::size_t bytes) {
  if (bytes > mapped_) grow_mapping(bytes);
  size_ = bytes;
  if (bytes < mapped_) {
    retire_beyond(bytes);
    release_retired(false);
  }
}

void growable_buffer::reserve(std::size_t bytes) {
  if (bytes > mapped_) grow_mapping(bytes);
}

void growable_buffer::shrink_to_fit() {
  retire_beyond(size_);
  release_retired(false);
}

void growable_buffer::take_back_retired(std::size_t required) {
  // Retired chunks are still mapped with access: growing over them costs no driver call.
  while (mapped_ < required && !retirements_.empty()) {
    retirement& front = retirements_.front();
    mapped_ += chunks_[front.first_chunk].memory->size();
    ++front.first_chunk;
    const std::size_t end = retirements_.size() > 1 ? retirements_[1].first_chunk : chunks_.size();
    if (front.first_chunk == end) retirements_.erase(retirements_.begin());
  }
}

void growable_buffer::grow_mapping(std::size_t required) {
  if (required > range_.size())
    throw out_of_memory(fmt::format(
        "growable_buffer: {} bytes asked for, but its address range holds {} (max_size)", required,
        range_.size()));
  take_back_retired(required);
  if (mapped_ >= required) return;

  const std::size_t granularity = pool_->granularity();
  const std::uintptr_t start = range_.get() + mapped_;
  std::size_t pool_index = active_chunks() == 0 ? 0 : chunks_[active_chunks() - 1].pool_index;
  std::size_t added = 0;
  std::size_t limit = std::numeric_limits<std::size_t>::max();  // lowered when memory runs short
  std::vector<mapped_chunk> fresh;  // unmapped and given back if this grow fails
  while (mapped_ + added < required) {
    const std::size_t needed = round_up(required - mapped_ - added, granularity);
    std::size_t size = std::min({options_.policy.next_chunk(mapped_ + added, required, granularity),
                                 limit, range_.size() - mapped_ - added});
    chunk_pool& pool = pool_at(pool_index);
    pooled_chunk chunk = pool.acquire_idle(size, options_.stream);
    if (!chunk) {
      try {
        chunk = pool.acquire(size, options_.stream);
      } catch (const out_of_memory&) {
        // Fall back to the exact need, then to halves, down to the granularity; then spill
        // onto the next pool.
        if (size != granularity && !options_.policy.is_fixed()) {
          limit = size > needed ? needed : std::max(granularity, round_up(size / 2, granularity));
          continue;
        }
        if (pool_index == options_.spill_to.size()) throw;
        ++pool_index;
        limit = std::numeric_limits<std::size_t>::max();
        continue;
      }
    }
    const std::uintptr_t address = start + added;
    added += chunk.size();
    auto shared = std::make_shared<const pooled_chunk>(std::move(chunk));
    mapping view(shared->memory(), address, std::span<const access_grant>{});
    fresh.push_back({std::move(shared), std::move(view), pool_index});
  }
  // One access call over the whole new range: the driver's cost is per call and handle.
  const std::vector<access_grant> access = grants();
  pool_->provider()->set_access(start, added, access);
  chunks_.reserve(chunks_.size() + fresh.size());
  for (mapped_chunk& chunk : fresh) chunks_.push_back(std::move(chunk));
  mapped_ += added;
}

void growable_buffer::retire_beyond(std::size_t bytes) {
  std::size_t first = active_chunks();
  std::size_t end_of_first = mapped_;
  while (first > 0 && end_of_first - chunks_[first - 1].memory->size() >= bytes) {
    --first;
    end_of_first -= chunks_[first].memory->size();
  }
  if (first == active_chunks()) return;
  retirements_.insert(retirements_.begin(),
                      retirement{first, stream_event(provider(), options_.stream)});
  mapped_ = end_of_first;
}

void growable_buffer::release_retired(bool wait) {
  // From the highest addresses down: each retirement covers its chunks up to the next one's.
  while (!retirements_.empty()) {
    retirement& last = retirements_.back();
    if (wait) {
      last.passed.wait();
    } else if (!last.passed.done()) {
      return;
    }
    chunks_.erase(chunks_.begin() + static_cast<std::ptrdiff_t>(last.first_chunk), chunks_.end());
    retirements_.pop_back();
  }
}

std::vector<shared_chunk> growable_buffer::chunks(std::size_t offset, std::size_t length) const {
  if (length == 0) throw invalid_argument("growable_buffer: a chunk range of length 0");
  if (offset > mapped_ || length > mapped_ - offset)
    throw invalid_argument(fmt::format(
        "growable_buffer: chunk range [{}, +{}) runs past the {} bytes mapped", offset, length, mapped_));
  std::vector<shared_chunk> result;
  std::size_t position = 0;
  for (std::size_t i = 0; i < active_chunks() && position < offset + length; ++i) {
    const std::size_t size = chunks_[i].memory->size();
    const bool starts_inside = offset > position && offset < position + size;
    const bool ends_inside = offset + length > position && offset + length < position + size;
    if (starts_inside || ends_inside)
      throw invalid_argument(fmt::format(
          "growable_buffer: chunk range [{}, +{}) is not on chunk boundaries (chunk [{}, +{}))",
          offset, length, position, size));
    if (position >= offset) result.push_back(chunks_[i].memory);
    position += size;
  }
  return result;
}

}  // namespace vmm
