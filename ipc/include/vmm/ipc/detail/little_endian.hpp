#pragma once
// Fixed-width integers in the little-endian byte order of vmm's wire formats (manifests,
// hand-off messages), whatever the host's order. Callers check the bounds first.
//
// Internal (vmm/ipc/detail/): installed for vmm::store, which builds on it, and not part of
// vmm::ipc's interface: it may change in any release without notice.

#include <cstddef>
#include <cstdint>
#include <span>

namespace vmm::ipc::detail {

template <class T>
void store(std::span<std::byte> bytes, std::size_t at, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    bytes[at + i] = static_cast<std::byte>(static_cast<std::uint8_t>(value >> (8 * i)));
}

template <class T>
T load(std::span<const std::byte> bytes, std::size_t at) {
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i)
    value |= static_cast<T>(static_cast<T>(std::to_integer<std::uint8_t>(bytes[at + i])) << (8 * i));
  return value;
}

}  // namespace vmm::ipc::detail
