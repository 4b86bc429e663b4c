#include "trace.hpp"

#include "vmm/error.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <unordered_map>

namespace vmm::tools {
namespace {

// At most 80 bytes of a line for a message.
std::string printable(std::string_view line) {
  return vmm::printable(line, 80);
}

// The fields of a line, split at spaces and tabs.
std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t at = 0;
  while (true) {
    at = line.find_first_not_of(" \t\r", at);
    if (at == std::string_view::npos) return fields;
    const std::size_t end = std::min(line.find_first_of(" \t\r", at), line.size());
    fields.push_back(line.substr(at, end - at));
    at = end;
  }
}

// A line's check: parses its fields and throws the trace_error naming the line.
class line_reader {
 public:
  line_reader(std::string_view name, std::size_t number, std::string_view line)
      : name_(name), number_(number), line_(line) {}

  [[noreturn]] void fail(std::string_view why) const {
    throw trace_error(fmt::format("{}:{}: {}: \"{}\"", name_, number_, why, printable(line_)));
  }

  // The decimal field `text`, called `what` in messages ("size"), at most `most`.
  std::uint64_t number(std::string_view text, std::string_view what, std::uint64_t most,
                       std::string_view limit) const {
    if (text.front() == '-') fail(fmt::format("a negative {} ({})", what, text));
    std::uint64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error == std::errc::result_out_of_range)
      fail(fmt::format("{} {} is out of range (past 2^64 - 1)", what, text));
    if (error != std::errc() || end != text.data() + text.size())
      fail(fmt::format("the {} {} is not a whole number", what, text));
    if (value > most) fail(fmt::format("a {} past {} ({})", what, limit, text));
    return value;
  }

 private:
  std::string_view name_;
  std::size_t number_;
  std::string_view line_;
};

}  // namespace

trace parse_trace(std::string_view text, std::string_view name) {
  trace parsed;
  std::unordered_map<std::uint64_t, std::uint64_t> live;  // trace id -> dense id
  std::size_t number = 0;
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++number;
    if (line.empty() || line[0] == '#') continue;
    const line_reader check(name, number, line);
    const std::vector<std::string_view> fields = fields_of(line);
    const std::string_view kind = fields.empty() ? std::string_view() : fields[0];
    constexpr std::uint64_t any = UINT64_MAX;
    if (kind == "a") {
      if (fields.size() < 4) check.fail("an allocation needs an id, a size and a stream number");
      if (fields.size() > 4) check.fail("extra fields");
      const std::uint64_t id = check.number(fields[1], "id", any, "");
      const std::uint64_t bytes = check.number(fields[2], "size", trace_size_limit, "2^48 bytes");
      const auto stream =
          static_cast<std::uint32_t>(check.number(fields[3], "stream number", trace_stream_limit, "1023"));
      if (!live.emplace(id, parsed.allocations).second)
        check.fail(fmt::format("allocation id {} is live already", id));
      parsed.events.push_back({true, stream, parsed.allocations++, bytes, number});
      parsed.streams = std::max(parsed.streams, stream + 1);
    } else if (kind == "f") {
      if (fields.size() < 2) check.fail("a free needs an id");
      if (fields.size() > 2) check.fail("extra fields");
      const std::uint64_t id = check.number(fields[1], "id", any, "");
      const auto it = live.find(id);
      if (it == live.end()) check.fail(fmt::format("free of id {}, which is not live", id));
      parsed.events.push_back({false, 0, it->second, 0, number});
      live.erase(it);
    } else {
      check.fail("a line must start with 'a' or 'f'");
    }
  }
  if (parsed.events.empty()) throw trace_error(fmt::format("{}: no events", name));
  return parsed;
}

namespace {

// The whole file, decompressed if it is gzip (zlib reads plain files as they are).
std::string read_file(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw trace_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string text;
  std::vector<char> buffer(1 << 16);
  int read = 0;
  while ((read = gzread(file, buffer.data(), static_cast<unsigned>(buffer.size()))) > 0)
    text.append(buffer.data(), static_cast<std::size_t>(read));
  int code = 0;
  const char* message = gzerror(file, &code);
  const std::string why = message != nullptr ? message : "read error";  // gzclose frees message
  gzclose(file);
  if (read < 0 || (code != Z_OK && code != Z_STREAM_END))
    throw trace_error(fmt::format("{}: not a readable trace ({})", path, why));
  return text;
}

}  // namespace

trace read_trace(const std::string& path) {
  return parse_trace(read_file(path), path);
}

std::string trace_line(const std::string& path, std::size_t number) {
  std::string text;
  try {
    text = read_file(path);
  } catch (const trace_error&) {
    return "";
  }
  std::size_t start = 0;
  for (std::size_t line = 1; line < number && start != std::string::npos; ++line) {
    start = text.find('\n', start);
    if (start != std::string::npos) ++start;
  }
  if (start == std::string::npos || start >= text.size()) return "";
  const std::size_t end = std::min(text.find('\n', start), text.size());
  return printable(std::string_view(text).substr(start, end - start));
}

}  // namespace vmm::tools
