#pragma once
/// @file
/// What the fuzz targets of tests/fuzz share: reading an input, the descriptors a hostile
/// peer may send, a socket to send them over, and the leak checks every target runs.
///
/// Inputs are small structured scripts rather than raw bytes wherever the code under test
/// reads from a socket, so that the fuzzer mutates what a peer controls (payload bytes,
/// which descriptors travel, how the bytes are split into writes) and the seed generator
/// (make_seeds.cpp) can write real, valid conversations in the same format. Every reader
/// here is total: past the end of the input it yields zeros and empty spans, so every byte
/// string is a valid script.
///
/// Leak checks. A target counts the entries of /proc/self/fd before an input and after it
/// has destroyed everything it made; targets that map memory also take a census of
/// /proc/self/maps (the providers' own registries are private). The census counts only what
/// the library's mmap calls can leave behind (memfd mappings, and inaccessible anonymous
/// ranges: reservations) and skips the sanitizer allocator's fixed region, whose mappings
/// change with every malloc.
///
/// The peer writes from the fuzzing thread itself: its end of the socket pair is
/// non-blocking with a large send buffer, and inputs are small, so a whole script is queued
/// before the code under test reads it, and a read past the script's end sees the peer's
/// shutdown instead of blocking.

#include <vmm/unique_fd.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace vmm::fuzz {

/// Installs what every target needs once (LLVMFuzzerInitialize): a cleanup failure reported
/// by a destructor becomes a finding, SIGPIPE is ignored, RLIMIT_NOFILE is raised to 4096
/// where the soft limit is lower, the read-only file exists.
void initialize();

/// Reports a finding: prints `what` and aborts, so that libFuzzer saves the input.
[[noreturn]] void finding(const std::string& what);

/// Reads an input front to back. Past the end, integers read as 0 and spans are empty.
class byte_reader {
 public:
  explicit byte_reader(std::span<const std::byte> bytes) noexcept : bytes_(bytes) {}
  byte_reader(const std::uint8_t* data, std::size_t size) noexcept
      : bytes_(reinterpret_cast<const std::byte*>(data), size) {}

  [[nodiscard]] bool empty() const noexcept { return bytes_.empty(); }
  [[nodiscard]] std::size_t remaining() const noexcept { return bytes_.size(); }
  std::uint8_t u8() noexcept;
  /// Little-endian.
  std::uint16_t u16() noexcept;
  /// The next min(n, remaining()) bytes.
  std::span<const std::byte> take(std::size_t n) noexcept;

 private:
  std::span<const std::byte> bytes_;
};

/// Appends little-endian integers and bytes: the seed generator's side of byte_reader.
void put_u8(std::vector<std::byte>& out, std::uint8_t value);
void put_u16(std::vector<std::byte>& out, std::uint16_t value);
void put_bytes(std::vector<std::byte>& out, std::span<const std::byte> bytes);

/// Entries of /proc/self/fd.
[[nodiscard]] std::size_t open_fd_count();

/// What the library's mmap calls can leave behind. See the file comment.
struct mapping_census {
  std::size_t memfd_mappings = 0;      ///< lines of /proc/self/maps that map a memfd
  std::size_t inaccessible_bytes = 0;  ///< anonymous ---p bytes (reservations, unmapped chunks)
  /// Lines outside the sanitizer allocator's region: reported, not compared (the
  /// sanitizer's own large allocations come and go there, and a leaked reservation may
  /// merge with its neighbour without adding a line).
  std::size_t lines = 0;
  /// Whether the library's share is the same (lines aside).
  [[nodiscard]] bool same_library_share(const mapping_census& other) const noexcept {
    return memfd_mappings == other.memfd_mappings && inaccessible_bytes == other.inaccessible_bytes;
  }
};
[[nodiscard]] mapping_census take_mapping_census();

/// Takes the counts when made; check() compares them with the counts then and reports a
/// finding when they differ. Make one before creating anything for an input, and call
/// check() once everything made for it is destroyed.
class leak_check {
 public:
  explicit leak_check(bool mappings);
  void check(const char* target) const;

 private:
  bool mappings_;
  std::size_t fds_;
  mapping_census census_;
};

