#include "resource/stream_clock.hpp"

#include <algorithm>

#include "vmm/detail/cleanup.hpp"
#include "resource/timed_into.hpp"

namespace vmm::detail {

stream_record& stream_clock::add(stream_ref stream, bool sync) {
  records_.push_back(std::make_unique<stream_record>(stream));
  if (sync) sync_record_ = records_.back().get();
  return *records_.back();
}

void stream_clock::record_point(stream_record& record) {
  // Points that have passed go first, so that the list stays short however long the
  // program runs without a slow path; a stream far behind its host keeps its epoch open
  // rather than piling up events.
  while (!record.points.empty() && record.points.front().second.done()) record.pass_oldest();
  record.outstanding.store(record.points.size());
  if (record.points.size() >= max_points) return;
  const std::uint64_t closed = record.epoch.fetch_add(1);
  record.frees.store(0, std::memory_order_relaxed);
  try {
    if (record.spare_events.empty()) {
      record.points.emplace_back(closed, stream_event(executor_, record.stream));
    } else {
      record.spare_events.back().record_again(record.stream);
      record.points.emplace_back(closed, std::move(record.spare_events.back()));
      record.spare_events.pop_back();
    }
  } catch (...) {
    record.epoch.fetch_sub(1);  // the epoch stays open
    throw;
  }
  record.outstanding.store(record.points.size());
}

bool stream_clock::point_after(stream_record& record, std::uint64_t epoch) {
  if (epoch < record.epoch.load()) return true;
  record_point(record);  // returns without one only where the stream has all it may have
  if (epoch < record.epoch.load()) return true;
  // Without a point the pages could neither be lent nor waited for, and the request would
  // make new ones beside them: a program far ahead of its GPU would reserve well past its
  // peak (docs/design/memory_resource.md, "Waits").
  ++host_waits_;
  {
    const timed_into timer(host_wait_time_);
    record.points.front().second.synchronize();
  }
  record.pass_oldest();
  record_point(record);
  return epoch < record.epoch.load();
}

void stream_clock::wait_past(stream_record& record, std::uint64_t epoch) {
  const timed_into timer(host_wait_time_);
  std::lock_guard lock(record.mutex);
  bool waited = false;
  while (record.passed.load() < epoch && !record.points.empty()) {
    if (stream_event& point = record.points.front().second; !point.done()) {
      point.synchronize();
      waited = true;
    }
    record.pass_oldest();
  }
  record.outstanding.store(record.points.size());
  if (record.passed.load() < epoch) {  // no point left: everything
    executor_.synchronize_device();
    waited = true;
  }
  host_waits_ += waited ? 1 : 0;
}

void stream_clock::refresh(stream_record* caller, bool wait) {
  if (synchronous_) return;
  bool waited = false;
  for (const auto& owned : records_) {
    if (owned.get() == sync_record_) continue;
    stream_record& record = *owned;
    std::lock_guard lock(record.mutex);
    if (&record == caller && record.frees.load() != 0) record_point(record);
    while (!record.points.empty()) {
      const stream_event& point = record.points.front().second;
      if (!point.done()) {
        if (!wait) break;
        const timed_into timer(host_wait_time_);
        point.synchronize();
        waited = true;
      }
      record.pass_oldest();
    }
    record.outstanding.store(record.points.size());
  }
  host_waits_ += waited ? 1 : 0;
}

void stream_clock::synchronize() {
  executor_.synchronize_device();
  for (const auto& owned : records_) {
    stream_record& record = *owned;
    std::lock_guard lock(record.mutex);
    record.passed.store(record.epoch.fetch_add(1));
    record.frees.store(0);
    record.points.clear();
    record.outstanding.store(0);
  }
}

void stream_clock::order_after(stream_ref waiting, stream_record& freeing) {
  std::lock_guard lock(freeing.mutex);
  record_point(freeing);
  const auto& [epoch, point] = freeing.points.back();
  point.enqueue_wait(waiting);
  for (auto& [stream, ordered] : freeing.waited_by)
    if (stream == waiting) {
      ordered = std::max(ordered, epoch);
      return;
    }
  freeing.waited_by.emplace_back(waiting, epoch);
}

std::vector<stream_event> stream_clock::points_to_retire_after() {
  // The points recorded already cover the frees before them; frees after a stream's last
  // point have none, and vmm does not record on a stream it is not handed (it may be gone):
  // then the device is waited for.
  std::vector<stream_event> passed;
  bool open_epochs = false;
  for (const auto& owned : records_) {
    if (synchronous_ || owned.get() == sync_record_) continue;
    stream_record& record = *owned;
    open_epochs = open_epochs || record.frees.load() != 0;
    for (auto& point : record.points) passed.push_back(std::move(point.second));
  }
  if (open_epochs) {
    cleanup("memory_resource: waiting for the device", [&] { executor_.synchronize_device(); });
    passed.clear();
  }
  return passed;
}

}  // namespace vmm::detail
