#include "vmm/growable_buffer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>

#include "vmm/detail/cleanup.hpp"
#include "growth_worker.hpp"
#include "vmm/error.hpp"

namespace vmm {

std::size_t chunk_policy::next_chunk(std::size_t mapped, std::size_t required,
                                     std::size_t granularity) const {
  check();
  if (fixed_) return round_up(parameter_, granularity);
  const std::size_t needed = round_up(required - mapped, granularity);
  const std::size_t amortized = std::bit_floor(required / parameter_);
  const std::size_t largest = std::max(largest_ / granularity * granularity, granularity);
  return std::min(std::max({needed, amortized, granularity}), largest);
}

// A chunk smaller than the need is the policy's largest, and so is every chunk until the
// last: those are counted at once, so that a request of any size costs a few steps.
std::size_t chunk_policy::capacity_after(std::size_t mapped, std::size_t required, std::size_t granularity,
                                         std::size_t max_size) const {
  std::size_t capacity = mapped;
  while (capacity < required && capacity < max_size) {
    const std::size_t step = next_chunk(capacity, required, granularity);
    const std::size_t needed = round_up(required - capacity, granularity);
    if (step < needed) {
      const std::size_t before_last = (needed - 1) / step;
      capacity = before_last > (max_size - capacity) / step ? max_size : capacity + before_last * step;
      continue;
    }
    capacity += std::min(step, max_size - capacity);
  }
  return capacity;
}

void chunk_policy::check() const {
  if (parameter_ == 0)
    throw invalid_argument(fixed_ ? "chunk_policy::fixed(0): a chunk size must be at least 1 byte"
                                  : "chunk_policy::geometric(0): the slack divisor must be at least 1");
  if (largest_ == 0)
    throw invalid_argument("chunk_policy::geometric(divisor, 0): the largest chunk must be at least 1 byte");
}

namespace {

std::shared_ptr<chunk_pool> require(std::shared_ptr<chunk_pool> pool) {
  if (pool == nullptr) throw invalid_argument("growable_buffer: the pool is null");
  return pool;
}

bool is_host_grant(const access_grant& grant) noexcept {
  return grant.who.kind == accessor::kind_type::host;
}

growable_buffer_options checked(growable_buffer_options options, const memory_provider& provider) {
  options.policy.check();
  const memory_kind first = provider.capabilities().where.kind;
  if (options.spill_to_host) {
    if (first != memory_kind::device)
      throw invalid_argument(
          fmt::format("growable_buffer: spill_to_host continues GPU memory in pinned host memory, but the "
                      "buffer's memory is {} (a buffer of host memory has nowhere further to spill)",
                      to_string(provider.capabilities().where)));
    options.spill_to.push_back(default_pool(location::pinned_host(0)));
    options.spill_to_host = false;
  }
  std::size_t all_memory = provider.capabilities().physical_memory_size;
  bool host_part = false;
  for (const auto& spill : options.spill_to) {
    if (spill == nullptr) throw invalid_argument("growable_buffer: a spill pool is null");
    const memory_provider& other = *spill->provider();
    const memory_kind kind = other.capabilities().where.kind;
    // GPU onto GPU (peer memory), or GPU onto pinned host memory, which then comes last.
    if (first == memory_kind::device && kind == memory_kind::pinned_host) {
      host_part = true;
    } else if (kind != first || host_part) {
      throw invalid_argument(
          fmt::format("growable_buffer: cannot spill from {} memory to {} memory (a buffer continues on "
                      "memory of its first pool's kind, or from GPU memory onto pinned host memory, which "
                      "then comes last)",
                      to_string(provider.capabilities().where), to_string(other.capabilities().where)));
    }
    if (&other.address_space() != &provider.address_space())
      throw invalid_argument(
          fmt::format("growable_buffer: the spill pool's {} memory lives in another address space than the "
                      "buffer's (each OS host provider has its own: spill onto a pool of the same provider)",
                      to_string(other.capabilities().where)));
    all_memory += other.capabilities().physical_memory_size;
  }
  if (host_part && !options.access.empty() &&
      std::all_of(options.access.begin(), options.access.end(), is_host_grant))
    throw invalid_argument(
        "growable_buffer: the access list names only the host, but the buffer starts in GPU "
        "memory, which the host cannot be given: name the GPUs that use it");
  if (options.max_size == 0) options.max_size = all_memory;
  options.max_size = round_up(options.max_size, provider.capabilities().granularity);
  return options;
}

}  // namespace

growable_buffer::growable_buffer(std::shared_ptr<chunk_pool> pool, growable_buffer_options options)
    : pool_(require(std::move(pool))),
      options_(checked(std::move(options), *pool_->provider())),
      run_(pool_->provider(), options_.max_size),
      host_part_(
          pool_->provider()->capabilities().where.kind == memory_kind::device && !options_.spill_to.empty() &&
          options_.spill_to.back()->provider()->capabilities().where.kind == memory_kind::pinned_host) {
  if (options_.growth_ahead.bytes > 0 || options_.growth_ahead.learn) {
    ahead_ = std::make_shared<detail::growth_slot>();
    worker_ = detail::growth_worker::shared();
  }
}

growable_buffer::growable_buffer(location where, growable_buffer_options options)
    : growable_buffer(default_pool(where), std::move(options)) {}

growable_buffer::growable_buffer(growable_buffer&& other) noexcept
    : pool_(std::move(other.pool_)),
      options_(std::move(other.options_)),
      run_(std::move(other.run_)),
      retirements_(std::exchange(other.retirements_, {})),
      capacity_(std::exchange(other.capacity_, 0)),
      size_(std::exchange(other.size_, 0)),
      host_part_(other.host_part_),
      ahead_(std::move(other.ahead_)),
      worker_(std::move(other.worker_)),
      recent_grows_(other.recent_grows_),
      grow_count_(std::exchange(other.grow_count_, 0)),
      asked_(std::exchange(other.asked_, 0)) {}

growable_buffer& growable_buffer::operator=(growable_buffer&& other) noexcept {
  if (this != &other) {
    growable_buffer old(std::move(*this));  // retired by old's destructor
    pool_ = std::move(other.pool_);
    options_ = std::move(other.options_);
    run_ = std::move(other.run_);
    retirements_ = std::exchange(other.retirements_, {});
    capacity_ = std::exchange(other.capacity_, 0);
    size_ = std::exchange(other.size_, 0);
    host_part_ = other.host_part_;
    ahead_ = std::move(other.ahead_);
    worker_ = std::move(other.worker_);
    recent_grows_ = other.recent_grows_;
    grow_count_ = std::exchange(other.grow_count_, 0);
    asked_ = std::exchange(other.asked_, 0);
  }
  return *this;
}

growable_buffer::~growable_buffer() {
  // Ready chunks were never used by any stream: back to their pool now. A preparation in
  // flight delivers nothing; worker_ (released after this body) joins its thread if this
  // was the last buffer that held it.
  if (ahead_ != nullptr) (void)ahead_->abandon();
  if (run_.data() == nullptr) return;
  std::vector<stream_event> earlier;
  for (retirement& r : retirements_) earlier.push_back(std::move(r.passed));
  const stream_use use{&run_.provider()->executor(), options_.stream};
  std::move(run_).retire_after({&use, 1}, std::move(earlier));
}

std::size_t growable_buffer::active_chunks() const noexcept {
  return retirements_.empty() ? run_.chunks().size() : retirements_.front().first_chunk;
}

chunk_pool& growable_buffer::pool_at(std::size_t index) const {
  return index == 0 ? *pool_ : *options_.spill_to[index - 1];
}

std::size_t growable_buffer::pool_index_of(const shared_chunk& chunk) const noexcept {
  for (std::size_t i = 0; i < options_.spill_to.size(); ++i)
    if (chunk->pool() == options_.spill_to[i]) return i + 1;
  return 0;
}

std::vector<access_grant> growable_buffer::grants(memory_kind kind) const {
  const bool gpu_buffer = pool_->provider()->capabilities().where.kind == memory_kind::device;
  std::vector<access_grant> result = options_.access;
  if (result.empty()) {
    for (std::size_t i = 0; i <= options_.spill_to.size(); ++i) {
      const memory_provider& provider = *pool_at(i).provider();
      for (const accessor& who : provider.capabilities().default_accessors) {
        // A host part of a GPU buffer adds the host, not every GPU its provider serves: the
        // GPUs are those of the GPU part.
        if (gpu_buffer && provider.capabilities().where.kind == memory_kind::pinned_host &&
            who != accessor::host())
          continue;
        if (std::none_of(result.begin(), result.end(), [&](const access_grant& g) { return g.who == who; }))
          result.push_back({who, access_mode::read_write});
      }
    }
  }
  // The driver cannot give the host GPU memory: in a buffer with a host part, a host grant
  // is for the host part only.
  if (host_part_ && kind == memory_kind::device) std::erase_if(result, is_host_grant);
  return result;
}

void growable_buffer::resize(std::size_t bytes, stream_ref stream) {
  if (run_.data() == nullptr) throw invalid_argument("growable_buffer: resize of a moved-from buffer");
  if (bytes > capacity_) {
    grow_mapping(bytes, stream);
  } else if (bytes < capacity_) {
    retire_beyond(bytes, stream);  // changes nothing when it throws
  }
  note_growth(bytes);
  asked_ = bytes;
  size_ = bytes;
  collect_passed();
  request_ahead();
}

void growable_buffer::reserve(std::size_t bytes, stream_ref stream) {
  reserve_mapping(bytes, stream, false);
}

void growable_buffer::reserve_exact(std::size_t bytes, stream_ref stream) {
  reserve_mapping(bytes, stream, true);
}

void growable_buffer::reserve_mapping(std::size_t bytes, stream_ref stream, bool exact) {
  if (run_.data() == nullptr) throw invalid_argument("growable_buffer: reserve of a moved-from buffer");
  if (bytes > capacity_) grow_mapping(bytes, stream, exact);
  // A container that reserves (device_vector) fills its capacity before it reserves again:
  // its next grow starts from there.
  note_growth(bytes);
  asked_ = std::max(asked_, capacity_);
  request_ahead();
}

void growable_buffer::note_growth(std::size_t bytes) noexcept {
  if (bytes > asked_) recent_grows_[grow_count_++ % recent_grows_.size()] = bytes - asked_;
}

void growable_buffer::shrink_to_fit(stream_ref stream) {
  if (run_.data() == nullptr) return;
  if (ahead_ != nullptr) (void)ahead_->abandon();  // the ready chunks go back to the pool
  retire_beyond(size_, stream);
  collect_passed();
}

void growable_buffer::wait_for_growth_ahead() const {
  if (ahead_ != nullptr) ahead_->wait();
}

std::size_t growable_buffer::ready_ahead() const {
  return ahead_ != nullptr ? ahead_->promised_bytes() : 0;
}

void growable_buffer::request_ahead() noexcept {
  if (ahead_ == nullptr) return;
  std::size_t ahead = options_.growth_ahead.bytes;
  if (options_.growth_ahead.learn)
    ahead = std::max(ahead, *std::max_element(recent_grows_.begin(), recent_grows_.end()));
  const std::size_t from = std::max(size_, asked_);
  const std::size_t want = from + std::min(ahead, run_.size() - from);
  // Mapped (retired chunks included: a grow takes them back first) plus promised.
  std::size_t have = run_.mapped();
  try {
    have += ahead_->promised_bytes();
    if (have >= want) return;
    const std::vector<shared_chunk>& chunks = run_.chunks();
    chunk_pool& pool = pool_at(chunks.empty() ? 0 : pool_index_of(chunks.back()));
    detail::growth_request request;
    // The chunks the grows to `want` would map, as the policy picks them.
    const std::size_t granularity = pool.granularity();
    std::size_t bytes = 0;
    for (std::size_t at = have; at < want && run_.size() - run_.mapped() > bytes;) {
      const std::size_t size =
          std::min(options_.policy.next_chunk(at, want, granularity), run_.size() - run_.mapped() - bytes);
      request.sizes.push_back(size);
      bytes += size;
      at += size;
    }
    if (request.sizes.empty()) return;
    const std::uint64_t generation = ahead_->open_request(bytes);
    if (generation == 0) return;  // one in flight already, or the last one failed
    request.pool = pool.shared_from_this();
    try {
      worker_->submit(ahead_, generation, std::move(request));
    } catch (...) {
      ahead_->cancel_request(generation);
      throw;
    }
  } catch (...) {
    // No memory to ask with: the next grow does its work itself.
  }
}

void growable_buffer::grow_mapping(std::size_t required, stream_ref stream, bool exact) {
  if (required > run_.size())
    throw out_of_memory(
        fmt::format("growable_buffer: {} bytes asked for, but its address range holds {} (max_size)",
                    required, run_.size()));
  const std::vector<shared_chunk>& chunks = run_.chunks();
  // Retired chunks are still mapped with access: growing over them costs no driver call.
  // How many to take back is worked out first; the books change only once nothing can fail.
  std::size_t take_back = active_chunks();
  std::size_t covered = capacity_;
  while (covered < required && take_back < chunks.size()) covered += chunks[take_back++]->size();
  // The growing stream must not write where work queued before a shrink may still read.
  for (const retirement& r : retirements_)
    if (r.first_chunk < take_back && !r.passed.done()) r.passed.enqueue_wait(stream);
  const auto commit_take_back = [&]() noexcept {
    while (!retirements_.empty() && retirements_.front().first_chunk < take_back) {
      const std::size_t end = retirements_.size() > 1 ? retirements_[1].first_chunk : chunks.size();
      if (take_back < end) {
        retirements_.front().first_chunk = take_back;
        break;
      }
      retirements_.erase(retirements_.begin());
    }
    capacity_ = covered;
  };
  if (covered >= required) {
    commit_take_back();
    return;
  }

  // Fresh chunks go after every chunk mapped, the retired ones included: those prepared
  // ahead first (mapped in the order they were made), then new ones from the pools.
  const std::size_t granularity = pool_->granularity();
  const std::size_t old_count = chunks.size();
  const std::size_t start = run_.mapped();
  std::vector<shared_chunk> ready;
  if (ahead_ != nullptr) ready = ahead_->take_ready(round_up(required - covered, granularity));
  std::size_t next_ready = 0;
  // Ready chunks this grow did not map stay ready, whatever happens below.
  struct keep_unused {
    detail::growth_slot* slot;
    std::vector<shared_chunk>& ready;
    std::size_t& next;
    ~keep_unused() {
      if (slot != nullptr && next < ready.size())
        slot->put_back({std::make_move_iterator(ready.begin() + static_cast<std::ptrdiff_t>(next)),
                        std::make_move_iterator(ready.end())});
    }
  } keep{ahead_.get(), ready, next_ready};
  std::size_t pool_index = chunks.empty() ? 0 : pool_index_of(chunks.back());
  std::size_t limit = std::numeric_limits<std::size_t>::max();  // lowered when memory runs short
  try {
    while (run_.mapped() - start + covered < required) {
      if (next_ready < ready.size()) {
        shared_chunk& chunk = ready[next_ready++];
        if (chunk->size() > run_.size() - run_.mapped()) continue;  // goes back to its pool
        pool_index = std::max(pool_index, pool_index_of(chunk));
        run_.push_back(std::move(chunk));
        continue;
      }
      const std::size_t have = run_.mapped() - start + covered;
      const std::size_t needed = round_up(required - have, granularity);
      const std::size_t size = std::min({options_.policy.next_chunk(have, required, granularity), limit,
                                         run_.size() - run_.mapped(), exact ? needed : limit});
      chunk_pool& pool = pool_at(pool_index);
      pooled_chunk chunk = pool.acquire_idle(size, stream);
      if (!chunk) {
        try {
          chunk = pool.acquire(size, stream);
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
      run_.push_back(std::make_shared<const pooled_chunk>(std::move(chunk)));
    }
    set_access_from(old_count);
  } catch (...) {
    // Nothing queued can use the fresh chunks yet: unmap them at once.
    run_.unmap_from(old_count);
    throw;
  }
  covered += run_.mapped() - start;
  take_back = run_.chunks().size();
  commit_take_back();
  // A grow that needed fresh memory succeeded: growth ahead may ask again after a failure.
  if (ahead_ != nullptr) ahead_->clear_failure();
}

void growable_buffer::set_access_from(std::size_t first_chunk) {
  // One access call over each run of one kind of memory: the driver's cost is per call and
  // handle. Runs of different kinds (a GPU part and a host part) take different grants,
  // through their own provider, which knows how to name the host for its memory.
  const std::vector<shared_chunk>& chunks = run_.chunks();
  std::size_t offset = 0;
  for (std::size_t i = 0; i < first_chunk; ++i) offset += chunks[i]->size();
  for (std::size_t i = first_chunk; i < chunks.size();) {
    const std::shared_ptr<memory_provider>& provider = chunks[i]->memory().provider();
    const memory_kind kind = provider->capabilities().where.kind;
    std::size_t length = 0;
    std::size_t end = i;
    for (; end < chunks.size() && chunks[end]->memory().provider()->capabilities().where.kind == kind; ++end)
      length += chunks[end]->size();
    if (kind == run_.provider()->capabilities().where.kind) {
      run_.set_access(offset, length, grants(kind));
    } else {
      provider->set_access(run_.address() + offset, length, grants(kind));
    }
    offset += length;
    i = end;
  }
}

void growable_buffer::retire_beyond(std::size_t bytes, stream_ref stream) {
  const std::vector<shared_chunk>& chunks = run_.chunks();
  std::size_t first = active_chunks();
  std::size_t end_of_first = capacity_;
  while (first > 0 && end_of_first - chunks[first - 1]->size() >= bytes) {
    --first;
    end_of_first -= chunks[first]->size();
  }
  if (first == active_chunks()) return;
  stream_event passed(run_.provider()->executor(), stream);  // may throw: nothing changed yet
  retirements_.reserve(retirements_.size() + 1);
  retirements_.insert(retirements_.begin(), retirement{first, std::move(passed)});
  capacity_ = end_of_first;
}

void growable_buffer::collect_passed() noexcept {
  detail::cleanup("growable_buffer: collecting retired chunks", [&] { collect_retired(false); });
}

void growable_buffer::collect_retired(bool wait) {
  // From the highest addresses down: each retirement covers its chunks up to the next one's.
  while (!retirements_.empty()) {
    retirement& last = retirements_.back();
    if (wait) {
      last.passed.synchronize();
    } else if (!last.passed.done()) {
      return;
    }
    // A chunk that cannot be unmapped stays, retired: the next grow takes it back.
    if (run_.unmap_from(last.first_chunk) != last.first_chunk) return;
    retirements_.pop_back();
  }
}

std::vector<shared_chunk> growable_buffer::chunks(std::size_t offset, std::size_t length) const {
  if (offset > capacity_ || length > capacity_ - offset)
    throw invalid_argument(fmt::format("growable_buffer: chunk range [{}, +{}) runs past the {} bytes mapped",
                                       offset, length, capacity_));
  try {
    return run_.chunks(offset, length);
  } catch (const invalid_argument& error) {
    throw invalid_argument(fmt::format("growable_buffer: {}", error.what()));
  }
}

}  // namespace vmm
