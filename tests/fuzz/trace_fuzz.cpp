/// @file
/// Fuzz target: vmm-replay's trace reader (vmm/tools/trace.hpp), vmm::tools::parse_trace on
/// raw bytes.
///
/// The input is a trace file's text. Whatever the bytes, parse_trace either throws
/// vmm::tools::trace_error or returns events that keep the reader's promises: at least one;
/// every id dense (below the count of allocations), each allocation's id the next one in
/// order, every free of an id live at that point; sizes at most 2^48, stream numbers at most
/// 1023 and `streams` one past the largest; line numbers rising and within the text.

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string_view>
#include <vector>

#include "../../vmm/tools/trace.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using vmm::fuzz::finding;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  vmm::tools::trace parsed;
  try {
    parsed = vmm::tools::parse_trace(text, "fuzz");
  } catch (const vmm::tools::trace_error& error) {
    if (std::string_view(error.what()).substr(0, 5) != "fuzz:")
      finding(fmt::format("a refusal that does not name the trace: {}", error.what()));
    return 0;
  } catch (const std::exception& error) {
    finding(fmt::format("parse_trace threw something other than trace_error: {}", error.what()));
  }

  if (parsed.events.empty()) finding("parse_trace accepted a trace without events");
  const std::size_t lines = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')) + 1;
  std::vector<bool> live(parsed.allocations, false);
  std::uint64_t next_id = 0;
  std::uint32_t streams = 1;
  std::size_t last_line = 0;
  for (const vmm::tools::trace_event& e : parsed.events) {
    if (e.line <= last_line || e.line > lines)
      finding(fmt::format("line {} after line {}, in a text of {} lines", e.line, last_line, lines));
    last_line = e.line;
    if (e.id >= parsed.allocations)
      finding(fmt::format("id {} past the {} allocations", e.id, parsed.allocations));
    if (e.allocate) {
      if (e.id != next_id) finding(fmt::format("allocation id {}, expected the next, {}", e.id, next_id));
      ++next_id;
      if (e.bytes > vmm::tools::trace_size_limit) finding(fmt::format("a size of {} bytes", e.bytes));
      if (e.stream > vmm::tools::trace_stream_limit) finding(fmt::format("stream number {}", e.stream));
      streams = std::max(streams, e.stream + 1);
      live[e.id] = true;
    } else {
      if (!live[e.id]) finding(fmt::format("a free of id {}, which is not live", e.id));
      live[e.id] = false;
    }
  }
  if (next_id != parsed.allocations)
    finding(fmt::format("{} allocations counted, {} in the events", parsed.allocations, next_id));
  if (streams != parsed.streams)
    finding(fmt::format("streams {}, the events use {}", parsed.streams, streams));
  return 0;
}
