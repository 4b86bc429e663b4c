#pragma once
// What the parts of sharing that call the driver directly (interprocess_event.cpp,
// fabric.cpp) ask of a provider first: that there is one, and the GPU whose context its
// events and handles belong to.

#include <fmt/format.h>

#include <memory>

#include "vmm/error.hpp"
#include "vmm/provider.hpp"

namespace vmm::ipc {

// `provider`, or invalid_argument naming `who` when it is null.
inline const std::shared_ptr<memory_provider>& require_provider(
    const std::shared_ptr<memory_provider>& provider, const char* who) {
  if (provider == nullptr) throw invalid_argument(fmt::format("{}: the provider is null", who));
  return provider;
}

// The GPU whose context the memory's events and handles belong to; invalid_argument when no
// GPU accesses the memory.
inline int context_device(const memory_provider& provider) {
  for (const accessor& who : provider.capabilities().default_accessors)
    if (who.kind == accessor::kind_type::device) return who.device_ordinal;
  throw invalid_argument(
      fmt::format("{} memory is accessed by no GPU", to_string(provider.capabilities().where)));
}

}  // namespace vmm::ipc
