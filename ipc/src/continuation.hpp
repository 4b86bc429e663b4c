#pragma once
// The continuation messages of a manifest's transport (vmm/ipc/manifest.hpp): exactly 8
// payload bytes, manifest_continuation_magic and the continuation's number, both u32
// little-endian. Written by send_manifest, read by the importer.

#include <vmm/ipc/manifest.hpp>

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "little_endian.hpp"

namespace vmm::ipc::detail {

inline std::array<std::byte, 8> continuation_payload(std::uint32_t index) {
  std::array<std::byte, 8> payload{};
  store<std::uint32_t>(payload, 0, manifest_continuation_magic);
  store<std::uint32_t>(payload, 4, index);
  return payload;
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
