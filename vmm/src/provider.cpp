#include "vmm/provider.hpp"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <vector>

#include "providers/driver_provider.hpp"
#include "providers/os_host_provider.hpp"
#include "vmm/error.hpp"

namespace vmm {

void memory_provider::set_access(std::uintptr_t address, std::size_t size, access_mode mode) {
  std::vector<access_grant> grants;
  for (const location& accessor : default_accessors()) grants.push_back({accessor, mode});
  set_access(address, size, grants);
}

const char* to_string(handle_kind kind) noexcept {
  switch (kind) {
    case handle_kind::none:
      return "none";
    case handle_kind::posix_fd:
      return "posix fd";
    case handle_kind::fabric:
      return "fabric";
  }
  return "unknown handle kind";
}

interprocess_event_handle host_event_token() noexcept {
  constexpr char text[] = "vmm host event: always passed";
  interprocess_event_handle token;
  for (std::size_t i = 0; i < sizeof text; ++i) token.bytes[i] = static_cast<std::byte>(text[i]);
  return token;
}

std::shared_ptr<memory_provider> provider_for(location where) {
  // Never destroyed: objects with static storage may still release memory at exit.
  static auto* const providers = new std::map<location, std::shared_ptr<memory_provider>>();
  static auto* const mutex = new std::mutex();
  std::lock_guard lock(*mutex);
  if (auto it = providers->find(where); it != providers->end()) return it->second;
  std::shared_ptr<memory_provider> created;
  switch (where.kind) {
    case memory_kind::os_host:
      if (where.id != 0)
        throw invalid_argument(fmt::format("os host memory has no location id {}", where.id));
      created = make_os_host_provider(std::size_t{2} << 20);
      break;
    case memory_kind::device:
    case memory_kind::pinned_host:
      created = std::make_shared<detail::driver_provider>(where);
      break;
    default:
      throw invalid_argument(fmt::format("unknown memory kind {}", static_cast<int>(where.kind)));
  }
  providers->emplace(where, created);
  return created;
}

std::shared_ptr<memory_provider> make_os_host_provider(std::size_t granularity) {
  return std::make_shared<detail::os_host_provider>(granularity);
}

std::size_t round_up(std::size_t size, std::size_t granularity) {
  const std::size_t rounded = (size + granularity - 1) & ~(granularity - 1);
  if (rounded < size)
    throw invalid_argument(fmt::format("size {} overflows when rounded up to {}", size, granularity));
  return rounded;
}

}  // namespace vmm
