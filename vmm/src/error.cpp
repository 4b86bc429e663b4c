#include "vmm/error.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>

namespace vmm {
namespace {

void print_to_stderr(const char* what) noexcept {
  std::fprintf(stderr, "vmm: cleanup failed: %s\n", what);
}

std::atomic<cleanup_failure_handler> handler{&print_to_stderr};

}  // namespace

void report_cleanup_failure(const char* what) noexcept {
  handler.load()(what);
}

cleanup_failure_handler set_cleanup_failure_handler(cleanup_failure_handler next) noexcept {
  return handler.exchange(next != nullptr ? next : &print_to_stderr);
}

std::string printable(std::string_view text, std::size_t limit) {
  std::string shown;
  for (const char c : text.substr(0, limit)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '"' && c != '\\')
      shown += c;
    else
      shown += fmt::format("\\x{:02x}", byte);
  }
  if (text.size() > limit) shown += "...";
  return shown;
}

}  // namespace vmm
