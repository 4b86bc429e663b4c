#pragma once
// The peer-access check of striped_buffer, apart so that tests can call it with a
// stand-in for the driver's answer.

#include <span>

#include "vmm/location.hpp"

namespace vmm::detail {

// Throws vmm::invalid_argument naming both devices for the first GPU accessor in `access`
// (mode other than none) that `can_access(accessor, holder)` says cannot reach a holder in
// `holders` (accessor != holder). striped_buffer calls it with vmm::can_access_peer.
void require_peer_access(std::span<const int> holders, std::span<const access_grant> access,
                         bool (*can_access)(int accessor, int holder));

}  // namespace vmm::detail
