#pragma once
/// @file
/// Command-line sizes and counts of the benchmark programs' own options (--size=, --append=, ...), taken
/// out of argv before Google Benchmark sees it. Shared by C++ and CUDA C++ translation units.

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "vmm/byte_size.hpp"
#include "vmm/error.hpp"

namespace vmm::bench {

/// A size of at least one byte, read by vmm::parse_byte_size (vmm/byte_size.hpp: "4096",
/// "64M", "64MiB", "1.5G"; binary multiples). `option` names the flag in the error.
/// @throws std::invalid_argument (vmm::invalid_argument) anything the parser refuses, or zero.
inline std::uint64_t parse_size(const char* option, const char* text) {
  try {
    const std::uint64_t bytes = vmm::parse_byte_size(text);
    if (bytes == 0) throw vmm::invalid_argument("zero bytes: expected at least 1");
    return bytes;
  } catch (const vmm::invalid_argument& error) {
    throw vmm::invalid_argument(std::string(option) + text + ": " + error.what());
  }
}

/// A whole number of at least `least`, in decimal ("8"); `option` names the flag in the error.
/// @throws std::invalid_argument anything else, or a value past INT_MAX.
inline int parse_count(const char* option, const char* text, int least) {
  char* rest = nullptr;
  errno = 0;
  const long value = std::strtol(text, &rest, 10);
  if (rest == text || *rest != '\0' || errno != 0 || value < least || value > INT_MAX)
    throw std::invalid_argument(std::string(option) + text + ": expected a whole number of at least " +
                                std::to_string(least));
  return static_cast<int>(value);
}

/// A decimal number greater than `above` and at most `most` ("1.5"); `option` names the flag.
/// @throws std::invalid_argument anything else (empty, trailing text, inf, nan, out of range).
inline double parse_ratio(const char* option, const char* text, double above, double most) {
  char* rest = nullptr;
  errno = 0;
  const double value = std::strtod(text, &rest);
  if (rest == text || *rest != '\0' || errno != 0 || !(value > above && value <= most)) {
    char range[96];
    std::snprintf(range, sizeof range, "a number greater than %g and at most %g", above, most);
    throw std::invalid_argument(std::string(option) + text + ": expected " + range);
  }
  return value;
}

/// One of a program's own options: "--size=" and what to do with the text after it (which
/// may throw std::invalid_argument, as parse_size and parse_count do).
struct option {
  std::string_view name;
  std::function<void(const char*)> take;
};

/// Takes the program's own options out of argv, leaving the rest for Google Benchmark.
/// Returns false after printing "program: why" when one is bad.
inline bool take_options(int& argc, char** argv, const char* program, std::initializer_list<option> options) {
  int kept = 1;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg(argv[i]);
      const auto found = std::find_if(options.begin(), options.end(),
                                      [&](const option& o) { return arg.starts_with(o.name); });
      if (found != options.end())
        found->take(argv[i] + found->name.size());
      else
        argv[kept++] = argv[i];
    }
  } catch (const std::invalid_argument& error) {
    std::fprintf(stderr, "%s: %s\n", program, error.what());
    return false;
  }
  argc = kept;
  return true;
}

}  // namespace vmm::bench
