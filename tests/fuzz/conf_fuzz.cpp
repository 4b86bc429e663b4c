/// @file
/// Fuzz target: the VMM_CONF parser of the Python package (python/native/conf.hpp) on raw
/// bytes, the text of an environment variable.
///
/// Whatever the bytes, parse_conf either throws vmm::invalid_argument, whose message starts
/// with "VMM_CONF: " and holds printable ASCII only (outside bytes are escaped), or returns
/// settings: a headroom from 0 to 1, a large page size of 0 or a power of two up to 1 GiB, and
/// settings that, written back in VMM_CONF's form, parse to the same settings.

#include <fmt/format.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "conf.hpp"
#include "fuzz_support.hpp"
#include "vmm/error.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using vmm::fuzz::finding;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  vmm_python::conf_settings settings;
  try {
    settings = vmm_python::parse_conf(text);
  } catch (const vmm::invalid_argument& error) {
    const std::string_view message = error.what();
    if (!message.starts_with("VMM_CONF: "))
      finding(fmt::format("a refusal without its variable: {}", message));
    for (const char c : message) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
        finding(fmt::format("a refusal with an unescaped byte 0x{:02x}", static_cast<unsigned char>(c)));
    }
    return 0;
  } catch (const std::exception& error) {
    finding(fmt::format("parse_conf threw something other than invalid_argument: {}", error.what()));
  }

  if (settings.headroom && !(*settings.headroom >= 0 && *settings.headroom <= 1))
    finding(fmt::format("accepted a headroom of {}", *settings.headroom));
  if (settings.large_page_size && *settings.large_page_size != 0 &&
      (!std::has_single_bit(*settings.large_page_size) ||
       *settings.large_page_size > vmm::memory_resource::largest_large_page_size))
    finding(fmt::format("accepted a large page size of {}", *settings.large_page_size));
  std::string again;
  const auto add = [&again](const std::string& pair) { again += (again.empty() ? "" : ",") + pair; };
  if (settings.max_size) add(fmt::format("max_size:{}", *settings.max_size));
  if (settings.release_threshold)
    add(settings.release_threshold->has_value()
            ? fmt::format("release_threshold:{}", **settings.release_threshold)
            : std::string("release_threshold:none"));
  if (settings.headroom) add(fmt::format("headroom:{}", *settings.headroom));  // shortest round trip
  if (settings.large_page_size) add(fmt::format("large_page_size:{}", *settings.large_page_size));
  vmm_python::conf_settings reread;
  try {
    reread = vmm_python::parse_conf(again);
  } catch (const std::exception& error) {
    finding(fmt::format("the settings written back as \"{}\" do not parse: {}", again, error.what()));
  }
  if (reread.max_size != settings.max_size || reread.release_threshold != settings.release_threshold ||
      reread.headroom != settings.headroom || reread.large_page_size != settings.large_page_size)
    finding(fmt::format("the settings written back as \"{}\" parse to other settings", again));
  return 0;
}
