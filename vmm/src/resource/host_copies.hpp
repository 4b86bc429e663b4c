#pragma once
// Where memory_resource::sleep() keeps the bytes it saves: fresh host memory, made ready a
// piece at a time, so that the copies into the first pieces run while the later ones are
// still being made.
//
// Fresh host memory costs the kernel a zeroed page for every page touched, and pinning it
// costs the driver per page. The driver's own pinned host memory (cuMemCreate on the host
// NUMA node, cuMemHostAlloc) is made serially by the driver and costs many times the copy
// from the GPU; anonymous memory advised to use huge pages, touched by several threads and
// pinned with cuMemHostRegister costs about the copy (docs/design/memory_resource.md, "Sleep
// and wake"). So the memory is mapped here, touched by several threads at once, and pinned
// through the executor piece by piece.

#include <cstddef>
#include <functional>

#include "vmm/stream_executor.hpp"

namespace vmm::detail {

class host_copies {
 public:
  static constexpr std::size_t piece_bytes = std::size_t{64} << 20;
  static constexpr unsigned most_threads = 16;  // touching; the calling thread included

  // Maps `bytes` (> 0) of host memory for copies through `executor`, which must outlive
  // this. Throws out_of_memory when the host cannot commit that much safely or the mapping
  // fails; nothing is kept then.
  host_copies(std::size_t bytes, stream_executor& executor);
  host_copies(const host_copies&) = delete;
  host_copies& operator=(const host_copies&) = delete;
  ~host_copies();  // unpins and unmaps

  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

  // Makes every piece ready (touched, pinned) and calls ready(offset, bytes) for each, in
  // address order, on this thread, as soon as it is. When it throws (pinning failed, or
  // `ready` threw), the pieces made ready so far are undone by the destructor. Called again
  // (copies kept for another sleep), it finds every piece ready and calls `ready` at once.
  void prepare(const std::function<void(std::size_t, std::size_t)>& ready);

  // Calls visit(offset, bytes) for the parts of [offset, offset + n) in each piece: a copy
  // must not cross from one pinned piece into the next.
  template <class Visit>
  void for_each_piece(std::size_t offset, std::size_t n, Visit&& visit) const {
    for (const std::size_t end = offset + n; offset < end;) {
      const std::size_t piece_end = (offset / piece_bytes + 1) * piece_bytes;
      const std::size_t step = (end < piece_end ? end : piece_end) - offset;
      visit(offset, step);
      offset += step;
    }
  }

  // Bytes of host copies alive in this process (for tests: that they are given back).
  [[nodiscard]] static std::size_t bytes_in_process() noexcept;

 private:
  [[nodiscard]] std::size_t pieces() const noexcept { return (bytes_ + piece_bytes - 1) / piece_bytes; }
  [[nodiscard]] std::size_t piece_size(std::size_t k) const noexcept {
    return k + 1 < pieces() ? piece_bytes : bytes_ - k * piece_bytes;
  }

  stream_executor& executor_;
  std::size_t bytes_;
  void* mapped_ = nullptr;  // the whole mapping: data_ rounded up to a huge page within it
  std::size_t mapped_bytes_ = 0;
  std::byte* data_ = nullptr;
  std::size_t pinned_ = 0;  // pieces pinned, from the first
};

}  // namespace vmm::detail
