/// @file
/// Fuzz target: vmm::ipc::parse_manifest on raw bytes.
///
/// The input is the manifest's wire bytes, as they arrive in a message's payload. Whatever
/// the bytes, parsing either throws vmm::ipc::bad_manifest or returns a manifest that
/// validates and serializes back to exactly the same bytes (the format has no slack: every
/// reserved byte is zero and the length is what the counts say), and that parses again to
/// the same values.

#include <vmm/ipc/manifest.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <vector>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace ipc = vmm::ipc;
  using vmm::fuzz::finding;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  ipc::manifest parsed;
  try {
    parsed = ipc::parse_manifest(bytes);
  } catch (const ipc::bad_manifest&) {
    return 0;  // refused: what a forged manifest should get
  } catch (const std::exception& error) {
    finding(fmt::format("parse_manifest threw something other than bad_manifest: {}", error.what()));
  }

  std::vector<std::byte> again;
  try {
    ipc::validate(parsed);
    again = ipc::serialize(parsed);
  } catch (const std::exception& error) {
    finding(
        fmt::format("a manifest parse_manifest accepted does not validate or serialize: {}", error.what()));
  }
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0)
    finding(fmt::format("serialize(parse_manifest(bytes)) differs from the {} bytes parsed ({} bytes)", size,
                        again.size()));
  if (parsed.fd_count() > parsed.chunks.size())
    finding(fmt::format("fd_count() {} exceeds the {} chunks", parsed.fd_count(), parsed.chunks.size()));
  try {
    if (!(ipc::parse_manifest(again) == parsed)) finding("parse_manifest(serialize(m)) != m");
  } catch (const std::exception& error) {
    finding(fmt::format("serialized bytes do not parse again: {}", error.what()));
  }
  return 0;
}
