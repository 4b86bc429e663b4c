#include "vmm/physical_allocation.hpp"

#include <memory>
#include <new>
#include <utility>

#include "cleanup.hpp"
#include "retirement.hpp"
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

  // Destroys `handle`; false (reported) when the provider refused.
  static bool destroy(const std::shared_ptr<memory_provider>& provider, physical_handle handle) noexcept {
    bool destroyed = false;
    detail::cleanup("physical_allocation: destroy", [&] {
      provider->destroy(handle);
      destroyed = true;
    });
    return destroyed;
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

physical_allocation::physical_allocation(std::shared_ptr<memory_provider> provider, std::size_t size)
    : provider_(require(std::move(provider))),
      size_(size == 0 ? 0 : round_up(size, provider_->granularity())) {
  handle_ = provider_->create(size_);
}

physical_allocation::physical_allocation(std::shared_ptr<memory_provider> provider, physical_handle handle,
                                         std::size_t size) noexcept
    : provider_(std::move(provider)), handle_(handle), size_(size) {}

physical_allocation physical_allocation::import_fd(std::shared_ptr<memory_provider> provider, int fd,
                                                   std::size_t size) {
  provider = require(std::move(provider));
  const physical_handle handle = provider->import_fd(fd, size);
  return physical_allocation(std::move(provider), handle, size);
}

physical_allocation physical_allocation::adopt(std::shared_ptr<memory_provider> provider,
                                               physical_handle handle, std::size_t size) {
  provider = require(std::move(provider));
  provider->adopt(handle, size);
  return physical_allocation(std::move(provider), handle, size);
}

physical_allocation::physical_allocation(physical_allocation&& other) noexcept
    : provider_(std::move(other.provider_)),
      handle_(std::exchange(other.handle_, 0)),
      size_(std::exchange(other.size_, 0)) {}

physical_allocation& physical_allocation::operator=(physical_allocation&& other) noexcept {
  if (this != &other) {
    reset();
    provider_ = std::move(other.provider_);
    handle_ = std::exchange(other.handle_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

physical_allocation::~physical_allocation() {
  reset();
}

unique_fd physical_allocation::export_fd() const {
  if (provider_ == nullptr) throw invalid_argument("physical_allocation: export of an empty allocation");
  return provider_->export_fd(handle_);
}

physical_handle physical_allocation::release() noexcept {
  provider_.reset();
  size_ = 0;
  return std::exchange(handle_, 0);
}

void physical_allocation::reset() noexcept {
  if (provider_ != nullptr && !undestroyed_handle::destroy(provider_, handle_)) {
    try {
      detail::retry_later(std::make_shared<undestroyed_handle>(provider_, handle_));
    } catch (const std::bad_alloc&) {
      // No memory for the retry: the handle stays with the driver until the process ends.
    }
  }
  provider_.reset();
  handle_ = 0;
  size_ = 0;
}

}  // namespace vmm
