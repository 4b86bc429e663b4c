#include "vmm/chunk_view.hpp"

#include <fmt/format.h>

#include <utility>

#include "cleanup.hpp"
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
      throw invalid_argument(fmt::format(
          "chunk_view: chunk {} comes from {} but chunk 0 from {}: a view maps the memory of "
          "one provider",
          i, to_string(provider->where()), to_string(first->where())));
  }
  return chunks;
}

std::size_t total_size(const std::vector<shared_chunk>& chunks) {
  std::size_t total = 0;
  for (const shared_chunk& chunk : chunks) {
    if (chunk->size() > ~std::size_t{0} - total)
      throw invalid_argument(fmt::format("chunk_view: {} chunks add up to more bytes than an address holds",
                                         chunks.size()));
    total += chunk->size();
  }
  return total;
}

}  // namespace

chunk_view::chunk_view(without_access, std::vector<shared_chunk> chunks, stream_handle stream)
    : chunks_(checked(std::move(chunks))),
      range_(chunks_.front()->memory().provider(), total_size(chunks_)),
      stream_(stream) {
  mappings_.reserve(chunks_.size());
  std::uintptr_t address = range_.get();
  for (const shared_chunk& chunk : chunks_) {
    // No access yet: one set_access over the whole range follows (the cost is per call).
    mappings_.emplace_back(chunk->memory(), address, std::span<const access_grant>{});
    address += chunk->size();
  }
}

// Once the delegated constructor has mapped everything, a throw from set_access runs
// ~chunk_view, which unmaps it all again.
chunk_view::chunk_view(std::vector<shared_chunk> chunks, access_mode mode, stream_handle stream)
    : chunk_view(without_access{}, std::move(chunks), stream) {
  set_access(mode);
}

chunk_view::chunk_view(std::vector<shared_chunk> chunks, std::span<const access_grant> grants,
                       stream_handle stream)
    : chunk_view(without_access{}, std::move(chunks), stream) {
  set_access(grants);
}

chunk_view::chunk_view(chunk_view&& other) noexcept
    : chunks_(std::move(other.chunks_)),
      range_(std::move(other.range_)),
      mappings_(std::move(other.mappings_)),
      stream_(std::exchange(other.stream_, nullptr)) {}

chunk_view& chunk_view::operator=(chunk_view&& other) noexcept {
  if (this != &other) {
    chunk_view old(std::move(*this));  // unmapped by old's destructor, before its chunks go
    chunks_ = std::move(other.chunks_);
    range_ = std::move(other.range_);
    mappings_ = std::move(other.mappings_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

chunk_view::~chunk_view() {
  if (mappings_.empty()) return;
  // cuMemUnmap does not wait for kernels that still read through the view.
  detail::cleanup("chunk_view: wait for the stream before unmapping",
                  [&] { range_.provider()->synchronize(stream_); });
}

std::vector<shared_chunk> chunk_view::chunks(std::size_t offset, std::size_t length) const {
  if (length == 0) throw invalid_argument("chunk_view: a chunk range of length 0");
  if (offset > size() || length > size() - offset)
    throw invalid_argument(fmt::format("chunk_view: chunk range [{}, +{}) runs past the {} bytes mapped",
                                       offset, length, size()));
  std::vector<shared_chunk> result;
  std::size_t position = 0;
  for (std::size_t i = 0; i < chunks_.size() && position < offset + length; ++i) {
    const std::size_t chunk_size = chunks_[i]->size();
    const bool starts_inside = offset > position && offset < position + chunk_size;
    const bool ends_inside = offset + length > position && offset + length < position + chunk_size;
    if (starts_inside || ends_inside)
      throw invalid_argument(fmt::format(
          "chunk_view: chunk range [{}, +{}) is not on chunk boundaries (chunk [{}, +{}))", offset,
          length, position, chunk_size));
    if (position >= offset) result.push_back(chunks_[i]);
    position += chunk_size;
  }
  return result;
}

void chunk_view::set_access(access_mode mode) {
  if (mappings_.empty()) throw invalid_argument("chunk_view: set_access on an empty view");
  range_.provider()->set_access(range_.get(), range_.size(), mode);
}

void chunk_view::set_access(std::span<const access_grant> grants) {
  if (mappings_.empty()) throw invalid_argument("chunk_view: set_access on an empty view");
  if (grants.empty()) throw invalid_argument("chunk_view: set_access with no grants");
  range_.provider()->set_access(range_.get(), range_.size(), grants);
}

chunk_view alias(const growable_buffer& buffer, std::size_t offset, std::size_t length,
                 access_mode mode, stream_handle stream) {
  return chunk_view(buffer.chunks(offset, length), mode, stream);
}

chunk_view alias(const growable_buffer& buffer, std::size_t offset, std::size_t length,
                 std::span<const access_grant> grants, stream_handle stream) {
  return chunk_view(buffer.chunks(offset, length), grants, stream);
}

namespace {

// Appends the chunks of [offset, offset + length) of `buffer`, naming `what` on failure.
void append_chunks(std::vector<shared_chunk>& list, const growable_buffer* buffer, std::size_t offset,
                   std::size_t length, const std::string& what) {
  if (buffer == nullptr) throw invalid_argument(fmt::format("{}: the buffer is null", what));
  try {
    std::vector<shared_chunk> chunks = buffer->chunks(offset, length);
    list.insert(list.end(), chunks.begin(), chunks.end());
  } catch (const invalid_argument& error) {
    throw invalid_argument(fmt::format("{}: {}", what, error.what()));
  }
}

}  // namespace

chunk_view splice(std::span<const buffer_slice> slices, access_mode mode, stream_handle stream) {
  if (slices.empty()) throw invalid_argument("splice: no slices (a view of length 0)");
  std::vector<shared_chunk> list;
  for (std::size_t i = 0; i < slices.size(); ++i)
    append_chunks(list, slices[i].buffer, slices[i].offset, slices[i].length,
                  fmt::format("splice: slice {} of {}", i, slices.size()));
  return chunk_view(std::move(list), mode, stream);
}

chunk_view concatenate(std::span<const growable_buffer* const> buffers, access_mode mode,
                       stream_handle stream) {
  std::vector<shared_chunk> list;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i] != nullptr && buffers[i]->size() == 0) continue;
    append_chunks(list, buffers[i], 0, buffers[i] == nullptr ? 0 : buffers[i]->size(),
                  fmt::format("concatenate: buffer {} of {}", i, buffers.size()));
  }
  if (list.empty())
    throw invalid_argument(fmt::format("concatenate: {} buffers holding no bytes (a view of length 0)",
                                       buffers.size()));
  return chunk_view(std::move(list), mode, stream);
}

chunk_view permute(const growable_buffer& buffer, std::span<const std::size_t> order,
                   access_mode mode, stream_handle stream) {
  if (order.empty()) throw invalid_argument("permute: no chunk indices (a view of length 0)");
  const std::vector<shared_chunk> all =
      buffer.capacity() == 0 ? std::vector<shared_chunk>{} : buffer.chunks(0, buffer.capacity());
  std::vector<shared_chunk> list;
  list.reserve(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (order[i] >= all.size())
      throw invalid_argument(fmt::format("permute: order[{}] is chunk {}, but the buffer maps {} chunks",
                                         i, order[i], all.size()));
    list.push_back(all[order[i]]);
  }
  return chunk_view(std::move(list), mode, stream);
}

}  // namespace vmm
