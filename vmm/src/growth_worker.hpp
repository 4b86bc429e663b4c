#pragma once
// Growth ahead (growable_buffer_options::growth_ahead): one background thread, shared by
// every buffer of the process that grows ahead, takes physical chunks from the pool
// (creating them there), so that the buffer's next grow finds them ready and pays what a
// grow from a warm pool pays. The design and its guarantees are stated in
// growable_buffer.hpp; this header is the machinery.
//
// Who touches what. A buffer and the worker share one growth_slot per buffer, and nothing
// else: the worker never sees the buffer, its range or its books. Every field of a slot is
// under the slot's mutex; no driver or OS call is made with that mutex held (chunks are
// created and destroyed outside it), so a buffer never waits for the driver behind the
// lock except where it asks to (take_ready() waits for a preparation in flight).
//
// Generations. Each request is numbered; cancelling (take_ready() of a queued request) and
// abandoning (shrink_to_fit, destruction) move the slot to a new number, and a job of an
// old number delivers nothing: what it made goes straight back to its pool.
//
// Lifetime. growth_worker::shared() hands out the process's worker while some buffer holds
// it, and makes a new one otherwise: the thread ends (is joined) when the last buffer that
// grows ahead is destroyed. Its destructor drops queued jobs and waits for the one running.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "vmm/chunk_pool.hpp"
#include "vmm/shared_chunk.hpp"

namespace vmm::detail {

// The chunks prepared for one buffer, and the state of its request. Thread-safe.
class growth_slot {
 public:
  // Buffer side.
  // Bytes ready, plus those a queued or running request will add.
  [[nodiscard]] std::size_t promised_bytes() const;
  // Starts a request for `bytes` when none is queued or running and the last one did not
  // fail since clear_failure(): returns its generation, or 0 when no request may start.
  [[nodiscard]] std::uint64_t open_request(std::size_t bytes);
  // Undoes open_request() when the job could not be queued.
  void cancel_request(std::uint64_t generation) noexcept;
  // Takes ready chunks, from the first prepared, until they hold at least `bytes` (or none
  // is left). A queued request is cancelled first; a running one is waited for.
  [[nodiscard]] std::vector<shared_chunk> take_ready(std::size_t bytes);
  // Puts back chunks take_ready() gave and the grow did not use, in front.
  void put_back(std::vector<shared_chunk> chunks) noexcept;
  // Hands back every ready chunk (the caller lets go of them, outside the lock) and makes a
  // request in flight deliver nothing.
  [[nodiscard]] std::vector<shared_chunk> abandon() noexcept;
  // Blocks until no request is queued or running.
  void wait() const;
  // A grow that created memory itself succeeded: requests may start again after a failure.
  void clear_failure() noexcept;

  // Worker side.
  // Marks the job of `generation` running; false when it was cancelled or abandoned.
  [[nodiscard]] bool start(std::uint64_t generation);
  // Adds a prepared chunk; false (the chunk stays with the caller) when stale.
  [[nodiscard]] bool deliver(std::uint64_t generation, shared_chunk& chunk);
  // The job of `generation` is over; `failed` stops requests until clear_failure().
  void finish(std::uint64_t generation, bool failed) noexcept;

 private:
  enum class state : std::uint8_t { idle, queued, running };
  mutable std::mutex mutex_;
  mutable std::condition_variable settled_;
  state state_ = state::idle;
  std::uint64_t generation_ = 0;  // of the request queued or running, or of the last one
  std::vector<shared_chunk> ready_;
  std::size_t ready_bytes_ = 0;
  std::size_t pending_bytes_ = 0;  // still to come from the request queued or running
  bool failed_ = false;
};

// What a buffer asks for: chunks of `sizes` bytes from `pool`.
struct growth_request {
  std::shared_ptr<chunk_pool> pool;
  std::vector<std::size_t> sizes;
};

// The background thread. See the file comment.
class growth_worker {
 public:
  // The process's worker, made (and its thread started) when no buffer holds one.
  // @throws std::system_error the thread could not be started.
  [[nodiscard]] static std::shared_ptr<growth_worker> shared();
  growth_worker();
  growth_worker(const growth_worker&) = delete;
  growth_worker& operator=(const growth_worker&) = delete;
  // Drops queued jobs (their slots go back to idle), waits for the running one, joins.
  ~growth_worker();

  // Queues a request opened on `slot` with open_request().
  // @throws std::bad_alloc (the caller then calls cancel_request()).
  void submit(std::shared_ptr<growth_slot> slot, std::uint64_t generation, growth_request request);
  // Blocks until no job is queued or running (for tests).
  void wait_idle();

 private:
  struct job {
    std::shared_ptr<growth_slot> slot;
    std::uint64_t generation;
    growth_request request;
  };
  void run() noexcept;
  static void prepare(job& work) noexcept;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<job> jobs_;
  bool running_job_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace vmm::detail
