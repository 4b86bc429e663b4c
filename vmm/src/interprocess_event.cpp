#include "vmm/interprocess_event.hpp"

#include <utility>

#include "vmm/error.hpp"

namespace vmm {
namespace {

std::shared_ptr<memory_provider> require_provider(std::shared_ptr<memory_provider> provider) {
  if (provider == nullptr) throw invalid_argument("interprocess_event: the provider is null");
  return provider;
}

}  // namespace

// ---- interprocess_event -------------------------------------------------------------------

interprocess_event::interprocess_event(std::shared_ptr<memory_provider> provider)
    : provider_(require_provider(std::move(provider))), created_(true) {
  event_ = provider_->create_interprocess_event(&handle_);
}

interprocess_event::interprocess_event(std::shared_ptr<memory_provider> provider, event_handle event,
                                       const interprocess_event_handle& handle, bool created) noexcept
    : provider_(std::move(provider)), event_(event), handle_(handle), created_(created) {}

interprocess_event interprocess_event::open(std::shared_ptr<memory_provider> provider,
                                            const interprocess_event_handle& handle) {
  provider = require_provider(std::move(provider));
  const event_handle event = provider->open_interprocess_event(handle);
  return interprocess_event(std::move(provider), event, handle, false);
}

interprocess_event::interprocess_event(interprocess_event&& other) noexcept
    : provider_(std::move(other.provider_)),
      event_(std::exchange(other.event_, 0)),
      handle_(other.handle_),
      created_(std::exchange(other.created_, false)) {}

interprocess_event& interprocess_event::operator=(interprocess_event&& other) noexcept {
  if (this != &other) {
    reset();
    provider_ = std::move(other.provider_);
    event_ = std::exchange(other.event_, 0);
    handle_ = other.handle_;
    created_ = std::exchange(other.created_, false);
  }
  return *this;
}

interprocess_event::~interprocess_event() { reset(); }

void interprocess_event::reset() noexcept {
  if (provider_ != nullptr) provider_->destroy_event(event_);
  provider_.reset();
  event_ = 0;
  handle_ = {};
  created_ = false;
}

void interprocess_event::require() const {
  if (provider_ == nullptr) throw invalid_argument("interprocess_event: there is no event");
}

void interprocess_event::record(stream_handle stream) {
  require();
  provider_->record_event_at(event_, stream);
}

void interprocess_event::make_stream_wait(stream_handle stream) const {
  require();
  provider_->stream_wait_event(stream, event_);
}

bool interprocess_event::done() const {
  require();
  return provider_->event_done(event_);
}

void interprocess_event::wait() const {
  require();
  provider_->wait_event(event_);
}

}  // namespace vmm
