#include "vmm/mapped_range.hpp"

#include <fmt/format.h>

#include <utility>

#include "vmm/detail/cleanup.hpp"
#include "vmm/detail/retirement.hpp"
#include "vmm/error.hpp"

namespace vmm {
namespace detail {

// A range on the retirement list.
class retired_range final : public retirable {
 public:
  explicit retired_range(mapped_range&& range) noexcept : range_(std::move(range)) {}
  bool release() noexcept override { return range_.release_all(); }
  void abandon() noexcept override { range_.abandon(); }

 private:
  mapped_range range_;
};

}  // namespace detail

mapped_range::mapped_range(std::shared_ptr<memory_provider> provider, std::size_t size, std::size_t alignment)
    : range_(std::move(provider), size, alignment) {}

mapped_range::mapped_range(mapped_range&& other) noexcept
    : chunks_(std::exchange(other.chunks_, {})),
      range_(std::move(other.range_)),
      mappings_(std::exchange(other.mappings_, {})),
      mapped_(std::exchange(other.mapped_, 0)) {}

mapped_range& mapped_range::operator=(mapped_range&& other) noexcept {
  if (this != &other) {
    mapped_range old(std::move(*this));  // unmapped by old's destructor
    chunks_ = std::exchange(other.chunks_, {});
    range_ = std::move(other.range_);
    mappings_ = std::exchange(other.mappings_, {});
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

mapped_range::~mapped_range() {
  if (range_.address() == 0 || release_all()) return;
  // An unmap or the free failed (and was reported): the retirement list tries again.
  std::shared_ptr<detail::retirable> rest;
  try {
    rest = std::make_shared<detail::retired_range>(std::move(*this));
  } catch (...) {
    abandon();
    return;
  }
  detail::retry_later(std::move(rest));
}

bool mapped_range::release_all() noexcept {
  if (unmap_from(0) != 0) return false;
  return range_.reset();
}

void mapped_range::abandon() noexcept {
  for (std::size_t i = mappings_.size(); i-- > 0;) {
    chunks_[i]->discard();  // still mapped: never lent again
    (void)mappings_[i].release();
  }
  mappings_.clear();
  chunks_.clear();
  mapped_ = 0;
  (void)range_.release();
}

void mapped_range::check_mappable(const shared_chunk& chunk) const {
  if (chunk == nullptr || !*chunk) throw invalid_argument("mapped_range: the chunk is empty");
  const std::shared_ptr<memory_provider>& memory = chunk->memory().provider();
  if (&memory->address_space() != &provider()->address_space())
    throw invalid_argument(
        fmt::format("mapped_range: {} memory lives in {}, but the range is in {}: memory of two address "
                    "spaces never shares a range",
                    to_string(memory->capabilities().where), memory->address_space().name(),
                    provider()->address_space().name()));
}

void mapped_range::push_back(shared_chunk chunk) {
  check_mappable(chunk);
  if (chunk->size() > size() - mapped_)
    throw invalid_argument(
        fmt::format("mapped_range: a chunk of {} bytes does not fit: {} of {} bytes "
                    "are mapped",
                    chunk->size(), mapped_, size()));
  chunks_.reserve(chunks_.size() + 1);
  mappings_.reserve(mappings_.size() + 1);
  mappings_.emplace_back(chunk->memory(), address() + mapped_, std::span<const access_grant>{});
  mapped_ += chunk->size();
  chunks_.push_back(std::move(chunk));
}

shared_chunk mapped_range::replace(std::size_t index, shared_chunk chunk,
                                   std::span<const access_grant> grants,
                                   std::span<const access_grant> restore) {
  if (index >= chunks_.size())
    throw invalid_argument(
        fmt::format("mapped_range: replace of chunk {}, but {} chunks are mapped", index, chunks_.size()));
  check_mappable(chunk);
  if (chunk->size() != chunks_[index]->size())
    throw invalid_argument(fmt::format("mapped_range: a chunk of {} bytes cannot replace one of {} bytes",
                                       chunk->size(), chunks_[index]->size()));
  mapping& place = mappings_[index];
  const std::uintptr_t at = place.address();
  const std::shared_ptr<memory_provider> owner = place.provider();
  owner->unmap(at, place.size());  // a refusal throws with the old mapping in place
  (void)place.release();
  try {
    place = mapping(chunk->memory(), at, grants);
  } catch (...) {
    // Put the old chunk back as it was; only if that fails too do its addresses stay unmapped.
    (void)detail::cleanup("mapped_range: mapping a replaced chunk back",
                          [&] { place = mapping(chunks_[index]->memory(), at, restore); });
    throw;
  }
  return std::exchange(chunks_[index], std::move(chunk));
}

std::vector<shared_chunk> mapped_range::chunks(std::size_t offset, std::size_t length) const {
  if (length == 0) throw invalid_argument("a chunk range of length 0");
  if (offset > mapped_ || length > mapped_ - offset)
    throw invalid_argument(
        fmt::format("chunk range [{}, +{}) runs past the {} bytes mapped", offset, length, mapped_));
  std::vector<shared_chunk> result;
  std::size_t position = 0;
  for (std::size_t i = 0; i < chunks_.size() && position < offset + length; ++i) {
    const std::size_t chunk_size = chunks_[i]->size();
    const bool starts_inside = offset > position && offset < position + chunk_size;
    const bool ends_inside = offset + length > position && offset + length < position + chunk_size;
    if (starts_inside || ends_inside)
      throw invalid_argument(fmt::format("chunk range [{}, +{}) is not on chunk boundaries (chunk [{}, +{}))",
                                         offset, length, position, chunk_size));
    if (position >= offset) result.push_back(chunks_[i]);
    position += chunk_size;
  }
  return result;
}

void mapped_range::set_access(std::size_t offset, std::size_t length, std::span<const access_grant> grants) {
  if (offset > mapped_ || length > mapped_ - offset)
    throw invalid_argument(fmt::format("mapped_range: set_access of [{}, +{}) passes the {} bytes mapped",
                                       offset, length, mapped_));
  provider()->set_access(address() + offset, length, grants);
}

void mapped_range::set_access(std::size_t offset, std::size_t length, access_mode mode) {
  set_access(offset, length, provider()->capabilities().grants(mode));
}

std::size_t mapped_range::unmap_from(std::size_t first) noexcept {
  while (mappings_.size() > first) {
    // Still mapped: keep it, its chunk and all below (the failure was reported).
    if (!mappings_.back().reset()) break;
    mapped_ -= chunks_.back()->size();
    mappings_.pop_back();
    chunks_.pop_back();
  }
  return mappings_.size();
}

void mapped_range::retire(std::vector<stream_event> passed) && noexcept {
  if (range_.address() == 0) return;
  std::shared_ptr<detail::retirable> held;
  try {
    held = std::make_shared<detail::retired_range>(std::move(*this));
  } catch (...) {
    // No memory for the list's entry: wait here instead, then unmap.
    for (const stream_event& point : passed)
      detail::cleanup("mapped_range: waiting for a stream", [&] { point.synchronize(); });
    mapped_range now(std::move(*this));
    return;
  }
  detail::retire(std::move(passed), std::move(held));
}

void mapped_range::retire_after(std::span<const stream_use> uses,
                                std::vector<stream_event> also) && noexcept {
  std::vector<stream_event> passed = std::move(also);
  for (const stream_use& use : uses) {
    const bool recorded = detail::cleanup("mapped_range: recording the point of a stream",
                                          [&] { passed.emplace_back(*use.executor, use.stream); });
    if (!recorded)
      detail::cleanup("mapped_range: waiting for a stream", [&] { use.executor->synchronize(use.stream); });
  }
  std::move(*this).retire(std::move(passed));
}

}  // namespace vmm
