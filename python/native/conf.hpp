#pragma once
/// @file
/// VMM_CONF: the settings of vmm.torch.use() and vmm.cupy.use() from the environment, in
/// PYTORCH_CUDA_ALLOC_CONF's form: comma-separated `key:value` pairs, blanks around keys and
/// values ignored, e.g. `max_size:40G,headroom:0.0078,release_threshold:8GiB`.
///
/// Keys: `max_size` (bytes, vmm::parse_byte_size: 4096, 512MiB, 40G), `release_threshold`
/// (bytes, or `none`: keep idle pages until a trim), `headroom` (a decimal share from 0 to 1),
/// `large_page_size` (bytes: a power of two up to 1GiB, check_large_page_size).
/// Parsing is strict: an unknown, repeated or empty key, a missing value or a bad one is
/// refused with a message that starts with "VMM_CONF: " and names it.
#include <cstddef>
#include <optional>
#include <string_view>

#include "vmm/memory_resource.hpp"

namespace vmm_python {

/// What a VMM_CONF text sets; an absent key is nullopt.
struct conf_settings {
  std::optional<std::size_t> max_size;
  /// Set to nullopt inside when the text says `none`.
  std::optional<std::optional<std::size_t>> release_threshold;
  std::optional<double> headroom;
  std::optional<std::size_t> large_page_size;
};

/// Refuses a large page size that is not 0 (vmm's default) or a power of two up to
/// vmm::memory_resource::largest_large_page_size (1 GiB),
/// the message starting with `who`. The resource checks the rest when it is made: a multiple
/// of its location's granularity (2 MiB on NVIDIA GPUs; the granularity itself turns large
/// pages off).
/// @throws vmm::invalid_argument the size breaks that rule.
void check_large_page_size(std::size_t bytes, std::string_view who);

/// The settings of a VMM_CONF text (empty or blank: none).
/// @throws vmm::invalid_argument the text breaks a rule of the file comment (the message
///         names the pair and why).
[[nodiscard]] conf_settings parse_conf(std::string_view text);

}  // namespace vmm_python
