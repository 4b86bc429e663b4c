#pragma once
/// @file
/// Work queued on streams for one kind of memory: copies, fills and events.
///
///     vmm::stream_executor& gpu = provider->executor();
///     gpu.copy(destination, source, n, stream);    // queued on `stream`; returns at once
///     vmm::stream_event point(gpu, stream);          // the point `stream` has reached
///     point.enqueue_wait(other);                     // `other` waits for it; the host does not
///     point.synchronize();                           // the host waits for it
///
/// The words, used the same way across vmm:
///  - record: mark the current end of a stream's queued work on an event;
///  - done: whether the work before a recorded point has finished (never blocks);
///  - synchronize: block the calling host thread until a stream or an event is done;
///  - enqueue_wait: make work queued on a stream from now on wait for an event, without
///    blocking the host (cuStreamWaitEvent).
///
/// GPU memory and pinned host memory have a driver executor, which runs each call in the
/// primary context of the memory's device. Host memory of the OS provider has the host
/// executor: it does each copy and fill before returning, its events are always done, and
/// it accepts and ignores streams. Executors live until the process exits.

#include <cstddef>
#include <cstdint>
#include <utility>

#include "vmm/stream_ref.hpp"

namespace vmm {

/// An opaque handle to an event: a CUevent, or 0, which is always done.
using event_handle = std::uint64_t;

/// See the file comment. Every function is thread-safe.
class stream_executor {
 public:
  virtual ~stream_executor() = default;
  stream_executor(const stream_executor&) = delete;
  stream_executor& operator=(const stream_executor&) = delete;

  /// Copies n bytes between any two addresses the executor's device (or the host) can
  /// reach, host memory included, in order on `stream`.
  /// @throws vmm::driver_error the driver call failed (a GPU executor; the host executor
  ///         throws nothing).
  virtual void copy(void* destination, const void* source, std::size_t n, stream_ref stream) = 0;
  /// Sets n bytes to `value`, in order on `stream`.
  /// @throws vmm::driver_error the driver call failed (a GPU executor; the host executor
  ///         throws nothing).
  virtual void fill(void* destination, std::uint8_t value, std::size_t n, stream_ref stream) = 0;
  /// Page-locks [p, p + n) of host memory for the executor's device, so that copies to
  /// and from it run at full speed and in stream order (cuMemHostRegister). Undo it with
  /// unpin_host() before the memory goes. The host executor does nothing.
  /// @throws vmm::driver_error cuMemHostRegister refused (vmm::out_of_memory where it ran
  ///         out of memory).
  virtual void pin_host(void* p, std::size_t n) {
    (void)p;
    (void)n;
  }
  /// Undoes pin_host(p, n). Never throws: a failure is reported.
  virtual void unpin_host(void* p, std::size_t n) noexcept {
    (void)p;
    (void)n;
  }
  /// Blocks until all work queued on `stream` is done.
  /// @throws vmm::driver_error the driver call failed (a GPU executor; the host executor
  ///         throws nothing).
  virtual void synchronize(stream_ref stream) = 0;
  /// Blocks until all work queued on the executor's device is done, on every stream (a
  /// last resort: for when the streams that may use memory are no longer known).
  /// @throws vmm::driver_error the driver call failed (a GPU executor; the host executor
  ///         throws nothing).
  virtual void synchronize_device() = 0;

  /// A new event, not recorded yet (it counts as done). Destroy it with destroy_event().
  /// @throws vmm::driver_error the driver call failed (a GPU executor; the host executor
  ///         throws nothing).
  [[nodiscard]] virtual event_handle create_event() = 0;
  /// Destroys an event from create_event() (0 is ignored). Never throws.
  virtual void destroy_event(event_handle event) noexcept = 0;
  /// Records `event` at the current end of `stream`'s queued work, replacing its previous
  /// point.
  /// @throws vmm::driver_error the driver call failed (a GPU executor; the host executor
  ///         throws nothing).
  virtual void record(event_handle event, stream_ref stream) = 0;
  /// Whether the work before the event's recorded point is done. Never blocks.
  /// @throws vmm::driver_error the driver call failed (a GPU executor; the host executor
  ///         throws nothing).
  [[nodiscard]] virtual bool done(event_handle event) = 0;
  /// Blocks until the work before the event's recorded point is done.
  /// @throws vmm::driver_error the driver call failed (a GPU executor; the host executor
  ///         throws nothing).
  virtual void synchronize_event(event_handle event) = 0;
  /// Makes work queued on `stream` from now on wait for the event's recorded point.
  /// @throws vmm::driver_error the driver call failed (a GPU executor; the host executor
  ///         throws nothing).
  virtual void enqueue_wait(stream_ref stream, event_handle event) = 0;

