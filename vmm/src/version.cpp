#include "vmm/version.hpp"

namespace vmm {

library_version version() noexcept {
  return {VMM_VERSION_MAJOR, VMM_VERSION_MINOR, VMM_VERSION_PATCH, VMM_VERSION_STRING};
}

}  // namespace vmm
