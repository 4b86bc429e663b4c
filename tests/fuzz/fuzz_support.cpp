#include "fuzz_support.hpp"

#include <vmm/error.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/location.hpp>
#include <vmm/provider.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>

namespace vmm::fuzz {
namespace {

// AddressSanitizer's primary allocator on x86_64 Linux lives at a fixed 4 TiB region
// (kAllocatorSpace, kAllocatorSize in asan_allocator.h): its mappings grow with the heap,
// and nothing of the library's is placed there.
constexpr std::uintptr_t sanitizer_heap_begin = 0x600000000000;
constexpr std::uintptr_t sanitizer_heap_end = 0x640000000000;

int read_only_file = -1;  // opened once, duplicated for each input that sends it

void cleanup_failure_is_a_finding(const char* what) noexcept {
  std::fprintf(stderr, "vmm fuzz finding: a destructor reported a cleanup failure: %s\n", what);
  std::abort();
}

void make_read_only_file() {
  const char* dir = std::getenv("TMPDIR");
  std::string path = fmt::format("{}/vmm-fuzz-XXXXXX", dir != nullptr ? dir : "/tmp");
  const int writable = ::mkostemp(path.data(), O_CLOEXEC);
  if (writable < 0) finding(fmt::format("mkostemp {}: {}", path, std::strerror(errno)));
  const std::array<char, 2 * page> contents{};
  if (::write(writable, contents.data(), contents.size()) != static_cast<ssize_t>(contents.size()))
    finding("writing the read-only file");
  read_only_file = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (read_only_file < 0) finding(fmt::format("open {}: {}", path, std::strerror(errno)));
  ::unlink(path.c_str());
  ::close(writable);
}

unique_fd checked(int fd, const char* what) {
  if (fd < 0) finding(fmt::format("{}: {}", what, std::strerror(errno)));
  return unique_fd(fd);
}

}  // namespace

void initialize() {
  set_cleanup_failure_handler(&cleanup_failure_is_a_finding);
  // Room for an input's fds and their received copies where the soft limit is 1024.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < 4096 && files.rlim_max > files.rlim_cur) {
    files.rlim_cur = std::min<rlim_t>(files.rlim_max, 4096);
    (void)::setrlimit(RLIMIT_NOFILE, &files);
  }
  ::signal(SIGPIPE, SIG_IGN);
  if (read_only_file < 0) make_read_only_file();
  // The GPU driver, where there is one, opens descriptors of its own on first use and keeps
  // them: opened here, before the first input, so that an input reaching the driver (a
  // location on a GPU) is not taken for a leak. Without a GPU this throws, and nothing opens.
  try {
    (void)provider_for(location::device(0));
  } catch (const std::exception&) {}
}

void finding(const std::string& what) {
  std::fprintf(stderr, "vmm fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

std::uint8_t byte_reader::u8() noexcept {
  if (bytes_.empty()) return 0;
  const auto value = std::to_integer<std::uint8_t>(bytes_.front());
  bytes_ = bytes_.subspan(1);
  return value;
}

std::uint16_t byte_reader::u16() noexcept {
  const std::uint16_t low = u8();
  return static_cast<std::uint16_t>(low | u8() << 8);
}

std::span<const std::byte> byte_reader::take(std::size_t n) noexcept {
  const std::span<const std::byte> part = bytes_.first(std::min(n, bytes_.size()));
  bytes_ = bytes_.subspan(part.size());
  return part;
}

void put_u8(std::vector<std::byte>& out, std::uint8_t value) {
  out.push_back(static_cast<std::byte>(value));
}

void put_u16(std::vector<std::byte>& out, std::uint16_t value) {
  put_u8(out, static_cast<std::uint8_t>(value));
  put_u8(out, static_cast<std::uint8_t>(value >> 8));
}

void put_bytes(std::vector<std::byte>& out, std::span<const std::byte> bytes) {
  out.insert(out.end(), bytes.begin(), bytes.end());
}

std::size_t open_fd_count() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) finding(fmt::format("opendir /proc/self/fd: {}", std::strerror(errno)));
  std::size_t count = 0;
  while (const dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.') ++count;
  ::closedir(dir);
  return count - 1;  // the directory's own descriptor
}

mapping_census take_mapping_census() {
  // Read it whole before parsing: the reads themselves must not allocate between lines.
  static std::vector<char> text(std::size_t{1} << 20);
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) finding(fmt::format("open /proc/self/maps: {}", std::strerror(errno)));
  std::size_t length = 0;
  for (;;) {
    if (length == text.size()) text.resize(2 * text.size());
    const ssize_t got = ::read(fd, text.data() + length, text.size() - length);
    if (got < 0) finding(fmt::format("read /proc/self/maps: {}", std::strerror(errno)));
    if (got == 0) break;
    length += static_cast<std::size_t>(got);
  }
  ::close(fd);

  mapping_census census;
  std::size_t at = 0;
  while (at < length) {
    const char* line = text.data() + at;
    const auto* newline = static_cast<const char*>(std::memchr(line, '\n', length - at));
    const std::size_t line_length =
        newline != nullptr ? static_cast<std::size_t>(newline - line) : length - at;
    at += line_length + 1;
    const std::string entry(line, line_length);
    unsigned long begin = 0;
    unsigned long end = 0;
    char permissions[5] = {};
    unsigned long offset = 0;
    char device[16] = {};
    unsigned long inode = 0;
    int path_at = 0;
    if (std::sscanf(entry.c_str(), "%lx-%lx %4s %lx %15s %lu %n", &begin, &end, permissions, &offset, device,
                    &inode, &path_at) < 6)
      finding(fmt::format("unexpected line in /proc/self/maps: {}", entry));
    if (begin >= sanitizer_heap_begin && end <= sanitizer_heap_end) continue;
    ++census.lines;
    const std::string_view path = std::string_view(entry).substr(static_cast<std::size_t>(path_at));
    if (path.find("/memfd:") != std::string_view::npos) ++census.memfd_mappings;
    if (path.empty() && inode == 0 && std::string_view(permissions) == "---p")
      census.inaccessible_bytes += end - begin;
  }
  return census;
}

