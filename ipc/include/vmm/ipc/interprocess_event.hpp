#pragma once
/// @file
/// An event two processes of one host share: one records it after its work, and the
/// other's stream waits for it without either host blocking (CUDA IPC events:
/// cuIpcGetEventHandle / cuIpcOpenEventHandle).
///
///     // process A                                 // process B
///     vmm::ipc::interprocess_event done(gpu);      auto done = vmm::ipc::interprocess_event::open(
///     send(done.handle());                                        gpu, receive_handle());
///                                                   kernel<<<..., stream_b>>>(...);
///                                                   done.record(stream_b);  send("recorded")
///     receive("recorded");
///     done.enqueue_wait(stream_a);   // stream_a's later work runs after B's kernel
///
/// One process creates the event and sends handle() (64 plain bytes) to the other, which
/// opens it. From then on either may record it and either may wait for it; the last record
/// before a wait is what the wait waits for. The creator must keep its event alive while
/// the other process may still use it: the driver leaves it undefined what an opened event
/// does after its creator destroyed it, so a protocol ends with a message that says the
/// other side is done (vmm::ipc::handoff does this).
///
/// Host memory (the OS provider) works synchronously: the event is always done, record
/// and wait do nothing, and the handle is a fixed token. Code above is the same for both.

#include <vmm/provider.hpp>

#include <array>
#include <cstddef>
#include <memory>

namespace vmm::ipc {

/// The 64 bytes that name an interprocess event to another process of the same host
/// (CUipcEventHandle; a fixed token for host memory, whose events are always done).
struct interprocess_event_handle {
  std::array<std::byte, 64> bytes{};
  friend bool operator==(const interprocess_event_handle&, const interprocess_event_handle&) = default;
};

/// Owns one end of an interprocess event (created here, or opened from another process's
/// handle). Move-only; destroying it destroys this process's event object.
class interprocess_event {
 public:
  /// No event.
  interprocess_event() noexcept = default;
  /// Creates an event another process can open, on the device of `provider`'s memory
  /// (host memory: the fixed token). Its handle is handle().
  /// @throws vmm::invalid_argument the provider is null.
  /// @throws vmm::driver_error the driver refused (no IPC events on this device or system).
  explicit interprocess_event(const std::shared_ptr<memory_provider>& provider);
  /// Opens the event that `handle` names, created by another process with the constructor
  /// above for memory of the same kind and device.
  /// @throws vmm::invalid_argument the provider is null, or the handle is not an event this
  ///         provider's memory can open (a GPU event's handle for host memory, or the reverse).
  /// @throws vmm::driver_error cuIpcOpenEventHandle failed (e.g. the handle comes from this
  ///         same process, which the driver does not allow).
  [[nodiscard]] static interprocess_event open(const std::shared_ptr<memory_provider>& provider,
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
  explicit operator bool() const noexcept { return executor_ != nullptr; }

  /// Records the current end of `stream`'s queued work (cuEventRecord).
  /// @throws vmm::invalid_argument there is no event.
  /// @throws vmm::driver_error the driver call failed.
  void record(stream_ref stream);
  /// Makes work queued on `stream` from now on wait until the last recorded point has
  /// passed, in whichever process it was recorded (cuStreamWaitEvent). Never blocks.
  /// @throws vmm::invalid_argument there is no event.
  /// @throws vmm::driver_error the driver call failed.
  void enqueue_wait(stream_ref stream) const;
  /// Whether the last recorded point has passed (true when nothing was recorded).
  /// @throws vmm::invalid_argument there is no event.
  /// @throws vmm::driver_error the driver call failed.
  [[nodiscard]] bool done() const;
  /// Blocks the calling thread until the last recorded point has passed.
  /// @throws vmm::invalid_argument there is no event.
  /// @throws vmm::driver_error the driver call failed.
  void synchronize() const;
  /// Destroys this process's event object now (never throws) and becomes empty.
  void reset() noexcept;

 private:
  interprocess_event(stream_executor& executor, event_handle event, const interprocess_event_handle& handle,
                     bool created) noexcept;
  void require() const;

  stream_executor* executor_ = nullptr;
  event_handle event_ = 0;  // 0 is the always-done event of host memory
  interprocess_event_handle handle_{};
  bool created_ = false;
};

}  // namespace vmm::ipc
