// A vmm.share() handle's header (handle_header.hpp).

#include "handle_header.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include "vmm/error.hpp"

namespace vmm_python {
namespace {

using json = nlohmann::json;

constexpr std::uint64_t max_manifest_bytes = std::uint64_t{1} << 20;
constexpr std::uint64_t max_fds = 65536;
constexpr std::uint64_t max_bytes = std::uint64_t{1} << 48;  // vmm's largest allocation
constexpr std::size_t max_dimensions = 32;

// torch's dtype names a layout may give, with their item sizes.
constexpr std::array<std::pair<std::string_view, int>, 18> torch_dtypes{{
    {"bool", 1},
    {"uint8", 1},
    {"int8", 1},
    {"int16", 2},
    {"uint16", 2},
    {"int32", 4},
    {"uint32", 4},
    {"int64", 8},
    {"uint64", 8},
    {"float16", 2},
    {"bfloat16", 2},
    {"float32", 4},
    {"float64", 8},
    {"complex64", 8},
    {"complex128", 16},
    {"float8_e4m3fn", 1},
    {"float8_e5m2", 1},
    {"complex32", 4},
}};

[[noreturn]] void refuse(std::string_view field, std::string_view why) {
  throw vmm::invalid_argument(fmt::format("a vmm handle's header: {}: {}", field, why));
}

// The item size of a numpy type string such as "<f4" or "|u1", or 0 if it is not one.
int numpy_item_size(std::string_view type) {
  if (type.size() < 3 || type.size() > 4 ||
      std::string_view("<>|=").find(type[0]) == std::string_view::npos ||
      std::string_view("biufc").find(type[1]) == std::string_view::npos)
    return 0;
  int size = 0;
  for (const char digit : type.substr(2)) {
    if (digit < '0' || digit > '9') return 0;
    size = size * 10 + (digit - '0');
  }
  return size >= 1 && size <= 16 ? size : 0;
}

int torch_item_size(std::string_view name) {
  for (const auto& [known, size] : torch_dtypes)
    if (known == name) return size;
  return 0;
}

const json& field(const json& object, std::string_view name) {
  const auto found = object.find(name);
  if (found == object.end()) refuse(name, "missing");
  return *found;
}

std::uint64_t unsigned_field(const json& object, std::string_view name, std::uint64_t most) {
  const json& value = field(object, name);
  if (!value.is_number_integer() || (!value.is_number_unsigned() && value.get<std::int64_t>() < 0))
    refuse(name, "expected an integer from 0");
  const auto number = value.get<std::uint64_t>();
  if (number > most) refuse(name, fmt::format("{} is past {}", number, most));
  return number;
}

bool bool_field(const json& object, std::string_view name) {
  const json& value = field(object, name);
  if (!value.is_boolean()) refuse(name, "expected true or false");
  return value.get<bool>();
}

std::string string_field(const json& object, std::string_view name) {
  const json& value = field(object, name);
  if (!value.is_string()) refuse(name, "expected a string");
  return value.get<std::string>();
}

std::vector<std::int64_t> integers_field(const json& object, std::string_view name, bool negative_allowed) {
  const json& value = field(object, name);
  if (!value.is_array() || value.size() > max_dimensions)
    refuse(name, fmt::format("expected a list of at most {} integers", max_dimensions));
  std::vector<std::int64_t> result;
  for (const json& item : value) {
    const bool fits =
        item.is_number_integer() &&
        (!item.is_number_unsigned() ||
         item.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
    if (!fits) refuse(name, "expected integers");
    const auto number = item.get<std::int64_t>();
    if (number < 0 && !negative_allowed) refuse(name, fmt::format("{} is negative", number));
    if (number > static_cast<std::int64_t>(max_bytes) || number < -static_cast<std::int64_t>(max_bytes))
      refuse(name, fmt::format("{} is past 2^48", number));
    result.push_back(number);
  }
  return result;
}

void exact_fields(const json& object, std::string_view what, std::initializer_list<std::string_view> names) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(names.begin(), names.end(), key) == names.end())
      refuse(what, fmt::format("unknown field \"{}\"", vmm::printable(key, 64)));
  }
}

[[noreturn]] void refuse_extent(std::uint64_t bytes) {
  refuse("tensor", fmt::format("its elements reach outside the {} bytes shared", bytes));
}

// a * b + c, refused (as reaching outside) where it overflows.
std::int64_t multiply_add(std::int64_t a, std::int64_t b, std::int64_t c, std::uint64_t bytes) {
  std::int64_t product = 0;
  std::int64_t sum = 0;
  if (__builtin_mul_overflow(a, b, &product) || __builtin_add_overflow(product, c, &sum))
    refuse_extent(bytes);
  return sum;
}

