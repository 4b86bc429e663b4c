#pragma once
// The daemon's version table: one 64-bit word per live entry, in shared memory that the
// daemon writes and every client maps read-only. The daemon bumps an entry's word at every
// change a holder's cached view depends on (removal, sealing, growth, the loss of its name,
// its end). A client that maps an entry already and reads the word it was last told sees
// that nothing changed since: its repeated get needs no round trip (client.cpp).
//
// The memory is a memfd sealed against growth, shrinking and any later writable mapping
// (F_SEAL_FUTURE_WRITE, Linux 5.1): the daemon's own mapping, made before the seal, is the
// only one that can write. A client checks the seals and the size before it maps.

#include <vmm/store/protocol.hpp>
#include <vmm/unique_fd.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace vmm::store::detail {

// Unmaps a table's words; `bytes` is the mapping's length.
struct table_unmap {
  std::size_t bytes = 0;
  void operator()(std::uint64_t* words) const noexcept;
};

class version_table {
 public:
  static constexpr std::uint32_t no_slot = no_version_slot;

  version_table() noexcept = default;

  // The daemon's table of `slots` words (fewer than no_slot). Empty (slots() == 0) for 0
  // slots, and where the kernel lacks the seals: clients then go to the daemon for every get.
  // @throws vmm::invalid_argument too many slots. @throws vmm::os_error
  static version_table create(std::size_t slots);
  // A client's read-only view of the table the daemon sent (`fd`, `slots` words).
  // @throws vmm::ipc::protocol_error the memory is not a sealed table of that size.
  // @throws vmm::os_error the mapping failed.
  static version_table open(unique_fd fd, std::size_t slots);

  [[nodiscard]] std::size_t slots() const noexcept {
    return words_ ? words_.get_deleter().bytes / sizeof(std::uint64_t) : 0;
  }
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }

  // The daemon: a slot for a new entry, or no_slot when every slot is taken (or no memory
  // is left to remember it by).
  [[nodiscard]] std::uint32_t take() noexcept;
  // The daemon: the entry of `slot` changed (no_slot: nothing to do).
  void bump(std::uint32_t slot) noexcept;
  // The daemon: the entry of `slot` is gone; the slot may serve another entry.
  void give_back(std::uint32_t slot) noexcept;
  // The word of `slot` now; ~0 for no_slot or a slot past the table (never a version).
  [[nodiscard]] std::uint64_t read(std::uint32_t slot) const noexcept;

 private:
  // Maps `slots` words of `fd` with `protection`. @throws vmm::os_error
  static std::unique_ptr<std::uint64_t[], table_unmap> map(int fd, std::size_t slots, int protection);

  unique_fd fd_;
  std::unique_ptr<std::uint64_t[], table_unmap> words_;
  std::uint32_t never_used_ = 0;         // slots [never_used_, slots()) were never taken
  std::vector<std::uint32_t> returned_;  // slots given back, taken again first
};

}  // namespace vmm::store::detail
