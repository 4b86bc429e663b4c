#include "vmm/physical_allocation.hpp"

#include <fcntl.h>
#include <fmt/format.h>

#include <cerrno>
#include <memory>
#include <new>
#include <utility>

#include "vmm/detail/cleanup.hpp"
#include "vmm/detail/retirement.hpp"
#include "vmm/detail/system.hpp"
#include "vmm/error.hpp"

namespace vmm {
namespace {

// A handle whose destroy failed (the failure was reported): the retirement list tries
// again at its next collection, so that a passing failure of the driver leaks nothing.
class undestroyed_handle final : public detail::retirable {
 public:
  undestroyed_handle(std::shared_ptr<memory_provider> provider, physical_handle handle) noexcept
      : provider_(std::move(provider)), handle_(handle) {}
  bool release() noexcept override { return destroy(provider_, handle_); }
  void abandon() noexcept override {}

  // Destroys `handle`; false (reported) when the provider refused for a reason that may
  // pass. A handle the provider does not hold (destroyed behind its owner's back) is reported
  // and given up, never tried again: its number may name a later allocation by then (an OS
  // provider's handles are file descriptors), which a retry would destroy.
  static bool destroy(const std::shared_ptr<memory_provider>& provider, physical_handle handle) noexcept {
    bool unknown = false;
    const bool destroyed = detail::cleanup("physical_allocation: destroy", [&] {
      try {
        provider->destroy(handle);
      } catch (const invalid_argument&) {
        unknown = true;
        throw;
      }
    });
    return destroyed || unknown;
  }

 private:
  std::shared_ptr<memory_provider> provider_;
  physical_handle handle_;
};

std::shared_ptr<memory_provider> require(std::shared_ptr<memory_provider> provider) {
  if (provider == nullptr) throw invalid_argument("physical_allocation: the provider is null");
  return provider;
}

}  // namespace

physical_allocation::physical_allocation(std::shared_ptr<memory_provider> provider, std::size_t size) {
  provider = require(std::move(provider));
  size = size == 0 ? 0 : round_up(size, provider->capabilities().granularity);
  const physical_handle handle = provider->create(size);
  held_ = {std::move(provider), handle, size};
}

physical_allocation::physical_allocation(std::shared_ptr<memory_provider> provider, physical_handle handle,
                                         std::size_t size) noexcept
    : held_(std::move(provider), handle, size) {}

physical_allocation physical_allocation::import_fd(std::shared_ptr<memory_provider> provider, int fd,
                                                   std::size_t size) {
  provider = require(std::move(provider));
  const physical_handle handle = provider->import_fd(fd, size);
  return physical_allocation(std::move(provider), handle, size);
}

physical_allocation physical_allocation::import_fd(std::shared_ptr<memory_provider> provider, unique_fd fd,
                                                   std::size_t size) {
  physical_allocation result = import_fd(std::move(provider), fd.get(), size);
  result.descriptor_ = std::move(fd);
  return result;
}

physical_allocation physical_allocation::adopt(std::shared_ptr<memory_provider> provider,
                                               physical_handle handle, std::size_t size) {
  provider = require(std::move(provider));
  provider->adopt(handle, size);
  return physical_allocation(std::move(provider), handle, size);
}

unique_fd physical_allocation::export_fd() const {
  if (provider() == nullptr) throw invalid_argument("physical_allocation: export of an empty allocation");
  if (!descriptor_) return provider()->export_fd(get());
  // The driver cannot export an imported handle: a duplicate of the descriptor it came from.
  unique_fd copy(os::fcntl(descriptor_.get(), F_DUPFD_CLOEXEC, 0));
  if (!copy) {
    const int error = errno;
    throw os_error(
        error,
        fmt::format("physical_allocation: export of {} bytes imported from fd {} (fcntl "
                    "F_DUPFD_CLOEXEC of the kept descriptor) failed{}",
                    size(), descriptor_.get(),
                    error == EMFILE ? ": the process's descriptor limit (RLIMIT_NOFILE) is reached" : ""));
  }
  return copy;
}

bool physical_allocation::destroy(const std::shared_ptr<memory_provider>& provider, physical_handle handle,
                                  std::size_t) noexcept {
  if (!undestroyed_handle::destroy(provider, handle)) {
    try {
      detail::retry_later(std::make_shared<undestroyed_handle>(provider, handle));
    } catch (const std::bad_alloc&) {
      // No memory for the retry: the handle stays with the driver until the process ends.
    }
  }
  return true;
}

}  // namespace vmm
