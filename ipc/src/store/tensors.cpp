#include <vmm/store/tensors.hpp>

#include <vmm/error.hpp>
#include <vmm/store/protocol.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace vmm::store {
namespace {

struct dtype_row {
  dtype type;
  const char* name;
  std::size_t bytes;
};

constexpr dtype_row dtypes[] = {
    {dtype::boolean, "BOOL", 1},    {dtype::u8, "U8", 1},           {dtype::i8, "I8", 1},
    {dtype::f8_e5m2, "F8_E5M2", 1}, {dtype::f8_e4m3, "F8_E4M3", 1}, {dtype::f8_e8m0, "F8_E8M0", 1},
    {dtype::i16, "I16", 2},         {dtype::u16, "U16", 2},         {dtype::f16, "F16", 2},
    {dtype::bf16, "BF16", 2},       {dtype::i32, "I32", 4},         {dtype::u32, "U32", 4},
    {dtype::f32, "F32", 4},         {dtype::c64, "C64", 8},         {dtype::f64, "F64", 8},
    {dtype::i64, "I64", 8},         {dtype::u64, "U64", 8},
};

const dtype_row* row_of(dtype type) noexcept {
  for (const dtype_row& row : dtypes)
    if (row.type == type) return &row;
  return nullptr;
}

}  // namespace

const char* to_string(dtype type) noexcept {
  const dtype_row* row = row_of(type);
  return row != nullptr ? row->name : "unknown";
}

std::optional<dtype> dtype_from_name(std::string_view name) noexcept {
  for (const dtype_row& row : dtypes)
    if (name == row.name) return row.type;
  return std::nullopt;
}

std::size_t element_bytes(dtype type) noexcept {
  const dtype_row* row = row_of(type);
  return row != nullptr ? row->bytes : 0;
}

std::optional<std::uint64_t> tensor_bytes(dtype type, std::span<const std::uint64_t> shape) noexcept {
  std::uint64_t total = element_bytes(type);
  if (total == 0) return std::nullopt;
  for (const std::uint64_t extent : shape) {
    if (extent != 0 && total > UINT64_MAX / extent) return std::nullopt;
    total *= extent;
  }
  return total;
}

