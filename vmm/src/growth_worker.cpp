#include "growth_worker.hpp"

#include <utility>

namespace vmm::detail {

std::size_t growth_slot::promised_bytes() const {
  std::lock_guard lock(mutex_);
  return ready_bytes_ + pending_bytes_;
}

std::uint64_t growth_slot::open_request(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (state_ != state::idle || failed_) return 0;
  state_ = state::queued;
  pending_bytes_ = bytes;
  return ++generation_;
}

void growth_slot::cancel_request(std::uint64_t generation) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (generation != generation_ || state_ != state::queued) return;
    state_ = state::idle;
    pending_bytes_ = 0;
    ++generation_;
  }
  settled_.notify_all();
}

std::vector<shared_chunk> growth_slot::take_ready(std::size_t bytes) {
  std::vector<shared_chunk> taken;
  {
    std::unique_lock lock(mutex_);
    if (state_ == state::queued) {  // not started: the grow creates what it needs itself
      state_ = state::idle;
      pending_bytes_ = 0;
      ++generation_;
    }
    // Started: its chunk is most of what this grow would create; waiting costs no more.
    settled_.wait(lock, [&] { return state_ != state::running; });
    std::size_t taken_bytes = 0;
    std::size_t count = 0;
    while (count < ready_.size() && taken_bytes < bytes) taken_bytes += ready_[count++]->size();
    taken.assign(std::make_move_iterator(ready_.begin()), std::make_move_iterator(ready_.begin() + count));
    ready_.erase(ready_.begin(), ready_.begin() + count);
    ready_bytes_ -= taken_bytes;
  }
  settled_.notify_all();
  return taken;
}

void growth_slot::put_back(std::vector<shared_chunk> chunks) noexcept {
  std::size_t bytes = 0;
  for (const shared_chunk& chunk : chunks) bytes += chunk->size();
  std::lock_guard lock(mutex_);
  try {
    ready_.insert(ready_.begin(), std::make_move_iterator(chunks.begin()),
                  std::make_move_iterator(chunks.end()));
    ready_bytes_ += bytes;
  } catch (...) {
    // No room to keep them: they go back to their pool when `chunks` goes, after the lock.
  }
}

std::vector<shared_chunk> growth_slot::abandon() noexcept {
  std::vector<shared_chunk> dropped;
  {
    std::lock_guard lock(mutex_);
    dropped.swap(ready_);
    ready_bytes_ = 0;
    pending_bytes_ = 0;
    if (state_ == state::queued) state_ = state::idle;
    ++generation_;  // a running job delivers nothing more
  }
  settled_.notify_all();
  return dropped;
}

void growth_slot::wait() const {
  std::unique_lock lock(mutex_);
  settled_.wait(lock, [&] { return state_ == state::idle; });
}

void growth_slot::clear_failure() noexcept {
  std::lock_guard lock(mutex_);
  failed_ = false;
}

bool growth_slot::start(std::uint64_t generation) {
  std::lock_guard lock(mutex_);
  if (generation != generation_ || state_ != state::queued) return false;
  state_ = state::running;
  return true;
}

bool growth_slot::deliver(std::uint64_t generation, shared_chunk& chunk) {
  std::lock_guard lock(mutex_);
  if (generation != generation_) return false;
  ready_.reserve(ready_.size() + 1);
  const std::size_t size = chunk->size();
  ready_.push_back(std::move(chunk));
  ready_bytes_ += size;
  pending_bytes_ -= std::min(pending_bytes_, size);
  return true;
}

void growth_slot::finish(std::uint64_t generation, bool failed) noexcept {
  {
    std::lock_guard lock(mutex_);
    // The running job is this one whatever its generation: only one runs per slot.
    if (state_ == state::running) state_ = state::idle;
    if (generation == generation_) {
      pending_bytes_ = 0;
      if (failed) failed_ = true;
    }
  }
  settled_.notify_all();
}

std::shared_ptr<growth_worker> growth_worker::shared() {
  // Never destroyed: a buffer with static storage may let go of its worker at exit.
  static auto* const mutex = new std::mutex();
  static auto* const current = new std::weak_ptr<growth_worker>();
  std::lock_guard lock(*mutex);
  std::shared_ptr<growth_worker> worker = current->lock();
  if (worker == nullptr) {
    worker = std::make_shared<growth_worker>();
    *current = worker;
  }
  return worker;
}

growth_worker::growth_worker() : thread_([this] { run(); }) {}

growth_worker::~growth_worker() {
  std::deque<job> dropped;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    dropped.swap(jobs_);
  }
  wake_.notify_all();
  for (job& work : dropped) work.slot->cancel_request(work.generation);
  if (thread_.joinable()) thread_.join();
}

void growth_worker::submit(std::shared_ptr<growth_slot> slot, std::uint64_t generation,
                           growth_request request) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(job{std::move(slot), generation, std::move(request)});
  }
  wake_.notify_one();
}

void growth_worker::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return jobs_.empty() && !running_job_; });
}

void growth_worker::run() noexcept {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    job work = std::move(jobs_.front());
    jobs_.pop_front();
    running_job_ = true;
    lock.unlock();
    prepare(work);
    work = job{};  // the slot and the pool are let go of outside the lock
    lock.lock();
    running_job_ = false;
    if (jobs_.empty()) idle_.notify_all();
  }
}

void growth_worker::prepare(job& work) noexcept {
  growth_slot& slot = *work.slot;
  if (!slot.start(work.generation)) return;
  bool failed = false;
  try {
    chunk_pool& pool = *work.request.pool;
    // The grow that maps these chunks may run on any stream: only chunks every stream may use.
    for (const std::size_t size : work.request.sizes) {
      pooled_chunk idle = pool.acquire_idle(size, any_stream);
      shared_chunk chunk =
          std::make_shared<const pooled_chunk>(idle ? std::move(idle) : pool.acquire(size, any_stream));
      if (!slot.deliver(work.generation, chunk)) break;  // stale: `chunk` goes back now
    }
  } catch (...) {
    // Not the buffer's failure: its next grow does the work itself and reports what fails
    // there. The request was a guess, which may ask for more than the grow will need.
    failed = true;
  }
  slot.finish(work.generation, failed);
}

}  // namespace vmm::detail
