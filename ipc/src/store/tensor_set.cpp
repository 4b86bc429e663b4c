#include <vmm/store/tensor_set.hpp>

#include <vmm/error.hpp>
#include <vmm/ipc/protocol_error.hpp>
#include <vmm/provider.hpp>
#include <vmm/stream_executor.hpp>

#include <fmt/format.h>

#include <set>
#include <utility>
#include <vector>

namespace vmm::store {

// ---- tensor_set ------------------------------------------------------------------------------

tensor_set::tensor_set(buffer memory, std::vector<tensor_info> table)
    : memory_(std::move(memory)), table_(std::move(table)) {
  for (std::size_t i = 0; i < table_.size(); ++i) index_.emplace(table_[i].name, i);
}

tensor_set tensor_set::get(client& store, std::string_view name) {
  buffer held = store.get(name, access_mode::read_only);
  std::vector<tensor_info> table = store.tensors(held);
  return tensor_set(std::move(held), std::move(table));
}

tensor_set tensor_set::get(client& store, std::string_view name, std::span<const std::string> private_names,
                           stream_ref stream) {
  buffer held = store.get(name, access_mode::read_only, {.own_mapping = true});
  std::vector<tensor_info> table = store.tensors(held);
  tensor_set set(std::move(held), std::move(table));
  (void)set.make_private(private_names, stream);
  return set;
}

std::size_t tensor_set::index_of(std::string_view name) const {
  const auto found = index_.find(name);
  if (found == index_.end())
    throw invalid_argument(fmt::format("vmm-store: \"{}\" holds no tensor \"{}\"", memory_.name(), name));
  return found->second;
}

private_tensors tensor_set::make_private(std::span<const std::string> names, stream_ref stream) {
  std::vector<ipc::byte_span> spans;
  spans.reserve(names.size());
  std::set<std::string_view> asked;
  for (const std::string& name : names) {
    const tensor_info& tensor = table_[index_of(name)];
    if (!asked.insert(name).second)
      throw invalid_argument(
          fmt::format("vmm-store: tensor \"{}\" of \"{}\" is named twice", name, memory_.name()));
    spans.push_back({tensor.offset, tensor.bytes});
  }
  std::vector<bool> before(table_.size());
  for (std::size_t i = 0; i < table_.size(); ++i)
    before[i] = memory_.is_private(table_[i].offset, table_[i].bytes);
  private_tensors made;
  made.bytes = memory_.make_private(spans, stream);
  for (std::size_t i = 0; i < table_.size(); ++i)
    if (!before[i] && memory_.is_private(table_[i].offset, table_[i].bytes))
      made.names.push_back(table_[i].name);
  return made;
}

bool tensor_set::is_private(std::string_view name) const {
  const tensor_info& tensor = table_[index_of(name)];
  return memory_.is_private(tensor.offset, tensor.bytes);
}

void* tensor_set::data_writable(std::string_view name) const {
  const tensor_info& tensor = table_[index_of(name)];
  if (!memory_.is_private(tensor.offset, tensor.bytes))
    throw invalid_argument(
        fmt::format("vmm-store: tensor \"{}\" of \"{}\" is shared and read-only here: make_private first",
                    name, memory_.name()));
  return static_cast<std::byte*>(memory_.data()) + tensor.offset;
}

tensor_set tensor_set::put(client& store, std::string_view name, std::span<const tensor_source> tensors,
                           location where, stream_ref stream) {
  return put(store, name, tensors, where, tensor_set_options{}, stream);
}

tensor_set tensor_set::put(client& store, std::string_view name, std::span<const tensor_source> tensors,
                           location where, tensor_set_options options, stream_ref stream) {
  std::vector<tensor_info> table;
  table.reserve(tensors.size());
  for (const tensor_source& source : tensors) {
    if (source.data == nullptr)
      throw invalid_argument(fmt::format("vmm-store: tensor \"{}\" has no data", source.name));
    table.push_back({.name = source.name, .type = source.type, .shape = source.shape});
  }
  tensor_set_builder builder(store, name, std::move(table), where, options);
  stream_executor& executor = builder.memory().provider()->executor();
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (builder.tensors()[i].bytes != 0)
      executor.copy(builder.data(i), tensors[i].data, builder.tensors()[i].bytes, stream);
  executor.synchronize(stream);
  return builder.commit();
}

tensor_view tensor_set::operator[](std::size_t i) const {
  if (i >= table_.size())
    throw invalid_argument(fmt::format("vmm-store: tensor {} of a set of {}", i, table_.size()));
  return {static_cast<const std::byte*>(memory_.data()) + table_[i].offset, &table_[i]};
}

tensor_view tensor_set::at(std::string_view name) const {
  return (*this)[index_of(name)];
}

// ---- tensor_set_builder ----------------------------------------------------------------------

tensor_set_builder::tensor_set_builder(client& store, std::string_view name, std::vector<tensor_info> tensors,
                                       location where, tensor_set_options options)
    : store_(&store), name_(name), table_(std::move(tensors)), deduplicate_(options.deduplicate) {
  // The ends of the chunks before the table's (per_tensor), or none (one chunk).
  std::vector<std::uint64_t> ends;
  std::size_t granularity = 0;
  std::uint64_t extent = 0;
  if (options.layout == set_layout::per_tensor) {
    granularity = provider_for(where)->capabilities().granularity;
    ends = lay_out_per_tensor(table_, granularity);
    extent = ends.empty() ? 0 : ends.back();
  } else {
    extent = lay_out(table_);
  }
  if (const auto problem = tensor_table_problem(table_, extent))
    throw invalid_argument(fmt::format("vmm-store: tensor set \"{}\": {}", name_, *problem));
  table_offset_ = (extent + 7) / 8 * 8;
  const std::vector<std::byte> encoded = encode(table_);
  const std::uint64_t size = table_offset_ + encoded.size();
  // One chunk per create and grow: the first chunk, then one grow per boundary and the table's.
  const std::size_t max_size = ends.empty() ? 0 : round_up(size, granularity);
  memory_ = store.create(name_, ends.empty() ? size : ends.front(), where,
                         {.max_size = max_size, .one_chunk = true});
  try {
    if (!ends.empty()) {
      for (std::size_t i = 1; i < ends.size(); ++i) (void)store.grow(name_, ends[i]);
      (void)store.grow(name_, size);
      memory_.refresh();
      if (memory_.chunk_count() != ends.size() + 1)
        throw ipc::protocol_error(
            fmt::format("vmm-store: tensor set \"{}\" was laid out for {} chunks; the daemon made {}", name_,
                        ends.size() + 1, memory_.chunk_count()));
    }
    stream_executor& executor = memory_.provider()->executor();
    auto* base = static_cast<std::byte*>(memory_.data());
    // Zero what no tensor and no table covers (pooled memory may hold a former buffer's bytes).
    std::uint64_t covered = 0;
    for (const tensor_info& t : table_) {
      if (t.bytes == 0) continue;
      if (t.offset > covered) executor.fill(base + covered, 0, t.offset - covered, {});
      covered = t.offset + t.bytes;
    }
    if (table_offset_ > covered) executor.fill(base + covered, 0, table_offset_ - covered, {});
    if (memory_.capacity() > size) executor.fill(base + size, 0, memory_.capacity() - size, {});
    executor.copy(base + table_offset_, encoded.data(), encoded.size(), {});
    executor.synchronize({});
  } catch (...) {
    memory_.release();
    try {
      store.remove(name_);
    } catch (const std::exception&) {
      // The daemon drops an uncommitted creation with its creator's connection anyway.
    }
    throw;
  }
}

tensor_set_builder::~tensor_set_builder() {
  if (committed_ || memory_.data() == nullptr) return;
  memory_.release();
  try {
    store_->remove(name_);
  } catch (const std::exception&) {
    // Gone already, or the daemon is: it drops an uncommitted creation with its creator.
  }
}

void* tensor_set_builder::data(std::size_t i) const {
  if (committed_ || memory_.data() == nullptr)
    throw invalid_argument(fmt::format("vmm-store: tensor set \"{}\" is committed already", name_));
  if (i >= table_.size())
    throw invalid_argument(fmt::format("vmm-store: tensor {} of a set of {}", i, table_.size()));
  return static_cast<std::byte*>(memory_.data()) + table_[i].offset;
}

tensor_set tensor_set_builder::commit() {
  if (committed_ || memory_.data() == nullptr)
    throw invalid_argument(fmt::format("vmm-store: tensor set \"{}\" is committed already", name_));
  const std::uint64_t table_bytes = memory_.size() - table_offset_;
  store_->seal_set(name_, table_offset_, table_bytes, {.deduplicate = deduplicate_});
  // Sealed: the name stays whatever happens from here.
  committed_ = true;
  memory_.release();
  return tensor_set::get(*store_, name_);
}

}  // namespace vmm::store
