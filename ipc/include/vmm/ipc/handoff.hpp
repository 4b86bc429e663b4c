#pragma once
/// @file
/// Stream-ordered hand-off of shared memory between two processes, with interprocess
/// events: the flow of the stream-ordered allocator's IPC pools, on any vmm buffer.
///
///     vmm::ipc::handoff_producer producer(socket, buffer.provider());   // process A
///     fill<<<grid, block, 0, s.get()>>>(buffer.data());
///     producer.publish(s);         // B's stream will wait for the fill; no host waits
///     producer.wait_consumed(s);   // s waits for B's reads before it writes again
///
///     vmm::ipc::handoff_consumer consumer(socket, shared.provider());   // process B
///     consumer.acquire(t);         // t waits for A's fill
///     sum<<<grid, block, 0, t.get()>>>(shared.data());
///     consumer.finish(t);          // A's stream waits for this kernel
///
///   producer                                   consumer
///   handoff_producer p(socket, provider) ----> handoff_consumer c(socket, provider)
///   (writes queued on stream s)
///   p.publish(s): record `ready` on s -------> c.acquire(t): stream t waits for `ready`
///                                              (reads queued on t)
///   p.wait_consumed(s): s waits for `done` <-- c.finish(t): record `done` on t
///   (now s may overwrite or release the memory)
///
/// Neither host blocks: the waits are cuStreamWaitEvent. The socket carries the order of
/// the records (a wait enqueued before the matching record would not wait at all); the
/// events carry the order of the GPU work. The producer creates both events and the
/// consumer opens them, so both live as long as the producer; destroy the producer only
/// after the consumer is done with them (after its last finish() arrived). If a process
/// dies with a record pending on the GPU, the other side's waits on that event may never
/// complete: keep a timeout in whatever supervises the processes.
///
/// The socket messages have a deadline: each send or receive waits at most the timeout
/// given to the constructor (default_timeout, 30 s), then throws vmm::ipc::timeout_error.
/// wait_consumed() and acquire() wait for the other side's message, so a side whose peer
/// may take longer than that between rounds passes a larger timeout, or no_timeout.
///
/// On host providers every event is already passed and the hand-off is the socket
/// messages alone: the same code runs on the OS provider in CI and on the GPU.
///
/// Messages: a 16-byte header (u32 "VMMH", u32 type, u64 sequence; little-endian) and, for
/// the first message (type 1), the two events' 64-byte handles; type 2 is "ready", type 3
/// "done", each carrying the sequence number of its round (1, 2, ...). Each is checked: a
/// message that breaks these rules raises vmm::ipc::protocol_error.

#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/interprocess_event.hpp>
#include <vmm/ipc/protocol_error.hpp>

#include <chrono>
#include <cstdint>
#include <memory>

namespace vmm::ipc {

namespace detail {

// What both ends hold: the connection, the deadline of each of its messages, the two events
// (created by the producer, opened by the consumer) and the rounds so far.
class handoff_end {
 public:
  /// The rounds published (producer) or acquired (consumer) so far.
  [[nodiscard]] std::uint64_t rounds() const noexcept { return sequence_; }

 protected:
  handoff_end(int socket_fd, std::chrono::milliseconds timeout) noexcept
      : socket_(socket_fd), timeout_(timeout) {}

  int socket_;
  std::chrono::milliseconds timeout_;
  interprocess_event ready_;
  interprocess_event done_;
  std::uint64_t sequence_ = 0;
  // A round is under way: published and not consumed (producer), acquired and not
  // finished (consumer).
  bool in_round_ = false;
};

}  // namespace detail

/// The producer's end. Not thread-safe (one conversation, in order). Move-only.
class handoff_producer : public detail::handoff_end {
 public:
  /// Creates the two events through `provider` (the memory's) and sends their handles.
  /// @param socket_fd the connection to the consumer; not owned.
  /// @param timeout how long each message of the conversation may wait for the consumer,
  ///        this one included (no_timeout: without end).
  /// @throws vmm::invalid_argument the provider is null.
  /// @throws vmm::out_of_memory, vmm::driver_error the events could not be created.
  /// @throws vmm::ipc::timeout_error, vmm::os_error sending failed.
  handoff_producer(int socket_fd, std::shared_ptr<memory_provider> provider,
                   std::chrono::milliseconds timeout = default_timeout);
  handoff_producer(handoff_producer&&) noexcept = default;
  handoff_producer& operator=(handoff_producer&&) noexcept = default;