leak_check::leak_check(bool mappings)
    : mappings_(mappings),
      fds_(open_fd_count()),
      census_(mappings ? take_mapping_census() : mapping_census{}) {}

void leak_check::check(const char* target) const {
  const std::size_t fds = open_fd_count();
  if (fds != fds_)
    finding(fmt::format("{}: {} descriptors open before the input, {} after it", target, fds_, fds));
  if (!mappings_) return;
  const mapping_census now = take_mapping_census();
  if (!now.same_library_share(census_))
    finding(
        fmt::format("{}: /proc/self/maps changed over the input: memfd mappings {} -> {}, inaccessible "
                    "anonymous bytes {} -> {}, lines {} -> {}",
                    target, census_.memfd_mappings, now.memfd_mappings, census_.inaccessible_bytes,
                    now.inaccessible_bytes, census_.lines, now.lines));
}

std::vector<int> fd_stock::make_all(std::span<const std::uint8_t> specs) {
  std::vector<int> fds;
  for (const std::uint8_t spec : specs)
    if (const int fd = make(spec); fd >= 0) fds.push_back(fd);
  return fds;
}

int fd_stock::make(std::uint8_t spec) {
  if (owned_.size() + 1 >= budget) return -1;  // + 1: a pipe's other end
  const auto kind = static_cast<fd_kind>(spec & 7);
  const std::size_t size = (std::size_t{spec} >> 3) * page;
  const auto memfd = [&](std::size_t bytes, unsigned flags, unsigned seals) {
    unique_fd fd = checked(::memfd_create("vmm-fuzz", MFD_CLOEXEC | flags), "memfd_create");
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
      finding(fmt::format("ftruncate memfd: {}", std::strerror(errno)));
    if (seals != 0 && ::fcntl(fd.get(), F_ADD_SEALS, seals) != 0)
      finding(fmt::format("F_ADD_SEALS: {}", std::strerror(errno)));
    memfds_.push_back(fd.get());
    return fd;
  };
  unique_fd made;
  switch (kind) {
    case fd_kind::memfd:
      made = memfd(size, 0, 0);
      break;
    case fd_kind::sealed_memfd:
      made = memfd(size, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
      break;
    case fd_kind::odd_memfd:
      made = memfd(size + 512, 0, 0);
      break;
    case fd_kind::shrunk_memfd:
      made = memfd(size, 0, 0);
      to_shrink_.emplace_back(made.get(), size / 2 / page * page);
      break;
    case fd_kind::dev_null:
      made = checked(::open("/dev/null", O_RDWR | O_CLOEXEC), "open /dev/null");
      break;
    case fd_kind::pipe: {
      std::array<int, 2> ends{-1, -1};
      if (::pipe2(ends.data(), O_CLOEXEC) != 0) finding(fmt::format("pipe2: {}", std::strerror(errno)));
      made = unique_fd(ends[0]);
      owned_.emplace_back(ends[1]);
      break;
    }
    case fd_kind::read_only_file:
      made = checked(::fcntl(read_only_file, F_DUPFD_CLOEXEC, 0), "dup of the read-only file");
      break;
    case fd_kind::write_sealed_memfd:
      made = memfd(size, MFD_ALLOW_SEALING, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
      break;
  }
  const int fd = made.get();
  owned_.push_back(std::move(made));
  return fd;
}

void fd_stock::after_send() {
  for (const auto& [fd, size] : to_shrink_)
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0)
      finding(fmt::format("ftruncate to shrink a memfd: {}", std::strerror(errno)));
  to_shrink_.clear();
}

void put_segment(std::vector<std::byte>& out, const segment& part) {
  const std::vector<std::uint8_t>& specs = part.fd_specs;
  if (specs.size() <= 7) {
    put_u8(out, static_cast<std::uint8_t>(specs.size()));
    for (const std::uint8_t spec : specs) put_u8(out, spec);
  } else {
    if (specs.size() > ipc::max_fds_per_message ||
        std::count(specs.begin(), specs.end(), specs[0]) != std::ssize(specs))
      throw std::invalid_argument("put_segment: more than 7 fds must be copies of one spec, at most 253");
    put_u8(out, 8);
    put_u8(out, specs[0]);
    put_u8(out, static_cast<std::uint8_t>(specs.size()));
  }
  put_u16(out, static_cast<std::uint16_t>(part.bytes.size()));
  put_bytes(out, part.bytes);
}

segment read_segment(byte_reader& input) {
  segment part;
  const std::uint8_t head = input.u8();
  if ((head & 8) == 0) {
    for (std::size_t i = 0; i < (head & 7u); ++i) part.fd_specs.push_back(input.u8());
  } else {
    const std::uint8_t spec = input.u8();
    part.fd_specs.assign(std::min<std::size_t>(input.u8(), ipc::max_fds_per_message), spec);
  }
  const std::span<const std::byte> bytes = input.take(input.u16());
  part.bytes.assign(bytes.begin(), bytes.end());
  return part;
}

peer_channel::peer_channel() {
  auto [reader, writer] = ipc::make_socket_pair();
  reader_ = std::move(reader);
  writer_ = std::move(writer);
  // As large as the system allows (net.core.wmem_max): inputs are kept far below it.
  const int size = 4 << 20;
  (void)::setsockopt(writer_.get(), SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
}

std::size_t peer_channel::send(std::span<const std::byte> bytes, std::span<const int> fds) {
  if (!open_ || bytes.empty()) return 0;
  iovec io{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr header{};
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  alignas(cmsghdr) std::array<std::byte, CMSG_SPACE(sizeof(int) * ipc::max_fds_per_message)> control{};
  if (!fds.empty()) {
    header.msg_control = control.data();
    header.msg_controllen = CMSG_SPACE(fds.size_bytes());
    cmsghdr* part = CMSG_FIRSTHDR(&header);
    part->cmsg_level = SOL_SOCKET;
    part->cmsg_type = SCM_RIGHTS;
    part->cmsg_len = CMSG_LEN(fds.size_bytes());
    std::memcpy(CMSG_DATA(part), fds.data(), fds.size_bytes());
  }
  ssize_t sent = 0;
  do {
    sent = ::sendmsg(writer_.get(), &header, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0 && errno != EAGAIN && errno != ETOOMANYREFS)
    finding(fmt::format("peer: sendmsg of {} bytes with {} fds: {}", bytes.size(), fds.size(),
                        std::strerror(errno)));
  open_ = sent == static_cast<ssize_t>(bytes.size());
  return sent < 0 ? 0 : static_cast<std::size_t>(sent);
}

bool peer_channel::send_frame(std::span<const std::byte> payload, std::span<const int> fds) {
  const ipc::frame_header header{ipc::frame_magic, static_cast<std::uint32_t>(fds.size()), payload.size()};
  std::vector<std::byte> frame(sizeof(header));
  std::memcpy(frame.data(), &header, sizeof(header));
  put_bytes(frame, payload);
  return send(frame, fds) == frame.size();
}

void peer_channel::finish() {
  open_ = false;
  if (::shutdown(writer_.get(), SHUT_WR) != 0)
    finding(fmt::format("peer: shutdown: {}", std::strerror(errno)));
}

}  // namespace vmm::fuzz
