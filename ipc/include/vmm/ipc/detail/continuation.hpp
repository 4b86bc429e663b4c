#pragma once
// The continuation messages of a manifest's transport (vmm/ipc/manifest.hpp): exactly 8
// payload bytes, manifest_continuation_magic and the continuation's number, both u32
// little-endian. Written by send_manifest, read by the importer.
//
// Internal (vmm/ipc/detail/): installed for vmm::store, which builds on it, and not part of
// vmm::ipc's interface: it may change in any release without notice.

#include <vmm/ipc/manifest.hpp>

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include <vmm/ipc/fd_channel.hpp>

#include <algorithm>

#include "vmm/ipc/detail/little_endian.hpp"

namespace vmm::ipc::detail {

inline std::array<std::byte, 8> continuation_payload(std::uint32_t index) {
  std::array<std::byte, 8> payload{};
  store<std::uint32_t>(payload, 0, manifest_continuation_magic);
  store<std::uint32_t>(payload, 4, index);
  return payload;
}

// The messages that carry a manifest: its bytes with the first max_fds_per_message
// descriptors, then a continuation per further batch. Calls message(payload, fds) for each.
template <class Message>
void for_each_manifest_message(std::span<const std::byte> bytes, std::span<const int> fds,
                               Message&& message) {
  std::size_t sent = std::min(fds.size(), max_fds_per_message);
  message(bytes, fds.first(sent));
  for (std::uint32_t index = 1; sent < fds.size(); ++index) {
    const std::size_t count = std::min(fds.size() - sent, max_fds_per_message);
    const std::array<std::byte, 8> payload = continuation_payload(index);
    message(std::span<const std::byte>(payload), fds.subspan(sent, count));
    sent += count;
  }
}

// Throws bad_manifest unless `payload` is continuation number `index`.
inline void check_continuation(std::span<const std::byte> payload, std::uint32_t index) {
  if (payload.size() != 8)
    throw bad_manifest(
        fmt::format("manifest: continuation {} has a payload of {} bytes, not 8", index, payload.size()));
  if (const auto magic = load<std::uint32_t>(payload, 0); magic != manifest_continuation_magic)
    throw bad_manifest(fmt::format("manifest: continuation {} has bad magic {:#010x}", index, magic));
  if (const auto number = load<std::uint32_t>(payload, 4); number != index)
    throw bad_manifest(fmt::format("manifest: continuation {} arrived where {} was due", number, index));
}

}  // namespace vmm::ipc::detail
