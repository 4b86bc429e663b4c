#include "vmm/chunk_view.hpp"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "vmm/error.hpp"

namespace vmm {
namespace {

std::vector<shared_chunk> checked(std::vector<shared_chunk> chunks) {
  if (chunks.empty()) throw invalid_argument("chunk_view: no chunks to map (a view of length 0)");
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i] == nullptr || !*chunks[i])
      throw invalid_argument(fmt::format("chunk_view: chunk {} of {} is empty", i, chunks.size()));
    const auto& first = chunks.front()->memory().provider();
    const auto& provider = chunks[i]->memory().provider();
    if (provider != first)
      throw invalid_argument(
          fmt::format("chunk_view: chunk {} comes from {} but chunk 0 from {}: a view maps the memory of "
                      "one provider",
                      i, to_string(provider->capabilities().where), to_string(first->capabilities().where)));
  }
  return chunks;
}

std::size_t total_size(const std::vector<shared_chunk>& chunks) {
  std::size_t total = 0;
  for (const shared_chunk& chunk : chunks) {
    if (chunk->size() > ~std::size_t{0} - total)
      throw invalid_argument(
          fmt::format("chunk_view: {} chunks add up to more bytes than an address holds", chunks.size()));
    total += chunk->size();
  }
  return total;
}

// Reports a bad chunk range as `what`: the buffer's own message, prefixed.
std::vector<shared_chunk> chunks_of(const growable_buffer* buffer, std::size_t offset, std::size_t length,
                                    const std::string& what) {
  if (buffer == nullptr) throw invalid_argument(fmt::format("{}: the buffer is null", what));
  try {
    return buffer->chunks(offset, length);
  } catch (const invalid_argument& error) {
    throw invalid_argument(fmt::format("{}: {}", what, error.what()));
  }
}

}  // namespace

chunk_view::chunk_view(without_access, std::vector<shared_chunk> chunks, stream_ref stream)
    : stream_(stream) {
  chunks = checked(std::move(chunks));
  mapped_range run(chunks.front()->memory().provider(), total_size(chunks));
  // No access yet: one set_access over the whole range follows (the cost is per call).
  for (shared_chunk& chunk : chunks) run.push_back(std::move(chunk));
  run_ = std::move(run);
}

// Once the delegated constructor has mapped everything, a throw from set_access runs
// ~chunk_view, which unmaps it all again.
chunk_view::chunk_view(std::vector<shared_chunk> chunks, access_mode mode, stream_ref stream)
    : chunk_view(without_access{}, std::move(chunks), stream) {
  set_access(mode);
}

chunk_view::chunk_view(std::vector<shared_chunk> chunks, std::span<const access_grant> grants,
                       stream_ref stream)
    : chunk_view(without_access{}, std::move(chunks), stream) {
  set_access(grants);
}

chunk_view& chunk_view::operator=(chunk_view&& other) noexcept {
  if (this != &other) {
    chunk_view old(std::move(*this));  // retired by old's destructor
    run_ = std::move(other.run_);
    stream_ = other.stream_;
  }
  return *this;
}

chunk_view::~chunk_view() {
  if (run_.data() == nullptr) return;
  const stream_use use{&run_.provider()->executor(), stream_};
  std::move(run_).retire_after({&use, 1});
}

void chunk_view::set_access(access_mode mode) {
  if (run_.data() == nullptr) throw invalid_argument("chunk_view: set_access on an empty view");
  run_.set_access(0, run_.mapped(), mode);
}

void chunk_view::set_access(std::span<const access_grant> grants) {
  if (run_.data() == nullptr) throw invalid_argument("chunk_view: set_access on an empty view");
  run_.set_access(0, run_.mapped(), grants);
}

chunk_view alias(const growable_buffer& buffer, std::size_t offset, std::size_t length, access_mode mode,
                 stream_ref stream) {
  return chunk_view(chunks_of(&buffer, offset, length, "alias"), mode, stream);
}

chunk_view alias(const growable_buffer& buffer, std::size_t offset, std::size_t length,
                 std::span<const access_grant> grants, stream_ref stream) {
  return chunk_view(chunks_of(&buffer, offset, length, "alias"), grants, stream);
}

chunk_view splice(std::span<const buffer_slice> slices, access_mode mode, stream_ref stream) {
  if (slices.empty()) throw invalid_argument("splice: no slices (a view of length 0)");
  std::vector<shared_chunk> list;
  for (std::size_t i = 0; i < slices.size(); ++i) {
    std::vector<shared_chunk> chunks = chunks_of(slices[i].buffer, slices[i].offset, slices[i].length,
                                                 fmt::format("splice: slice {} of {}", i, slices.size()));
    list.insert(list.end(), chunks.begin(), chunks.end());
  }
  return chunk_view(std::move(list), mode, stream);
}

chunk_view concatenate(std::span<const growable_buffer* const> buffers, access_mode mode, stream_ref stream) {
  std::vector<shared_chunk> list;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i] != nullptr && buffers[i]->size() == 0) continue;
    std::vector<shared_chunk> chunks =
        chunks_of(buffers[i], 0, buffers[i] == nullptr ? 0 : buffers[i]->size(),
                  fmt::format("concatenate: buffer {} of {}", i, buffers.size()));
    list.insert(list.end(), chunks.begin(), chunks.end());
  }
  if (list.empty())
    throw invalid_argument(
        fmt::format("concatenate: {} buffers holding no bytes (a view of length 0)", buffers.size()));
  return chunk_view(std::move(list), mode, stream);
}

chunk_view permute(const growable_buffer& buffer, std::span<const std::size_t> order, access_mode mode,
                   stream_ref stream) {
  if (order.empty()) throw invalid_argument("permute: no chunk indices (a view of length 0)");
  const std::vector<shared_chunk> all =
      buffer.capacity() == 0 ? std::vector<shared_chunk>{} : buffer.chunks(0, buffer.capacity());
  std::vector<shared_chunk> list;
  list.reserve(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (order[i] >= all.size())
      throw invalid_argument(fmt::format("permute: order[{}] is chunk {}, but the buffer maps {} chunks", i,
                                         order[i], all.size()));
    list.push_back(all[order[i]]);
  }
  return chunk_view(std::move(list), mode, stream);
}

}  // namespace vmm