/// The page size the targets' providers use as their granularity.
inline constexpr std::size_t page = 4096;

/// What a descriptor spec byte makes: the low 3 bits pick the kind, the high 5 bits a
/// number of pages (memfd sizes, 0 to 31 pages).
enum class fd_kind : std::uint8_t {
  memfd = 0,               ///< pages * 4096 bytes, no seals
  sealed_memfd = 1,        ///< the same, sealed as vmm exports them (shrink, grow, seal)
  odd_memfd = 2,           ///< pages * 4096 + 512 bytes: not a multiple of any granularity
  shrunk_memfd = 3,        ///< pages * 4096 bytes, shrunk to half by the peer once it is sent
  dev_null = 4,            ///< /dev/null
  pipe = 5,                ///< the read end of a pipe
  read_only_file = 6,      ///< a regular file opened read-only
  write_sealed_memfd = 7,  ///< sealed_memfd, and against writes too (a shared rw mapping fails)
};
[[nodiscard]] constexpr std::uint8_t fd_spec(fd_kind kind, std::size_t pages = 0) noexcept {
  return static_cast<std::uint8_t>(static_cast<std::uint8_t>(kind) | (pages & 31) << 3);
}

/// The descriptors one input sends, and the other ends it keeps (a pipe's write end), all
/// closed when the stock is destroyed.
class fd_stock {
 public:
  /// The most descriptors one input makes: far below RLIMIT_NOFILE, with room for the
  /// received copies.
  static constexpr std::size_t budget = 400;
  /// Makes a descriptor as `spec` says and returns it (owned by the stock); -1 once the
  /// budget is spent.
  int make(std::uint8_t spec);
  /// The descriptors to attach for `specs`: as many as the budget allows.
  std::vector<int> make_all(std::span<const std::uint8_t> specs);
  /// What the peer does once everything is sent: shrinks the shrunk_memfd kind.
  void after_send();
  /// The memfds made, in order (every memfd kind).
  [[nodiscard]] const std::vector<int>& memfds() const noexcept { return memfds_; }

 private:
  std::vector<unique_fd> owned_;
  std::vector<int> memfds_;
  std::vector<std::pair<int, std::size_t>> to_shrink_;
};

/// One write of a peer: bytes, with descriptors attached to the first of them.
struct segment {
  /// Up to 7 specs of any kind, or up to max_fds_per_message copies of one spec.
  std::vector<std::uint8_t> fd_specs;
  std::vector<std::byte> bytes;
};

/// A segment as script bytes: a u8 head, the fd specs, u16 length, the bytes. A head with
/// bit 3 clear is followed by (head & 7) specs; with bit 3 set, by one spec and a u8 count
/// of its copies (at most max_fds_per_message: enough for a manifest's continuations).
void put_segment(std::vector<std::byte>& out, const segment& part);
/// The next segment of a script (past the end: an empty one).
[[nodiscard]] segment read_segment(byte_reader& input);

/// A connected socket pair: the code under test reads `reader` (blocking, as vmm::ipc
/// requires); the fuzzing thread writes `writer` (non-blocking, see the file comment).
class peer_channel {
 public:
  peer_channel();
  [[nodiscard]] int reader() const noexcept { return reader_.get(); }
  [[nodiscard]] int writer() const noexcept { return writer_.get(); }
  /// Writes `bytes` with `fds` attached in one sendmsg and returns the bytes written. Once
  /// the socket refuses (full: a short write) the peer is closed and sends nothing more.
  /// Empty bytes send nothing (a stream socket cannot carry fds without a byte).
  std::size_t send(std::span<const std::byte> bytes, std::span<const int> fds);
  /// Sends a well-formed vmm::ipc frame (header + payload, fds on the header); false when
  /// not all of it was written.
  bool send_frame(std::span<const std::byte> payload, std::span<const int> fds);
  /// Whether every send so far was written whole.
  [[nodiscard]] bool open() const noexcept { return open_; }
  /// The peer is done writing (shutdown(SHUT_WR)); it still reads what is sent to it.
  void finish();

 private:
  unique_fd reader_;
  unique_fd writer_;
  bool open_ = true;
};

}  // namespace vmm::fuzz
