#include "vmm/location.hpp"

#include <fmt/format.h>

namespace vmm {

std::string to_string(const location& where) {
  switch (where.kind) {
    case memory_kind::device:
      return fmt::format("gpu {}", where.id);
    case memory_kind::pinned_host:
      return fmt::format("pinned host (numa {})", where.id);
    case memory_kind::os_host:
      return "os host";
  }
  return fmt::format("unknown location kind {}", static_cast<int>(where.kind));
}

std::string to_string(const accessor& who) {
  if (who.kind == accessor::kind_type::device) return fmt::format("gpu {}", who.device_ordinal);
  return "the host";
}

const char* to_string(access_mode mode) noexcept {
  switch (mode) {
    case access_mode::none:
      return "none";
    case access_mode::read_only:
      return "read-only";
    case access_mode::read_write:
      return "read-write";
  }
  return "unknown access mode";
}

}  // namespace vmm
