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

namespace vmm::bench {

/// "64M", "4G", "1024", with K/M/G (either case) meaning 2^10/2^20/2^30. `option` names the
/// flag in the error.
/// @throws std::invalid_argument anything else, zero, or a value past 2^63.
inline std::uint64_t parse_size(const char* option, const char* text) {
  char* rest = nullptr;
  errno = 0;
  std::uint64_t value = std::strtoull(text, &rest, 10);
  int shift = 0;
  if (rest != text && *rest != '\0' && rest[1] == '\0') {
    switch (*rest) {
      case 'K':
      case 'k':
        shift = 10;
        ++rest;
        break;
      case 'M':
      case 'm':
        shift = 20;
        ++rest;
        break;
      case 'G':
      case 'g':
        shift = 30;
        ++rest;
        break;
      default:
        break;
    }
  }
  if (rest == text || *rest != '\0' || errno != 0 || *text == '-' || value == 0 ||
      value > (std::uint64_t{1} << (63 - shift)))
    throw std::invalid_argument(std::string(option) + text + ": expected a size such as 4096, 64M or 4G");
  return value << shift;
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