std::optional<std::string> tensor_table_problem(std::span<const tensor_info> table, std::uint64_t extent) {
  if (table.empty()) return "a tensor set holds 1 tensor at least";
  if (table.size() > max_tensors)
    return fmt::format("{} tensors; a set holds at most {}", table.size(), max_tensors);
  std::set<std::string_view> names;
  std::vector<const tensor_info*> by_offset;
  by_offset.reserve(table.size());
  for (const tensor_info& t : table) {
    if (std::string why; !valid_name(t.name, &why)) return fmt::format("a tensor's name is invalid: {}", why);
    if (!names.insert(t.name).second) return fmt::format("two tensors are named \"{}\"", t.name);
    if (row_of(t.type) == nullptr)
      return fmt::format("tensor \"{}\" has unknown dtype {}", t.name, static_cast<unsigned>(t.type));
    if (t.shape.size() > max_rank)
      return fmt::format("tensor \"{}\" has {} dimensions (at most {})", t.name, t.shape.size(), max_rank);
    const auto bytes = tensor_bytes(t.type, t.shape);
    if (!bytes) return fmt::format("tensor \"{}\": its size overflows 64 bits", t.name);
    if (*bytes != t.bytes)
      return fmt::format("tensor \"{}\" claims {} bytes; its dtype {} and shape [{}] make {}", t.name,
                         t.bytes, to_string(t.type), fmt::join(t.shape, ", "), *bytes);
    if (t.offset % tensor_alignment != 0)
      return fmt::format("tensor \"{}\" starts at byte {}, not a multiple of {}", t.name, t.offset,
                         tensor_alignment);
    if (t.offset > extent || t.bytes > extent - t.offset)
      return fmt::format("tensor \"{}\" ([{}, +{})) ends past the set's {} bytes", t.name, t.offset, t.bytes,
                         extent);
    if (t.bytes != 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const tensor_info* a, const tensor_info* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const tensor_info& before = *by_offset[i - 1];
    const tensor_info& after = *by_offset[i];
    if (before.offset + before.bytes > after.offset)
      return fmt::format("tensors \"{}\" and \"{}\" overlap (bytes [{}, {}) and [{}, {}))", before.name,
                         after.name, before.offset, before.offset + before.bytes, after.offset,
                         after.offset + after.bytes);
  }
  return std::nullopt;
}

namespace {

// `t`'s bytes from its dtype and shape.
std::uint64_t bytes_of(const tensor_info& t) {
  const auto bytes = tensor_bytes(t.type, t.shape);
  if (!bytes)
    throw invalid_argument(
        fmt::format("vmm-store: tensor \"{}\": unknown dtype or a size past 64 bits", t.name));
  return *bytes;
}

// `at` rounded up to a multiple of `step`, or none past 64 bits.
std::optional<std::uint64_t> rounded_up(std::uint64_t at, std::uint64_t step) noexcept {
  const std::uint64_t rest = at % step;
  if (rest == 0) return at;
  if (at > UINT64_MAX - (step - rest)) return std::nullopt;
  return at + (step - rest);
}

// Places `t` (of `bytes`) at `start` rounded up to `step`, ending `length` bytes later;
// returns that end.
std::uint64_t place(tensor_info& t, std::uint64_t bytes, std::uint64_t start, std::uint64_t step,
                    std::uint64_t length) {
  const auto offset = rounded_up(start, step);
  if (!offset || length > UINT64_MAX - *offset)
    throw invalid_argument(fmt::format("vmm-store: tensor \"{}\" ends past 64 bits", t.name));
  t.offset = *offset;
  t.bytes = bytes;
  return *offset + length;
}

}  // namespace

std::uint64_t lay_out(std::span<tensor_info> table) {
  std::uint64_t end = 0;
  for (tensor_info& t : table) {
    const std::uint64_t bytes = bytes_of(t);
    end = place(t, bytes, end, tensor_alignment, bytes);
  }
  return end;
}

std::vector<std::uint64_t> lay_out_per_tensor(std::span<tensor_info> table, std::uint64_t granularity) {
  if (granularity == 0 || granularity % tensor_alignment != 0)
    throw invalid_argument(
        fmt::format("vmm-store: a per-tensor layout needs a granularity that is a multiple of {}, not {}",
                    tensor_alignment, granularity));
  std::vector<std::uint64_t> ends;
  std::uint64_t chunk = 0;  // where the open chunk starts (a multiple of the granularity)
  std::uint64_t end = 0;    // the first byte after the last tensor placed
  const auto close_chunk = [&] {
    if (end == chunk) return;  // nothing in it
    const auto rounded = rounded_up(end, granularity);
    if (!rounded) throw invalid_argument("vmm-store: a tensor set ends past 64 bits");
    ends.push_back(*rounded);
    chunk = end = *rounded;
  };
  for (tensor_info& t : table) {
    const std::uint64_t bytes = bytes_of(t);
    if (bytes >= granularity) {
      close_chunk();
      const auto length = rounded_up(bytes, granularity);
      if (!length) throw invalid_argument(fmt::format("vmm-store: tensor \"{}\" ends past 64 bits", t.name));
      end = place(t, bytes, end, granularity, *length);
      ends.push_back(end);
      chunk = end;
      continue;
    }
    // A small tensor joins the open chunk if it ends inside its granule.
    const auto start = rounded_up(end, tensor_alignment);
    if (!start || bytes > chunk + granularity - std::min(*start, chunk + granularity)) close_chunk();
    end = place(t, bytes, end, tensor_alignment, bytes);
  }
  close_chunk();
  return ends;
}

}  // namespace vmm::store