// Refuses a layout whose elements reach outside `bytes` bytes.
void check_extent(const array_layout& layout, int item_size, std::uint64_t bytes) {
  const std::int64_t scale = layout.kind == array_layout::library::torch ? item_size : 1;
  std::int64_t low = multiply_add(layout.offset, scale, 0, bytes);
  std::int64_t high = low;
  for (std::size_t d = 0; d < layout.shape.size(); ++d) {
    if (layout.shape[d] == 0) return;  // no element: nothing is read
    const std::int64_t reach =
        multiply_add(multiply_add(layout.shape[d] - 1, layout.strides[d], 0, bytes), scale, 0, bytes);
    std::int64_t& end = reach < 0 ? low : high;
    end = multiply_add(1, end, reach, bytes);
  }
  if (low < 0 || multiply_add(1, high, item_size, bytes) > static_cast<std::int64_t>(bytes))
    refuse_extent(bytes);
}

array_layout parse_layout(const json& object, std::uint64_t bytes) {
  if (!object.is_object()) refuse("tensor", "expected null or an object");
  array_layout layout;
  const std::string kind = string_field(object, "kind");
  int item_size = 0;
  if (kind == "torch") {
    exact_fields(object, "tensor", {"kind", "dtype", "shape", "stride", "storage_offset"});
    layout.dtype = string_field(object, "dtype");
    item_size = torch_item_size(layout.dtype);
    if (item_size == 0)
      refuse("tensor.dtype", fmt::format("\"{}\" is not a torch dtype", vmm::printable(layout.dtype, 64)));
    layout.shape = integers_field(object, "shape", false);
    layout.strides = integers_field(object, "stride", false);
    layout.offset = static_cast<std::int64_t>(unsigned_field(object, "storage_offset", max_bytes));
  } else if (kind == "cupy") {
    layout.kind = array_layout::library::cupy;
    exact_fields(object, "tensor", {"kind", "dtype", "shape", "strides", "offset"});
    layout.dtype = string_field(object, "dtype");
    item_size = numpy_item_size(layout.dtype);
    if (item_size == 0)
      refuse("tensor.dtype",
             fmt::format("\"{}\" is not a numpy type string", vmm::printable(layout.dtype, 64)));
    layout.shape = integers_field(object, "shape", false);
    layout.strides = integers_field(object, "strides", true);
    layout.offset = static_cast<std::int64_t>(unsigned_field(object, "offset", max_bytes));
  } else {
    refuse("tensor.kind", fmt::format("\"{}\" is neither torch nor cupy", vmm::printable(kind, 64)));
  }
  if (layout.shape.size() != layout.strides.size()) refuse("tensor", "shape and strides differ in length");
  check_extent(layout, item_size, bytes);
  return layout;
}

}  // namespace

handle_header parse_handle_header(std::string_view text) {
  if (text.size() > max_handle_header_bytes)
    refuse("size", fmt::format("{} bytes, past {}", text.size(), max_handle_header_bytes));
  const json object = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) refuse("text", "not JSON");
  if (!object.is_object()) refuse("text", "not a JSON object");
  exact_fields(object, "text",
               {"manifest", "fds", "dtype", "length", "read_only", "offset", "lease", "tensor"});
  handle_header header;
  header.manifest_bytes = unsigned_field(object, "manifest", max_manifest_bytes);
  header.fds = unsigned_field(object, "fds", max_fds);
  header.dtype = string_field(object, "dtype");
  const int item_size = numpy_item_size(header.dtype);
  if (item_size == 0)
    refuse("dtype", fmt::format("\"{}\" is not a numpy type string", vmm::printable(header.dtype, 64)));
  if (!field(object, "length").is_null())
    header.length = unsigned_field(object, "length", max_bytes / item_size);
  header.read_only = bool_field(object, "read_only");
  header.offset = unsigned_field(object, "offset", max_bytes);
  header.lease = bool_field(object, "lease");
  if (header.lease && header.fds == 0) refuse("lease", "a lease travels as a descriptor, and fds is 0");
  const json& tensor = field(object, "tensor");
  if (!tensor.is_null()) {
    if (!header.length || item_size != 1) refuse("tensor", "a layout needs the length of its bytes, as |u1");
    header.tensor = parse_layout(tensor, *header.length);
  }
  return header;
}

std::string serialize(const handle_header& header) {
  json object = {{"manifest", header.manifest_bytes},
                 {"fds", header.fds},
                 {"dtype", header.dtype},
                 {"length", nullptr},
                 {"read_only", header.read_only},
                 {"offset", header.offset},
                 {"lease", header.lease},
                 {"tensor", nullptr}};
  if (header.length) object["length"] = *header.length;
  if (header.tensor) {
    const array_layout& layout = *header.tensor;
    const bool torch = layout.kind == array_layout::library::torch;
    object["tensor"] = {{"kind", torch ? "torch" : "cupy"},
                        {"dtype", layout.dtype},
                        {"shape", layout.shape},
                        {torch ? "stride" : "strides", layout.strides},
                        {torch ? "storage_offset" : "offset", layout.offset}};
  }
  std::string text = object.dump();
  (void)parse_handle_header(text);  // the same rules on the way out
  return text;
}

}  // namespace vmm_python
