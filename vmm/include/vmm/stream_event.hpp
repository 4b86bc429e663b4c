#pragma once
/// @file
/// A recorded point in a stream's work, owned.

#include <memory>
#include <utility>

#include "vmm/provider.hpp"

namespace vmm {

/// Records the point a stream has reached (cuEventRecord) and owns the event. On host
/// providers every point is already passed. Move-only.
class stream_event {
 public:
  stream_event() noexcept = default;
  /// Records the current end of `stream`'s queued work.
  stream_event(std::shared_ptr<memory_provider> provider, stream_handle stream)
      : provider_(std::move(provider)), event_(provider_->record_event(stream)) {}
  stream_event(stream_event&& other) noexcept
      : provider_(std::move(other.provider_)), event_(std::exchange(other.event_, 0)) {}
  stream_event& operator=(stream_event&& other) noexcept {
    if (this != &other) {
      reset();
      provider_ = std::move(other.provider_);
      event_ = std::exchange(other.event_, 0);
    }
    return *this;
  }
  stream_event(const stream_event&) = delete;
  stream_event& operator=(const stream_event&) = delete;
  ~stream_event() { reset(); }

  /// Whether the work queued before the point is done (true when empty). Never blocks.
  [[nodiscard]] bool done() const { return event_ == 0 || provider_->event_done(event_); }
  /// Blocks until the work queued before the point is done.
  void wait() const {
    if (event_ != 0) provider_->wait_event(event_);
  }
  void reset() noexcept {
    if (event_ != 0) provider_->destroy_event(std::exchange(event_, 0));
    provider_.reset();
  }

 private:
  std::shared_ptr<memory_provider> provider_;
  event_handle event_ = 0;
};

}  // namespace vmm
