#pragma once
/// @file
/// What every vmm tool's command line shares (vmm-info, vmm-replay, vmm-store; docs/tools.md):
/// CLI11 for the parsing, `--help` listing every option with its default, `--version`
/// printing vmm::version(), byte sizes read by vmm::parse_byte_size, and one set of exit
/// statuses.

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "vmm/byte_size.hpp"
#include "vmm/error.hpp"
#include "vmm/location.hpp"
#include "vmm/version.hpp"

namespace vmm::tools {

/// Exit statuses every tool uses (a tool may add its own from 3 up, documented in its --help).
inline constexpr int exit_done = 0;   ///< done; also --help and --version
inline constexpr int exit_error = 1;  ///< the work failed; the error is printed
inline constexpr int exit_usage = 2;  ///< a bad or unknown option or argument, named on stderr

/// An application named `program`, with --version and defaults shown in --help.
/// @throws std::bad_alloc only
inline void prepare(CLI::App& app) {
  app.set_version_flag("--version", fmt::format("{} {}", app.get_name(), vmm::version().text),
                       "Print the version of vmm and exit");
  app.option_defaults()->always_capture_default();
  app.get_formatter()->column_width(34);
}

/// Parses argv. Returns nothing when the program goes on; otherwise the status to exit with:
/// exit_done after printing --help or --version to stdout, exit_usage after printing what
/// is wrong (naming the option) and a pointer to --help to stderr.
/// @throws std::bad_alloc only
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ParseError& error) {
    std::fprintf(stderr, "%s: %s\nRun '%s --help' for the options.\n", app.get_name().c_str(), error.what(),
                 app.get_name().c_str());
    return exit_usage;
  }
}

/// Prints "PROGRAM: message" and the pointer to --help to stderr, as parse does for a bad
/// option; returns exit_usage. For what CLI11 does not check: a positional argument that is
/// required is checked after parsing, because CLI11 would report it missing before (and
/// instead of) naming an unknown option.
/// @throws std::bad_alloc only
inline int usage_error(const CLI::App& app, const std::string& message) {
  const CLI::App* root = &app;
  while (root->get_parent() != nullptr) root = root->get_parent();
  std::fprintf(stderr, "%s: %s\nRun '%s --help' for the options.\n", root->get_name().c_str(),
               message.c_str(), root->get_name().c_str());
  return exit_usage;
}

/// A byte-size option (vmm/byte_size.hpp: 4096, 64M, 64MiB, 1.5G) from `least` to `most`,
/// read into `bytes`; --help shows its default as format_byte_size(bytes), or `shown` when
/// that is given (e.g. "none").
/// @throws std::bad_alloc only
inline CLI::Option* add_byte_size(CLI::App& app, const std::string& name, std::uint64_t& bytes,
                                  const std::string& description, std::uint64_t least = 0,
                                  std::uint64_t most = UINT64_MAX, const std::string& shown = "") {
  const CLI::Validator size(
      [least, most](std::string& text) -> std::string {
        std::uint64_t value = 0;
        try {
          value = vmm::parse_byte_size(text);
        } catch (const vmm::invalid_argument& error) {
          return error.what();
        }
        const auto shown = [](std::uint64_t bytes) {
          return bytes < 1024 ? fmt::format("{} byte{}", bytes, bytes == 1 ? "" : "s")
                              : vmm::format_byte_size(bytes);
        };
        if (value < least || value > most)
          return fmt::format("{} is out of range: from {} to {}", text, shown(least), shown(most));
        text = std::to_string(value);
        return "";
      },
      "", "byte size");
  return app.add_option(name, bytes, description)
      ->type_name("SIZE")
      ->transform(size)
      ->default_str(shown.empty() ? vmm::format_byte_size(bytes) : shown);
}

/// A check that a number is from `low` to `high` (NaN refused, which CLI::Range lets pass).
/// @throws std::bad_alloc only
inline CLI::Validator number_from(double low, double high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        double value = 0;
        try {
          std::size_t used = 0;
          value = std::stod(text, &used);
          if (used != text.size()) return fmt::format("{} is not a number", text);
        } catch (const std::exception&) {
          return fmt::format("{} is not a number", text);
        }
        if (!(value >= low && value <= high))
          return fmt::format("{} is out of range: from {} to {}", text, low, high);
        return "";
      },
      fmt::format("in [{}, {}]", low, high), "number range");
}

/// A location as the tools write it: "os_host" (or "host") or "gpu<N>".
/// @throws vmm::invalid_argument anything else, naming the text.
inline location parse_location(const std::string& text) {
  if (text == "os_host" || text == "host") return location::os_host();
  if (text.rfind("gpu", 0) == 0) {
    const std::string number = text.substr(3);
    if (!number.empty() && number.find_first_not_of("0123456789") == std::string::npos && number.size() < 4)
      return location::device(std::stoi(number));
  }
  throw invalid_argument(fmt::format("--location {}: expected os_host, host or gpu<N>", text));
}

/// A check that an option is a location parse_location takes.
/// @throws std::bad_alloc only
inline CLI::Validator location_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          (void)parse_location(text);
          return "";
        } catch (const invalid_argument&) {
          return fmt::format("{}: expected os_host, host or gpu<N>", text);
        }
      },
      "", "location");
}

}  // namespace vmm::tools
