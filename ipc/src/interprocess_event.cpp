// Interprocess events (vmm/ipc/interprocess_event.hpp): a part of sharing that calls the
// driver directly. Memory whose executor is synchronous (host memory) has no driver to ask:
// its events are always done and named by a fixed token.

#include <vmm/ipc/interprocess_event.hpp>

#include <fmt/format.h>

#include <vmm/detail/driver_sharing.hpp>

#include <utility>

#include "gpu_context.hpp"

namespace vmm::ipc {
namespace {

// What a host-memory event handle holds: no process can mistake it for a GPU event's
// handle, nor open a GPU event's handle as it.
interprocess_event_handle host_event_token() noexcept {
  constexpr char text[] = "vmm host event: always passed";
  interprocess_event_handle token;
  for (std::size_t i = 0; i < sizeof text; ++i) token.bytes[i] = static_cast<std::byte>(text[i]);
  return token;
}

}  // namespace

interprocess_event::interprocess_event(const std::shared_ptr<memory_provider>& provider) {
  require_provider(provider, "interprocess_event");
  executor_ = &provider->executor();
  created_ = true;
  if (provider->capabilities().synchronous) {
    handle_ = host_event_token();
    return;
  }
  const detail::interprocess_event_made made = detail::create_interprocess_event(context_device(*provider));
  handle_.bytes = made.handle;
  event_ = made.event;
}

interprocess_event::interprocess_event(stream_executor& executor, event_handle event,
                                       const interprocess_event_handle& handle, bool created) noexcept
    : executor_(&executor), event_(event), handle_(handle), created_(created) {}

interprocess_event interprocess_event::open(const std::shared_ptr<memory_provider>& provider,
                                            const interprocess_event_handle& handle) {
  require_provider(provider, "interprocess_event::open");
  const bool host_token = handle == host_event_token();
  if (provider->capabilities().synchronous) {
    if (!host_token)
      throw invalid_argument(
          "interprocess_event::open: the handle is not a host event's (a GPU event cannot be "
          "opened for host memory)");
    return interprocess_event(provider->executor(), 0, handle, false);
  }
  if (host_token)
    throw invalid_argument(
        fmt::format("interprocess_event::open: the handle is a host event's token, but {} memory needs a GPU "
                    "event",
                    to_string(provider->capabilities().where)));
  const event_handle event = detail::open_interprocess_event(context_device(*provider), handle.bytes);
  return interprocess_event(provider->executor(), event, handle, false);
}

interprocess_event::interprocess_event(interprocess_event&& other) noexcept
    : executor_(std::exchange(other.executor_, nullptr)),
      event_(std::exchange(other.event_, 0)),
      handle_(other.handle_),
      created_(std::exchange(other.created_, false)) {}

interprocess_event& interprocess_event::operator=(interprocess_event&& other) noexcept {
  if (this != &other) {
    reset();
    executor_ = std::exchange(other.executor_, nullptr);
    event_ = std::exchange(other.event_, 0);
    handle_ = other.handle_;
    created_ = std::exchange(other.created_, false);
  }
  return *this;
}

interprocess_event::~interprocess_event() {
  reset();
}

void interprocess_event::reset() noexcept {
  if (executor_ != nullptr) executor_->destroy_event(event_);
  executor_ = nullptr;
  event_ = 0;
  handle_ = {};
  created_ = false;
}

void interprocess_event::require() const {
  if (executor_ == nullptr) throw invalid_argument("interprocess_event: there is no event");
}

void interprocess_event::record(stream_ref stream) {
  require();
  if (event_ != 0) executor_->record(event_, stream);
}

void interprocess_event::enqueue_wait(stream_ref stream) const {
  require();
  executor_->enqueue_wait(stream, event_);
}

bool interprocess_event::done() const {
  require();
  return executor_->done(event_);
}

void interprocess_event::synchronize() const {
  require();
  executor_->synchronize_event(event_);
}

}  // namespace vmm::ipc
