// VMM_CONF (conf.hpp).

#include "conf.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <string>
#include <system_error>

#include "vmm/byte_size.hpp"
#include "vmm/error.hpp"

namespace vmm_python {
namespace {

constexpr std::array known_keys{std::string_view("max_size"), std::string_view("release_threshold"),
                                std::string_view("headroom"), std::string_view("large_page_size")};

std::string_view trimmed(std::string_view text) {
  const std::size_t first = text.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\n\r\f\v") - first + 1);
}

// Outside input as the messages show it.
std::string shown(std::string_view text) {
  return vmm::printable(text, 80);
}

// Bytes of a value, the byte-size parser's reason in the message.
std::size_t bytes_of(std::string_view key, std::string_view value) {
  try {
    return vmm::parse_byte_size(value);
  } catch (const vmm::invalid_argument& error) {
    throw vmm::invalid_argument(fmt::format("VMM_CONF: {}:{}: {}", key, shown(value), error.what()));
  }
}

double share_of(std::string_view key, std::string_view value) {
  double share = -1;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), share);
  // from_chars reads "nan" and "inf" too: the range check refuses both.
  if (error != std::errc() || end != value.data() + value.size() || !(share >= 0.0 && share <= 1.0))
    throw vmm::invalid_argument(
        fmt::format("VMM_CONF: {}:{}: expected a share from 0 to 1, as 0.0078", key, shown(value)));
  return share;
}

}  // namespace

void check_large_page_size(std::size_t bytes, std::string_view who) {
  if (bytes != 0 && (!std::has_single_bit(bytes) || bytes > vmm::memory_resource::largest_large_page_size))
    throw vmm::invalid_argument(fmt::format(
        "{}: large_page_size {} is not a power of two up to 1GiB (2MiB, 32MiB, 256MiB, ...)", who, bytes));
}

conf_settings parse_conf(std::string_view text) {
  conf_settings settings;
  if (trimmed(text).empty()) return settings;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    start = comma + 1;
    const std::size_t colon = item.find(':');
    const std::string_view key = trimmed(item.substr(0, colon));
    const std::string_view value =
        colon == std::string_view::npos ? std::string_view() : trimmed(item.substr(colon + 1));
    if (colon == std::string_view::npos || key.empty() || value.empty())
      throw vmm::invalid_argument(
          fmt::format("VMM_CONF: \"{}\" is not key:value (in \"{}\")", shown(trimmed(item)), shown(text)));
    const bool repeated =
        (key == known_keys[0] && settings.max_size) || (key == known_keys[1] && settings.release_threshold) ||
        (key == known_keys[2] && settings.headroom) || (key == known_keys[3] && settings.large_page_size);
    if (repeated) throw vmm::invalid_argument(fmt::format("VMM_CONF: {} is given twice", key));
    if (key == known_keys[0]) {
      settings.max_size = bytes_of(key, value);
    } else if (key == known_keys[1]) {
      const bool never = value.size() == 4 && (value[0] | 0x20) == 'n' && (value[1] | 0x20) == 'o' &&
                         (value[2] | 0x20) == 'n' && (value[3] | 0x20) == 'e';
      settings.release_threshold = never ? std::optional<std::size_t>() : bytes_of(key, value);
    } else if (key == known_keys[2]) {
      settings.headroom = share_of(key, value);
    } else if (key == known_keys[3]) {
      settings.large_page_size = bytes_of(key, value);
      check_large_page_size(*settings.large_page_size, "VMM_CONF");
    } else {
      throw vmm::invalid_argument(
          fmt::format("VMM_CONF: unknown key \"{}\" (known: {})", shown(key), fmt::join(known_keys, ", ")));
    }
  }
  return settings;
}

}  // namespace vmm_python
