#include "vmm/stream_executor.hpp"

#include <atomic>
#include <cstring>

#include "vmm/error.hpp"

namespace vmm {
namespace {

// Host memory: the work is done before each call returns, so every event is done.
class synchronous_executor final : public stream_executor {
 public:
  void copy(void* destination, const void* source, std::size_t n, stream_ref) override {
    std::memmove(destination, source, n);
  }
  void fill(void* destination, std::uint8_t value, std::size_t n, stream_ref) override {
    std::memset(destination, value, n);
  }
  void synchronize(stream_ref) override {}
  void synchronize_device() override {}
  event_handle create_event() override { return 0; }
  void destroy_event(event_handle) noexcept override {}
  void record(event_handle, stream_ref) override {}
  bool done(event_handle) override { return true; }
  void synchronize_event(event_handle) override {}
  void enqueue_wait(stream_ref, event_handle) override {}
  // Distinct tokens, never dereferenced: host work ignores streams.
  stream_ref create_stream() override {
    return stream_ref(reinterpret_cast<CUstream_st*>(next_token_.fetch_add(16) + 4096));
  }
  void destroy_stream(stream_ref) noexcept override {}

 private:
  std::atomic<std::uintptr_t> next_token_{0};
};

}  // namespace

stream_executor& host_executor() noexcept {
  static synchronous_executor executor;
  return executor;
}

stream_event::stream_event(stream_executor& executor, stream_ref stream)
    : executor_(&executor), event_(executor.create_event()) {
  try {
    executor.record(event_, stream);
  } catch (...) {
    reset();
    throw;
  }
}

void stream_event::record_again(stream_ref stream) {
  if (event_ == 0) throw invalid_argument("stream_event: record_again() of an empty event");
  executor_->record(event_, stream);
}

}  // namespace vmm
