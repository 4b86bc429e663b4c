#pragma once
/// @file
/// An event two processes of one host share: one records it after its work, and the
/// other's stream waits for it without either host blocking (CUDA IPC events:
/// cuIpcGetEventHandle / cuIpcOpenEventHandle).
///
/// One process creates the event and sends handle() (64 plain bytes) to the other, which
/// opens it. From then on either may record it and either may wait for it; the last record
/// before a wait is what the wait waits for. The creator must keep its event alive while
/// the other process may still use it: the driver leaves it undefined what an opened event
/// does after its creator destroyed it, so a protocol ends with a message that says the
/// other side is done (vmm::ipc::handoff does this).
///
/// On host providers work is synchronous: the event is always passed, record and wait do
/// nothing, and the handle is a fixed token. Code above the provider is the same for both.

#include <memory>

#include "vmm/provider.hpp"

namespace vmm {

/// Owns one end of an interprocess event (created here, or opened from another process's
/// handle). Move-only; destroying it destroys this process's event object.
class interprocess_event {
 public:
  /// No event.
  interprocess_event() noexcept = default;
  /// Creates an event another process can open: its handle is handle().
  /// @throws vmm::invalid_argument the provider is null.
  /// @throws vmm::driver_error the driver refused (no IPC events on this device or system).
  explicit interprocess_event(std::shared_ptr<memory_provider> provider);
  /// Opens the event that `handle` names, created by another process with the constructor
  /// above through a provider of the same kind and device.
  /// @throws vmm::invalid_argument the provider is null, or the handle is not an event this
  ///         provider can open.
  /// @throws vmm::driver_error cuIpcOpenEventHandle failed (e.g. the handle comes from this
  ///         same process, which the driver does not allow).
  [[nodiscard]] static interprocess_event open(std::shared_ptr<memory_provider> provider,
                                               const interprocess_event_handle& handle);
  interprocess_event(interprocess_event&& other) noexcept;
  interprocess_event& operator=(interprocess_event&& other) noexcept;
  interprocess_event(const interprocess_event&) = delete;
  interprocess_event& operator=(const interprocess_event&) = delete;
  ~interprocess_event();

  /// The 64 bytes that name the event to another process (the same bytes for both ends).
  [[nodiscard]] const interprocess_event_handle& handle() const noexcept { return handle_; }
  /// Whether this process created the event (rather than opened it).
  [[nodiscard]] bool created_here() const noexcept { return created_; }
  explicit operator bool() const noexcept { return provider_ != nullptr; }
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept { return provider_; }

  /// Records the current end of `stream`'s queued work (cuEventRecord).
  /// @throws vmm::invalid_argument there is no event.
  void record(stream_handle stream);
  /// Makes work queued on `stream` from now on wait until the last recorded point has
  /// passed, in whichever process it was recorded (cuStreamWaitEvent). Never blocks.
  /// @throws vmm::invalid_argument there is no event.
  void make_stream_wait(stream_handle stream) const;
  /// Whether the last recorded point has passed (true when nothing was recorded).
  /// @throws vmm::invalid_argument there is no event.
  [[nodiscard]] bool done() const;
  /// Blocks the calling thread until the last recorded point has passed.
  /// @throws vmm::invalid_argument there is no event.
  void wait() const;
  /// Destroys this process's event object now (never throws) and becomes empty.
  void reset() noexcept;

 private:
  interprocess_event(std::shared_ptr<memory_provider> provider, event_handle event,
                     const interprocess_event_handle& handle, bool created) noexcept;
  void require() const;

  std::shared_ptr<memory_provider> provider_;
  event_handle event_ = 0;  // 0 is a valid (always passed) event on host providers
  interprocess_event_handle handle_{};
  bool created_ = false;
};

}  // namespace vmm
