// Private overlays of an import (importer.hpp's file comment): chunks replaced, in this
// process only, by fresh memory holding a copy of their bytes, at the same addresses.

#include <vmm/ipc/importer.hpp>

#include <vmm/detail/cleanup.hpp>
#include <vmm/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace vmm::ipc {

template <class Fn>
void imported_buffer::for_chunks_touching(std::size_t offset, std::size_t length, Fn&& fn) const {
  if (offset > capacity() || length > capacity() - offset)
    throw invalid_argument(fmt::format("imported_buffer: the range [{}, +{}) passes the {} bytes mapped",
                                       offset, length, capacity()));
  if (length == 0) return;
  std::size_t position = 0;
  for (std::size_t i = 0; i < run_.chunks().size() && position < offset + length; ++i) {
    const std::size_t size = run_.chunks()[i]->size();
    if (position + size > offset) fn(i, position);
    position += size;
  }
}

bool imported_buffer::is_private(std::size_t offset, std::size_t length) const {
  bool all = true;
  for_chunks_touching(offset, length, [&](std::size_t index, std::size_t) {
    all = all && index < private_chunks_.size() && private_chunks_[index];
  });
  return all;
}

std::size_t imported_buffer::private_bytes() const noexcept {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < private_chunks_.size() && i < run_.chunks().size(); ++i)
    if (private_chunks_[i]) bytes += run_.chunks()[i]->size();
  return bytes;
}

std::size_t imported_buffer::make_private(std::span<const byte_span> spans, stream_ref stream) {
  if (run_.data() == nullptr) throw invalid_argument("imported_buffer: make_private of an empty import");
  struct replacement {
    std::size_t index;
    std::size_t at;  // its offset in the import
    shared_chunk fresh;
  };
  std::vector<replacement> plan;  // in chunk order, each chunk once
  for (const byte_span& span : spans)
    for_chunks_touching(span.offset, span.length, [&](std::size_t index, std::size_t at) {
      if (index < private_chunks_.size() && private_chunks_[index]) return;
      const auto place =
          std::lower_bound(plan.begin(), plan.end(), index,
                           [](const replacement& step, std::size_t i) { return step.index < i; });
      if (place == plan.end() || place->index != index) plan.insert(place, {index, at, nullptr});
    });
  if (plan.empty()) return 0;

  // Fresh memory for each chunk, filled through a temporary mapping of its own: until the
  // swap below, nothing of the import has changed.
  std::size_t fresh_bytes = 0;
  {
    std::vector<mapped_range> staging;
    staging.reserve(plan.size());
    const auto retire_staging = [&] {
      for (mapped_range& temporary : staging) {
        const stream_use use{&temporary.provider()->executor(), stream};
        std::move(temporary).retire_after({&use, 1});
      }
    };
    try {
      for (replacement& step : plan) {
        const shared_chunk& shared = run_.chunks()[step.index];
        const std::shared_ptr<memory_provider>& provider = shared->memory().provider();
        step.fresh = std::make_shared<const pooled_chunk>(
            pooled_chunk::own(physical_allocation(provider, shared->size())));
        mapped_range& temporary = staging.emplace_back(provider, shared->size());
        temporary.push_back(step.fresh);
        temporary.set_access(0, shared->size(), access_mode::read_write);
        provider->executor().copy(temporary.data(), static_cast<const std::byte*>(data()) + step.at,
                                  shared->size(), stream);
        fresh_bytes += shared->size();
      }
      for (const mapped_range& temporary : staging) temporary.provider()->executor().synchronize(stream);
    } catch (...) {
      retire_staging();  // after the copies queued so far
      throw;
    }
    retire_staging();  // the copies are done: unmapped at once
  }

  // The swap: each chunk unmapped and its fresh memory mapped read-write in its place. A
  // failure puts the chunks swapped so far back (replace() restores the one that failed).
  private_chunks_.resize(std::max(private_chunks_.size(), run_.chunks().size()), false);
  std::vector<shared_chunk> replaced;
  replaced.reserve(plan.size());
  std::size_t done = 0;
  try {
    for (; done < plan.size(); ++done) {
      const replacement& step = plan[done];
      const provider_capabilities& caps = step.fresh->memory().provider()->capabilities();
      replaced.push_back(
          run_.replace(step.index, step.fresh, caps.grants(access_mode::read_write), caps.grants(access_)));
    }
  } catch (...) {
    while (done-- > 0) {
      const replacement& step = plan[done];
      const provider_capabilities& caps = step.fresh->memory().provider()->capabilities();
      (void)detail::cleanup("imported_buffer: mapping a shared chunk back", [&] {
        (void)run_.replace(step.index, replaced[done], caps.grants(access_),
                           caps.grants(access_mode::read_write));
      });
    }
    throw;
  }
  for (const replacement& step : plan) private_chunks_[step.index] = true;
  return fresh_bytes;
}

}  // namespace vmm::ipc
