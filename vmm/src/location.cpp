#include "vmm/location.hpp"

#include <fmt/format.h>

#include "vmm/detail/enum_names.hpp"

namespace vmm {

std::string to_string(const location& where) {
  switch (where.kind) {
    case memory_kind::device:
      return fmt::format("gpu {}", where.id);
    case memory_kind::pinned_host:
      return fmt::format("pinned host (numa {})", where.id);
    case memory_kind::os_host:
      return where.id == 0 ? std::string("os host") : fmt::format("os host {}", where.id);
  }
  return fmt::format("unknown location kind {}", static_cast<int>(where.kind));
}

std::string to_string(const accessor& who) {
  if (who.kind == accessor::kind_type::device) return fmt::format("gpu {}", who.device_ordinal);
  return "the host";
}

const char* to_string(access_mode mode) noexcept {
  static constexpr detail::enum_name<access_mode> names[] = {{access_mode::none, "none"},
                                                             {access_mode::read_only, "read-only"},
                                                             {access_mode::read_write, "read-write"}};
  return detail::name_of(mode, names, "unknown access mode");
}

}  // namespace vmm
