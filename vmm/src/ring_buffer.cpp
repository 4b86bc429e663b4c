#include "vmm/ring_buffer.hpp"

#include <fmt/format.h>

#include <limits>
#include <utility>

#include "vmm/error.hpp"

namespace vmm {
namespace {

// The memory chunk twice, then the control chunk: one view, one access call.
chunk_view make_view(const std::shared_ptr<chunk_pool>& pool, std::size_t capacity,
                     const ring_buffer_options& options) {
  if (pool == nullptr) throw invalid_argument("ring_buffer: the pool is null");
  const std::size_t granularity = pool->granularity();
  if (capacity == 0) throw invalid_argument("ring_buffer: capacity 0");
  if (capacity % granularity != 0)
    throw invalid_argument(
        fmt::format("ring_buffer: capacity {} is not a multiple of the granularity {} (the memory is mapped "
                    "twice, and mappings are whole chunks); {} would be",
                    capacity, granularity, round_up(capacity, granularity)));
  if (capacity > (std::numeric_limits<std::size_t>::max() - granularity) / 2)
    throw invalid_argument(fmt::format("ring_buffer: capacity {} cannot be mapped twice", capacity));
  auto memory = std::make_shared<const pooled_chunk>(pool->acquire(capacity, options.stream));
  auto control = std::make_shared<const pooled_chunk>(pool->acquire(granularity, options.stream));
  std::vector<shared_chunk> chunks{memory, memory, std::move(control)};
  if (options.access.empty()) return chunk_view(std::move(chunks), access_mode::read_write, options.stream);
  return chunk_view(std::move(chunks), options.access, options.stream);
}

}  // namespace

ring_buffer::ring_buffer(std::shared_ptr<chunk_pool> pool, std::size_t capacity, ring_buffer_options options)
    : view_(make_view(pool, capacity, options)), capacity_(capacity) {
  reset();
  // The counters are zero before anyone (the host included) can use the view.
  view_.provider()->executor().synchronize(view_.stream());
}

ring_buffer::ring_buffer(location where, std::size_t capacity, ring_buffer_options options)
    : ring_buffer(default_pool(where), capacity, std::move(options)) {}

ring_buffer::ring_buffer(ring_buffer&& other) noexcept
    : view_(std::move(other.view_)), capacity_(std::exchange(other.capacity_, 0)) {}

ring_buffer& ring_buffer::operator=(ring_buffer&& other) noexcept {
  if (this != &other) {
    view_ = std::move(other.view_);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

ring_buffer_view ring_buffer::view() const noexcept {
  if (capacity_ == 0) return {};
  std::byte* const control = data() + 2 * capacity_;
  return {data(), capacity_, reinterpret_cast<std::uint64_t*>(control + ring_head_offset),
          reinterpret_cast<std::uint64_t*>(control + ring_tail_offset)};
}

std::uint64_t ring_buffer::read_counter(std::size_t offset) const {
  if (capacity_ == 0) throw invalid_argument("ring_buffer: counters of a moved-from ring");
  std::uint64_t value = 0;
  const auto& provider = view_.provider();
  provider->executor().copy(&value, data() + 2 * capacity_ + offset, sizeof value, view_.stream());
  provider->executor().synchronize(view_.stream());
  return value;
}

std::uint64_t ring_buffer::head() const {
  return read_counter(ring_head_offset);
}

std::uint64_t ring_buffer::tail() const {
  return read_counter(ring_tail_offset);
}

void ring_buffer::reset() {
  if (capacity_ == 0) throw invalid_argument("ring_buffer: reset of a moved-from ring");
  view_.provider()->executor().fill(data() + 2 * capacity_, 0, ring_control_bytes, view_.stream());
}

}  // namespace vmm
