#pragma once
// The stream clock of a memory resource: a record of every stream that allocates or frees
// through it (stream_record, arena.hpp), the points recorded on them, the epochs those
// points close, and the host's waits for them. A block freed on a stream in an epoch is
// free for every stream once the stream has passed the point that closed it.
//
// The records are made and walked under the resource's mutex; each record's points under
// its own mutex, taken after any arena's.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "resource/arena.hpp"
#include "vmm/stream_executor.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm::detail {

class stream_clock {
 public:
  // Outstanding points a stream may have: one far behind its host keeps its epoch open.
  static constexpr std::size_t max_points = 64;

  // `synchronous`: the executor's work is done when the call that queues it returns (no
  // point is ever recorded or waited for).
  stream_clock(stream_executor& executor, bool synchronous) noexcept
      : executor_(executor), synchronous_(synchronous) {}
  stream_clock(const stream_clock&) = delete;
  stream_clock& operator=(const stream_clock&) = delete;

  [[nodiscard]] bool synchronous() const noexcept { return synchronous_; }
  [[nodiscard]] stream_executor& executor() const noexcept { return executor_; }

  // A record for `stream` (`sync`: the one of the calls without a stream, never given a
  // point), kept until the clock goes. Under the resource's mutex.
  stream_record& add(stream_ref stream, bool sync);

  // Under the record's mutex: closes the open epoch with a point, once the points that have
  // passed are let go; none where the stream has max_points outstanding.
  void record_point(stream_record& record);
  // Under the record's mutex: whether a recorded point follows `epoch`, recording one if
  // need be; where the stream has all the points it may, the host waits for the oldest to
  // make room (a host wait). False only if no point could be recorded.
  bool point_after(stream_record& record, std::uint64_t epoch);
  // Blocks until `record`'s stream has passed `epoch` (a point after it, else the device),
  // counting a host wait where it had not passed yet.
  void wait_past(stream_record& record, std::uint64_t epoch);
  // Notes the points of every stream that have passed (waiting for them with `wait`). A
  // point is recorded only on `caller`'s stream: vmm records on a stream only while a call
  // names it (the stream is alive then); others may have been destroyed since.
  void refresh(stream_record* caller, bool wait);
  // Waits for the device: every epoch of every stream has passed, closed without an event.
  void synchronize();
  // Orders `waiting` after the work queued on `freeing`'s stream so far (a point recorded
  // now), so that what was freed on it before may serve `waiting` at once.
  void order_after(stream_ref waiting, stream_record& freeing);
  // For the resource's destructor: the recorded points of every stream, after which its
  // frees have passed; empty once the device was waited for, where a stream has frees after
  // its last point.
  [[nodiscard]] std::vector<stream_event> points_to_retire_after();

  [[nodiscard]] std::size_t host_waits() const noexcept { return host_waits_; }
  [[nodiscard]] std::chrono::nanoseconds host_wait_time() const noexcept { return host_wait_time_; }

 private:
  stream_executor& executor_;
  bool synchronous_;
  std::vector<std::unique_ptr<stream_record>> records_;  // in the order made
  const stream_record* sync_record_ = nullptr;
  std::size_t host_waits_ = 0;
  std::chrono::nanoseconds host_wait_time_{};
};

}  // namespace vmm::detail
