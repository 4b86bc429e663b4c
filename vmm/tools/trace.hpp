#pragma once
/// @file
/// vmm-replay's allocation traces (docs/tools.md): text, gzip-compressed or not, one event a
/// line, '#' starting a comment line:
///
///     a <id> <bytes> <stream>   allocate <bytes> on stream number <stream> (0 to 1023)
///     f <id>                    free allocation <id> (on the stream it was allocated on)
///
/// Fields are decimal integers separated by spaces or tabs. Nothing of a trace is trusted:
/// every line is checked (its kind, its fields and their count, an id neither reused while
/// live nor freed when not live, a size from 0 to 2^48, a stream number to 1023), and a
/// refusal names the trace, the line number, what is wrong and the line's text.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace vmm::tools {

/// The largest allocation a trace may ask for.
inline constexpr std::uint64_t trace_size_limit = std::uint64_t{1} << 48;
/// The largest stream number a trace may use.
inline constexpr std::uint32_t trace_stream_limit = 1023;

/// One event of a trace. Ids are renumbered densely: the n-th allocation has id n - 1, so a
/// replay can keep its live set in a vector indexed by id.
struct trace_event {
  bool allocate = false;
  std::uint32_t stream = 0;  ///< allocations only
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;  ///< allocations only
  std::size_t line = 0;     ///< where in the trace, from 1
};

/// A trace's events, never empty, and how many streams they use.
struct trace {
  std::vector<trace_event> events;
  std::uint32_t streams = 1;
  std::size_t allocations = 0;  ///< dense ids are below this
};

/// A trace that cannot be read or is malformed; what() names it, and the line where one is at
/// fault.
class trace_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Parses and checks the trace `text`; `name` names it in messages (its path).
/// @throws vmm::tools::trace_error the first malformed line, or no events at all.
/// @throws std::bad_alloc
[[nodiscard]] trace parse_trace(std::string_view text, std::string_view name);

/// Reads the file `path` (gzip-compressed or not) and parses it.
/// @throws vmm::tools::trace_error it cannot be opened or read, or parse_trace refuses it.
/// @throws std::bad_alloc
[[nodiscard]] trace read_trace(const std::string& path);

/// Line `number` (from 1) of the file `path`, shown as messages show lines (at most 80 bytes,
/// bytes outside printable ASCII as \\xNN); empty when the file or line cannot be read. For
/// a message about an event, after the trace itself is gone.
/// @throws std::bad_alloc
[[nodiscard]] std::string trace_line(const std::string& path, std::size_t number);

}  // namespace vmm::tools