  /// A new stream of the executor's device that does not synchronize with the legacy
  /// default stream (host executor: a distinct token). Destroy it with destroy_stream();
  /// vmm::owned_stream does both.
  /// @throws vmm::driver_error the driver call failed (a GPU executor; the host executor
  ///         throws nothing).
  [[nodiscard]] virtual stream_ref create_stream() = 0;
  /// Destroys a stream from create_stream() once its queued work is done. Never throws.
  virtual void destroy_stream(stream_ref stream) noexcept = 0;

 protected:
  stream_executor() = default;
};

/// The executor of host memory: synchronous, every event done. The OS provider's.
[[nodiscard]] stream_executor& host_executor() noexcept;

/// A stream made by an executor, owned: destroyed (after its queued work) with the object.
/// Move-only.
class owned_stream {
 public:
  owned_stream() noexcept = default;
  explicit owned_stream(stream_executor& executor)
      : executor_(&executor), stream_(executor.create_stream()) {}
  owned_stream(owned_stream&& other) noexcept
      : executor_(std::exchange(other.executor_, nullptr)),
        stream_(std::exchange(other.stream_, stream_ref())) {}
  owned_stream& operator=(owned_stream&& other) noexcept {
    if (this != &other) {
      reset();
      executor_ = std::exchange(other.executor_, nullptr);
      stream_ = std::exchange(other.stream_, stream_ref());
    }
    return *this;
  }
  owned_stream(const owned_stream&) = delete;
  owned_stream& operator=(const owned_stream&) = delete;
  ~owned_stream() { reset(); }

  /// The stream (the legacy default stream when empty).
  [[nodiscard]] stream_ref get() const noexcept { return stream_; }
  void reset() noexcept {
    if (executor_ != nullptr) executor_->destroy_stream(stream_);
    executor_ = nullptr;
    stream_ = stream_ref();
  }

 private:
  stream_executor* executor_ = nullptr;
  stream_ref stream_;
};

/// A point recorded in a stream's work, owned. Move-only.
class stream_event {
 public:
  /// No event: done.
  stream_event() noexcept = default;
  /// Records the current end of `stream`'s queued work.
  /// @throws vmm::driver_error creating or recording the event failed (nothing is left).
  stream_event(stream_executor& executor, stream_ref stream);
  stream_event(stream_event&& other) noexcept
      : executor_(std::exchange(other.executor_, nullptr)), event_(std::exchange(other.event_, 0)) {}
  stream_event& operator=(stream_event&& other) noexcept {
    if (this != &other) {
      reset();
      executor_ = std::exchange(other.executor_, nullptr);
      event_ = std::exchange(other.event_, 0);
    }
    return *this;
  }
  stream_event(const stream_event&) = delete;
  stream_event& operator=(const stream_event&) = delete;
  ~stream_event() { reset(); }

  /// Whether the work before the point is done (true when empty). Never blocks.
  /// @throws vmm::driver_error as stream_executor::done().
  [[nodiscard]] bool done() const { return event_ == 0 || executor_->done(event_); }
  /// Blocks until the work before the point is done.
  /// @throws vmm::driver_error as stream_executor::synchronize_event().
  void synchronize() const {
    if (event_ != 0) executor_->synchronize_event(event_);
  }
  /// Moves the point to the current end of `stream`'s queued work, reusing the event (one
  /// driver call, where a new point costs creating an event too). Not on an empty one.
  /// @throws vmm::invalid_argument the point is empty.
  /// @throws vmm::driver_error as stream_executor::record().
  void record_again(stream_ref stream);
  /// Makes work queued on `stream` from now on wait for the point.
  /// @throws vmm::driver_error as stream_executor::enqueue_wait().
  void enqueue_wait(stream_ref stream) const {
    if (event_ != 0) executor_->enqueue_wait(stream, event_);
  }
  /// As above, the wait queued through `through`, the executor of the device `stream`
  /// belongs to: the legacy default stream (nullptr) is the one of whichever device the
  /// queuing executor runs in, so a point recorded on one GPU and waited for on another
  /// GPU's legacy default stream needs that GPU's executor.
  void enqueue_wait(stream_ref stream, stream_executor& through) const {
    if (event_ != 0) through.enqueue_wait(stream, event_);
  }
  /// Destroys the event; the point counts as done.
  void reset() noexcept {
    if (event_ != 0) executor_->destroy_event(std::exchange(event_, 0));
    executor_ = nullptr;
  }

 private:
  stream_executor* executor_ = nullptr;
  event_handle event_ = 0;
};

}  // namespace vmm
