#pragma once
// Reading and writing any provider's memory from a test, through the provider itself.

#include <setjmp.h>
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
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

// FNV-1a of the first `sample` bytes of every `block` bytes of [address, address + n): a
// checksum of large memory that reads a little of every chunk.
inline std::uint64_t sampled_checksum(memory_provider& provider, std::uintptr_t address, std::size_t n,
                                      std::size_t block, std::size_t sample) {
  std::vector<std::uint8_t> bytes;
  for (std::size_t at = 0; at < n; at += block) {
    const std::vector<std::uint8_t> part = read_bytes(provider, address + at, std::min(sample, n - at));
    bytes.insert(bytes.end(), part.begin(), part.end());
  }
  return checksum(bytes.data(), bytes.size());
}

namespace write_fault {
inline sigjmp_buf jump;
inline void on_signal(int) {
  siglongjmp(jump, 1);
}
}  // namespace write_fault

// Writes over [data, data + n) through the provider; true when the write faulted (a
// signal, for host memory) or was refused (an exception, for a GPU: the driver refuses a
// write to a read-only mapping, CUDA_ERROR_INVALID_VALUE, or faults on it later). `who`
// prefixes the line that says so on stderr. For peer processes checking read-only access.
inline bool write_faults(memory_provider& provider, void* data, std::size_t n, const char* who) {
  struct sigaction action {};
  action.sa_handler = write_fault::on_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_segv {};
  struct sigaction old_bus {};
  sigaction(SIGSEGV, &action, &old_segv);
  sigaction(SIGBUS, &action, &old_bus);
  volatile bool faulted = false;
  if (sigsetjmp(write_fault::jump, 1) == 0) {
    try {
      provider.executor().fill(data, 0xff, n, {});
      provider.executor().synchronize({});
    } catch (const std::exception& error) {
      std::fprintf(stderr, "%s: the write failed as it must: %s\n", who, error.what());
      faulted = true;
    }
  } else {
    faulted = true;
  }
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  return faulted;
}

}  // namespace vmm::testing
