#pragma once
// Reading and writing any provider's memory from a test, through the provider itself.

#include <cstdint>
#include <vector>

#include "vmm/provider.hpp"

namespace vmm::testing {

// A pattern that differs in every byte position and with every seed.
inline std::vector<std::uint8_t> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::uint8_t> bytes(n);
  std::uint32_t state = seed * 2654435761u + 1;
  for (auto& byte : bytes) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<std::uint8_t>(state >> 24);
  }
  return bytes;
}

inline void write_bytes(memory_provider& provider, std::uintptr_t address,
                        const std::vector<std::uint8_t>& bytes) {
  provider.executor().copy(reinterpret_cast<void*>(address), bytes.data(), bytes.size(), {});
  provider.executor().synchronize({});
}

inline std::vector<std::uint8_t> read_bytes(memory_provider& provider, std::uintptr_t address,
                                            std::size_t n) {
  std::vector<std::uint8_t> bytes(n);
  provider.executor().copy(bytes.data(), reinterpret_cast<const void*>(address), n, {});
  provider.executor().synchronize({});
  return bytes;
}

// FNV-1a, 64 bits: what the peer process sends back for the bytes it sees.
inline std::uint64_t checksum(const std::uint8_t* data, std::size_t n) {
  std::uint64_t hash = 14695981039346656037ull;
  for (std::size_t i = 0; i < n; ++i) hash = (hash ^ data[i]) * 1099511628211ull;
  return hash;
}

}  // namespace vmm::testing