  /// Marks the end of the work queued on `stream` so far as the consumer's to wait for,
  /// and tells the consumer. Call once per round, after the writes are queued.
  /// @throws vmm::invalid_argument the previous round was not consumed yet.
  /// @throws vmm::ipc::timeout_error, vmm::os_error, vmm::out_of_memory, vmm::driver_error.
  void publish(stream_ref stream);
  /// Receives the consumer's "done" for the current round and makes work queued on
  /// `stream` from now on wait for the consumer's work. The host does not wait for the
  /// GPU; it waits for the consumer's message.
  /// @throws vmm::invalid_argument nothing is published.
  /// @throws vmm::ipc::protocol_error the message is not this round's "done".
  /// @throws vmm::ipc::timeout_error no "done" within the timeout.
  /// @throws vmm::ipc::peer_closed the consumer went away.
  /// @throws vmm::os_error receiving failed.
  /// @throws vmm::out_of_memory, vmm::driver_error `stream` could not be made to wait
  ///         (cuStreamWaitEvent; out_of_memory where the driver says so). The
  ///         round counts as consumed: order later work after the consumer's some other way
  ///         (the consumer's finish() has been received) before reusing the memory.
  void wait_consumed(stream_ref stream);
};

/// The consumer's end. Not thread-safe. Move-only.
class handoff_consumer : public detail::handoff_end {
 public:
  /// Receives the producer's event handles and opens them through `provider`.
  /// @param socket_fd the connection to the producer; not owned.
  /// @param timeout how long each message of the conversation may wait for the producer,
  ///        the events message included (no_timeout: without end).
  /// @throws vmm::invalid_argument the provider is null.
  /// @throws vmm::ipc::protocol_error the message is not the producer's "events" message,
  ///         or its handles are not events this memory can open.
  /// @throws vmm::out_of_memory, vmm::driver_error the driver refused to open the events.
  /// @throws vmm::ipc::timeout_error, vmm::ipc::peer_closed, vmm::os_error receiving failed.
  handoff_consumer(int socket_fd, std::shared_ptr<memory_provider> provider,
                   std::chrono::milliseconds timeout = default_timeout);
  handoff_consumer(handoff_consumer&&) noexcept = default;
  handoff_consumer& operator=(handoff_consumer&&) noexcept = default;

  /// Receives the producer's "ready" for the next round and makes work queued on `stream`
  /// from now on wait for the producer's writes.
  /// @throws vmm::invalid_argument the previous round was not finished.
  /// @throws vmm::ipc::protocol_error the message is not the next round's "ready".
  /// @throws vmm::ipc::timeout_error no "ready" within the timeout.
  /// @throws vmm::ipc::peer_closed the producer went away.
  /// @throws vmm::os_error receiving failed.
  /// @throws vmm::out_of_memory, vmm::driver_error `stream` could not be made to wait
  ///         (cuStreamWaitEvent; out_of_memory where the driver says so). The
  ///         round counts as acquired: order the reads after the producer's writes some
  ///         other way before they start.
  void acquire(stream_ref stream);
  /// Marks the end of the work queued on `stream` so far as the producer's to wait for,
  /// and tells the producer that this round is finished.
  /// @throws vmm::invalid_argument nothing is acquired.
  /// @throws vmm::ipc::timeout_error, vmm::os_error, vmm::out_of_memory, vmm::driver_error.
  void finish(stream_ref stream);
};

}  // namespace vmm::ipc
