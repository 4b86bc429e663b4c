#include "resource/host_copies.hpp"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

#include "vmm/detail/system.hpp"
#include "providers/os_host_provider.hpp"
#include "vmm/error.hpp"

namespace vmm::detail {
namespace {

constexpr std::size_t huge_page = std::size_t{2} << 20;  // what the kernel's THP uses on x86-64 and arm64
constexpr std::size_t small_page = 4096;                 // a write per page touches each, whatever their size

std::atomic<std::size_t> live_bytes{0};

}  // namespace

host_copies::host_copies(std::size_t bytes, stream_executor& executor) : executor_(executor), bytes_(bytes) {
  if (bytes == 0) throw invalid_argument("memory_resource: host copies of 0 bytes");
  const std::size_t room = safe_commit_budget(0);
  if (bytes > room)
    throw out_of_memory(
        fmt::format("memory_resource: sleep needs {} bytes of host memory for its copies; the host can "
                    "commit about {} bytes safely now",
                    bytes, room));
  // One huge page more than asked, so that the copies start on one: the kernel then backs
  // them with huge pages where it can (fewer faults, and fewer pages to pin).
  mapped_bytes_ = (bytes + huge_page - 1) / huge_page * huge_page + huge_page;
  mapped_ = os::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped_ == MAP_FAILED) {
    const int error = errno;  // before anything else may change it
    mapped_ = nullptr;
    throw_errno(error,
                fmt::format("memory_resource: mmap of {} bytes for the host copies of sleep", mapped_bytes_));
  }
  const auto start = reinterpret_cast<std::uintptr_t>(mapped_);
  data_ = reinterpret_cast<std::byte*>((start + huge_page - 1) / huge_page * huge_page);
  (void)os::madvise(data_, bytes_, MADV_HUGEPAGE);  // advice: without it, small pages
  live_bytes.fetch_add(bytes_);
}

host_copies::~host_copies() {
  for (std::size_t k = 0; k < pinned_; ++k) executor_.unpin_host(data_ + k * piece_bytes, piece_size(k));
  if (os::munmap(mapped_, mapped_bytes_) != 0)
    report_cleanup_failure("memory_resource: munmap of the host copies of sleep failed");
  live_bytes.fetch_sub(bytes_);
}

std::size_t host_copies::bytes_in_process() noexcept {
  return live_bytes.load();
}

void host_copies::prepare(const std::function<void(std::size_t, std::size_t)>& ready) {
  // Pieces are touched by whichever thread claims them next: the helpers, and this thread
  // whenever the piece it is to pin next is not ready. So it works with no helper at all
  // (none could be started), and nothing waits on a thread that is not working.
  const std::size_t count = pieces();
  if (pinned_ == count) {
    for (std::size_t k = 0; k < count; ++k) ready(k * piece_bytes, piece_size(k));
    return;
  }
  std::unique_ptr<std::atomic<bool>[]> touched(new std::atomic<bool>[count]);
  for (std::size_t k = 0; k < count; ++k) touched[k].store(false);
  std::atomic<std::size_t> next{0};
  const auto touch_one = [&]() noexcept {
    const std::size_t k = next.fetch_add(1);
    if (k >= count) return false;
    volatile std::byte* p = data_ + k * piece_bytes;
    for (std::size_t at = 0; at < piece_size(k); at += small_page) p[at] = std::byte{0};
    touched[k].store(true, std::memory_order_release);
    return true;
  };
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t helpers = std::min<std::size_t>(count - 1, std::min(hardware, most_threads) - 1);
  std::vector<std::jthread> threads;
  struct stop_claims {  // when this thread throws: the helpers claim nothing more, then are joined
    std::atomic<std::size_t>& next;
    std::size_t count;
    ~stop_claims() { next.store(count); }
  };
  try {
    threads.reserve(helpers);
    for (std::size_t i = 0; i < helpers; ++i)
      threads.emplace_back([&] {
        while (touch_one()) {}
      });
  } catch (const std::system_error&) {
    // Fewer helpers (or none): this thread touches what they would have.
  } catch (const std::bad_alloc&) {}
  // Declared after `threads`: destroyed first, so the helpers stop before they are joined.
  const stop_claims stop{next, count};
  for (std::size_t k = 0; k < count; ++k) {
    while (!touched[k].load(std::memory_order_acquire))
      if (!touch_one()) std::this_thread::yield();  // a helper is touching piece k
    executor_.pin_host(data_ + k * piece_bytes, piece_size(k));
    ++pinned_;
    ready(k * piece_bytes, piece_size(k));
  }
}

}  // namespace vmm::detail
