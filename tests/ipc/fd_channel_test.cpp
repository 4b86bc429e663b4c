/// @file
/// Tests for vmm/ipc/fd_channel.hpp. The error tests count the entries of /proc/self/fd
/// before and after to prove that every received descriptor is closed again.
/// FD_PEER_PATH (a compile definition) is the path of the tests/helpers/fd_peer program.

#include <vmm/error.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/protocol_error.hpp>
#include <vmm/unique_fd.hpp>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "process_resources.hpp"

extern char** environ;

namespace {

using vmm::unique_fd;
using vmm::ipc::frame_header;
using vmm::ipc::message;
using vmm::testing::descriptor_limit;
using vmm::testing::lowest_free_descriptor;
using vmm::testing::open_fd_count;

std::vector<std::byte> to_bytes(std::string_view text) {
  auto const bytes = std::as_bytes(std::span{text});
  return {bytes.begin(), bytes.end()};
}

std::string to_string(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

unique_fd make_memfd(std::string_view contents) {
  unique_fd fd{::memfd_create("ipc_fd_channel_test", MFD_CLOEXEC)};
  if (!fd) throw vmm::os_error(errno, "memfd_create");
  if (::pwrite(fd.get(), contents.data(), contents.size(), 0) != static_cast<ssize_t>(contents.size())) {
    throw vmm::os_error(errno, "pwrite to memfd");
  }
  return fd;
}

/// The whole file behind `fd`, read from offset 0 without moving the shared offset.
std::string read_file(int fd) {
  struct stat status {};
  if (::fstat(fd, &status) != 0) throw vmm::os_error(errno, "fstat");
  std::string contents(static_cast<std::size_t>(status.st_size), '\0');
  if (::pread(fd, contents.data(), contents.size(), 0) != static_cast<ssize_t>(contents.size())) {
    throw vmm::os_error(errno, "pread");
  }
  return contents;
}

std::pair<unique_fd, unique_fd> make_pipe() {
  std::array<int, 2> ends{-1, -1};
  if (::pipe2(ends.data(), O_CLOEXEC) != 0) throw vmm::os_error(errno, "pipe2");
  return {unique_fd{ends[0]}, unique_fd{ends[1]}};
}

ino_t inode_of(int fd) {
  struct stat status {};
  if (::fstat(fd, &status) != 0) throw vmm::os_error(errno, "fstat");
  return status.st_ino;
}

/// One sendmsg of `bytes` with `fds` attached, bypassing send_message, to build frames that
/// send_message would never produce.
void send_raw(int socket_fd, std::span<const std::byte> bytes, std::span<const int> fds = {}) {
  iovec io{const_cast<std::byte*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) std::array<std::byte, CMSG_SPACE(sizeof(int) * 16)> control{};
  msghdr header{};
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  if (!fds.empty()) {
    ASSERT_LE(fds.size(), 16U);
    header.msg_control = control.data();
    header.msg_controllen = CMSG_SPACE(fds.size_bytes());
    cmsghdr* part = CMSG_FIRSTHDR(&header);
    part->cmsg_level = SOL_SOCKET;
    part->cmsg_type = SCM_RIGHTS;
    part->cmsg_len = CMSG_LEN(fds.size_bytes());
    std::memcpy(CMSG_DATA(part), fds.data(), fds.size_bytes());
  }
  ASSERT_EQ(::sendmsg(socket_fd, &header, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()))
      << std::strerror(errno);
}

std::vector<std::byte> header_bytes(std::uint32_t magic, std::uint32_t fd_count, std::uint64_t payload_size) {
  frame_header const header{magic, fd_count, payload_size};
  auto const bytes = std::as_bytes(std::span{&header, 1});
  return {bytes.begin(), bytes.end()};
}

/// Runs `receive` and expects it to throw `Error` whose what() contains `expected_text`.
template <typename Error, typename Receive>
void expect_error(Receive&& receive, std::string_view expected_text) {
  try {
    receive();
    ADD_FAILURE() << "expected an exception containing \"" << expected_text << "\"";
  } catch (const Error& error) {
    EXPECT_NE(std::string_view{error.what()}.find(expected_text), std::string_view::npos)
        << "what(): " << error.what();
  }
}

/// A directory under the test temp dir, removed with its contents at scope exit.
class temporary_directory {
 public:
  temporary_directory() {
    std::string pattern = (std::filesystem::path{::testing::TempDir()} / "vmm_ipc_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw vmm::os_error(errno, "mkdtemp " + pattern);
    path_ = pattern;
  }
  temporary_directory(const temporary_directory&) = delete;
  temporary_directory& operator=(const temporary_directory&) = delete;
  ~temporary_directory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

TEST(fd_channel, round_trip_carries_payload_and_three_descriptors) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("alpha");
  auto [pipe_read, pipe_write] = make_pipe();
  std::array<int, 3> const sent_fds{memfd.get(), pipe_read.get(), pipe_write.get()};

  vmm::ipc::send_message(sender.get(), to_bytes("hello, channel"), sent_fds);
  message const received = vmm::ipc::receive_message(receiver.get(), 3);

  EXPECT_EQ(to_string(received.payload), "hello, channel");
  ASSERT_EQ(received.fds.size(), 3U);
  for (std::size_t i = 0; i < received.fds.size(); ++i) {
    EXPECT_NE(received.fds[i].get(), sent_fds[i]) << "descriptor " << i << " was not duplicated";
    EXPECT_NE(::fcntl(received.fds[i].get(), F_GETFD) & FD_CLOEXEC, 0)
        << "descriptor " << i << " is not close-on-exec";
  }

  EXPECT_EQ(inode_of(received.fds[0].get()), inode_of(memfd.get()));
  EXPECT_EQ(read_file(received.fds[0].get()), "alpha");
  ASSERT_EQ(::pwrite(received.fds[0].get(), "omega", 5, 0), 5);
  EXPECT_EQ(read_file(memfd.get()), "omega");

  ASSERT_EQ(::write(received.fds[2].get(), "to original", 11), 11);
  std::array<char, 11> from_original{};
  ASSERT_EQ(::read(pipe_read.get(), from_original.data(), from_original.size()), 11);
  EXPECT_EQ(std::string_view(from_original.data(), from_original.size()), "to original");

  ASSERT_EQ(::write(pipe_write.get(), "to copy", 7), 7);
  std::array<char, 7> from_copy{};
  ASSERT_EQ(::read(received.fds[1].get(), from_copy.data(), from_copy.size()), 7);
  EXPECT_EQ(std::string_view(from_copy.data(), from_copy.size()), "to copy");
}

TEST(fd_channel, large_payload_from_another_thread_arrives_whole) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  constexpr std::size_t payload_size = std::size_t{8} << 20;
  int send_buffer = 0;
  socklen_t length = sizeof(send_buffer);
  ASSERT_EQ(::getsockopt(sender.get(), SOL_SOCKET, SO_SNDBUF, &send_buffer, &length), 0);
  ASSERT_LT(static_cast<std::size_t>(send_buffer), payload_size / 2)
      << "the socket buffer would hold the whole payload, so no partial write would happen";

  std::vector<std::byte> payload(payload_size);
  for (std::size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<std::byte>((i * 131) ^ (i >> 13));
  }
  unique_fd const memfd = make_memfd("large");
  std::array<int, 1> const fds{memfd.get()};

  std::exception_ptr send_error;
  std::thread writer([&, socket = std::move(sender)]() mutable {
    try {
      vmm::ipc::send_message(socket.get(), payload, fds);
    } catch (...) {
      send_error = std::current_exception();
    }
    socket.reset();  // a message cut short then fails the reader instead of blocking it
  });
  std::optional<message> received;
  try {
    received = vmm::ipc::receive_message(receiver.get(), 1);
  } catch (...) {
    receiver.reset();  // unblocks the writer with EPIPE
    writer.join();
    throw;
  }
  writer.join();
  if (send_error) std::rethrow_exception(send_error);

  ASSERT_EQ(received->payload.size(), payload.size());
  EXPECT_TRUE(received->payload == payload) << "the payload was corrupted or reordered";
  EXPECT_EQ(read_file(received->fds.at(0).get()), "large");
}

std::atomic<int> interruptions{0};

/// Installs a SIGUSR1 handler without SA_RESTART for the scope, so that a blocked sendmsg
/// or recvmsg returns early (EINTR, or a partial count) whenever the signal arrives.
class interrupting_signal {
 public:
  interrupting_signal() {
    struct sigaction action {};
    action.sa_handler = [](int) { interruptions.fetch_add(1, std::memory_order_relaxed); };
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;
    if (::sigaction(SIGUSR1, &action, &saved_) != 0) throw vmm::os_error(errno, "sigaction");
  }
  interrupting_signal(const interrupting_signal&) = delete;
  interrupting_signal& operator=(const interrupting_signal&) = delete;
  ~interrupting_signal() { ::sigaction(SIGUSR1, &saved_, nullptr); }

 private:
  struct sigaction saved_ {};
};

TEST(fd_channel, signals_interrupting_both_ends_neither_corrupt_nor_repeat) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  constexpr int message_count = 16;
  std::vector<std::byte> payload(std::size_t{2} << 20);
  for (std::size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<std::byte>((i * 7) ^ (i >> 11));
  }
  unique_fd const memfd = make_memfd("interrupted");
  std::array<int, 2> const fds{memfd.get(), memfd.get()};
  interrupting_signal const handler;
  interruptions = 0;

  // Each signal cuts the writer's sendmsg short (a partial write, or EINTR before any
  // byte) and likewise the reader's recvmsg; send_message must carry on without sending
  // the descriptors again, receive_message without losing bytes. The writer closes its end
  // when done, so a message it cut short fails the reader instead of blocking it.
  std::atomic<bool> writer_done{false};
  std::exception_ptr send_error;
  std::thread writer([&, socket = std::move(sender)]() mutable {
    try {
      for (int i = 0; i < message_count; ++i) vmm::ipc::send_message(socket.get(), payload, fds);
    } catch (...) {
      send_error = std::current_exception();
    }
    socket.reset();
    writer_done = true;
  });
  pthread_t const reader_thread = ::pthread_self();
  pthread_t const writer_thread = writer.native_handle();
  std::thread interrupter([&] {
    do {
      ::pthread_kill(writer_thread, SIGUSR1);
      ::pthread_kill(reader_thread, SIGUSR1);
    } while (!writer_done);
  });

  std::vector<message> received;
  std::exception_ptr receive_error;
  try {
    for (int i = 0; i < message_count; ++i) {
      received.push_back(vmm::ipc::receive_message(receiver.get(), 2));
    }
  } catch (...) {
    receive_error = std::current_exception();
    receiver.reset();  // unblocks the writer with EPIPE
  }
  interrupter.join();
  writer.join();
  if (send_error) std::rethrow_exception(send_error);
  if (receive_error) std::rethrow_exception(receive_error);

  EXPECT_GT(interruptions.load(), 0);
  for (std::size_t i = 0; i < received.size(); ++i) {
    EXPECT_TRUE(received[i].payload == payload) << "message " << i << " was corrupted";
    EXPECT_EQ(read_file(received[i].fds.at(1).get()), "interrupted");
  }
}

TEST(fd_channel, queued_messages_keep_their_own_descriptors) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const first = make_memfd("first");
  unique_fd const second = make_memfd("second");
  unique_fd const third = make_memfd("third");
  std::array<int, 1> const first_fds{first.get()};
  std::array<int, 2> const second_fds{second.get(), third.get()};

  vmm::ipc::send_message(sender.get(), to_bytes("one"), first_fds);
  vmm::ipc::send_message(sender.get(), to_bytes("two"), second_fds);
  vmm::ipc::send_message(sender.get(), to_bytes("three"));

  message const one = vmm::ipc::receive_message(receiver.get());
  message const two = vmm::ipc::receive_message(receiver.get());
  message const three = vmm::ipc::receive_message(receiver.get());

  EXPECT_EQ(to_string(one.payload), "one");
  ASSERT_EQ(one.fds.size(), 1U);
  EXPECT_EQ(read_file(one.fds[0].get()), "first");
  EXPECT_EQ(to_string(two.payload), "two");
  ASSERT_EQ(two.fds.size(), 2U);
  EXPECT_EQ(read_file(two.fds[0].get()), "second");
  EXPECT_EQ(read_file(two.fds[1].get()), "third");
  EXPECT_EQ(to_string(three.payload), "three");
  EXPECT_TRUE(three.fds.empty());
}

TEST(fd_channel, empty_payload_without_descriptors_keeps_framing) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  vmm::ipc::send_message(sender.get(), {}, {});
  vmm::ipc::send_message(sender.get(), to_bytes("after"), {});

  message const empty = vmm::ipc::receive_message(receiver.get(), 0);
  EXPECT_TRUE(empty.payload.empty());
  EXPECT_TRUE(empty.fds.empty());
  message const after = vmm::ipc::receive_message(receiver.get(), 0);
  EXPECT_EQ(to_string(after.payload), "after");
}

TEST(fd_channel, maximum_descriptor_count_round_trips) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("many");
  std::vector<int> const fds(vmm::ipc::max_fds_per_message, memfd.get());

  vmm::ipc::send_message(sender.get(), to_bytes("x"), fds);
  message const received = vmm::ipc::receive_message(receiver.get(), fds.size());

  ASSERT_EQ(received.fds.size(), vmm::ipc::max_fds_per_message);
  ino_t const expected = inode_of(memfd.get());
  EXPECT_TRUE(std::all_of(received.fds.begin(), received.fds.end(),
                          [&](const unique_fd& fd) { return inode_of(fd.get()) == expected; }));
}

TEST(fd_channel, wrong_descriptor_count_is_rejected_and_closes_what_arrived) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("one");
  std::array<int, 1> const fds{memfd.get()};
  vmm::ipc::send_message(sender.get(), to_bytes("payload"), fds);

  std::size_t const before = open_fd_count();
  expect_error<vmm::ipc::protocol_error>([&] { (void)vmm::ipc::receive_message(receiver.get(), 2); },
                                         "expected 2 descriptors but the message carries 1");
  EXPECT_EQ(open_fd_count(), before);
}

TEST(fd_channel, peer_closing_before_any_byte_raises_peer_closed) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  vmm::ipc::send_message(sender.get(), to_bytes("last"));
  sender.reset();

  EXPECT_EQ(to_string(vmm::ipc::receive_message(receiver.get()).payload), "last");
  try {
    (void)vmm::ipc::receive_message(receiver.get());
    ADD_FAILURE() << "expected vmm::ipc::peer_closed";
  } catch (const vmm::ipc::peer_closed& error) {
    EXPECT_EQ(error.code().value(), ECONNRESET);
    EXPECT_NE(std::string_view{error.what()}.find("before sending a message"), std::string_view::npos)
        << error.what();
  }
}

TEST(fd_channel, peer_closing_mid_payload_names_the_counts) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("orphan");
  std::array<int, 1> const fds{memfd.get()};
  std::vector<std::byte> frame = header_bytes(vmm::ipc::frame_magic, 1, 100);
  frame.resize(frame.size() + 10, std::byte{0x5a});
  send_raw(sender.get(), frame, fds);
  sender.reset();

  std::size_t const before = open_fd_count();
  try {
    (void)vmm::ipc::receive_message(receiver.get());
    ADD_FAILURE() << "expected vmm::os_error";
  } catch (const vmm::ipc::peer_closed& error) {
    ADD_FAILURE() << "a message cut short is not an orderly close: " << error.what();
  } catch (const vmm::os_error& error) {
    EXPECT_EQ(error.code().value(), ECONNRESET);
    EXPECT_NE(std::string_view{error.what()}.find("peer closed after 10 of 100 payload bytes"),
              std::string_view::npos)
        << error.what();
  }
  EXPECT_EQ(open_fd_count(), before);
}

TEST(fd_channel, peer_closing_mid_header_names_the_counts) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  std::vector<std::byte> frame = header_bytes(vmm::ipc::frame_magic, 0, 0);
  frame.resize(5);
  send_raw(sender.get(), frame);
  sender.reset();

  expect_error<vmm::os_error>([&] { (void)vmm::ipc::receive_message(receiver.get()); },
                              "peer closed after 5 of 16 header bytes");
}

TEST(fd_channel, bad_magic_is_rejected_and_closes_the_descriptors) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("bad");
  std::array<int, 2> const fds{memfd.get(), memfd.get()};
  send_raw(sender.get(), header_bytes(0xdeadbeef, 2, 0), fds);

  std::size_t const before = open_fd_count();
  expect_error<vmm::ipc::protocol_error>([&] { (void)vmm::ipc::receive_message(receiver.get()); },
                                         "bad magic 0xdeadbeef");
  EXPECT_EQ(open_fd_count(), before);
}

TEST(fd_channel, oversized_declared_payload_is_rejected_and_closes_the_descriptors) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("big");
  std::array<int, 1> const fds{memfd.get()};
  std::uint64_t const declared = vmm::ipc::max_payload_bytes + 1;
  send_raw(sender.get(), header_bytes(vmm::ipc::frame_magic, 1, declared), fds);

  std::size_t const before = open_fd_count();
  expect_error<vmm::ipc::protocol_error>([&] { (void)vmm::ipc::receive_message(receiver.get()); },
                                         "a payload of " + std::to_string(declared) + " bytes");
  EXPECT_EQ(open_fd_count(), before);
}

TEST(fd_channel, header_descriptor_count_must_match_what_arrived) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("count");
  std::array<int, 1> const fds{memfd.get()};
  send_raw(sender.get(), header_bytes(vmm::ipc::frame_magic, 3, 0), fds);

  std::size_t const before = open_fd_count();
  expect_error<vmm::ipc::protocol_error>([&] { (void)vmm::ipc::receive_message(receiver.get()); },
                                         "header declares 3 descriptors but 1 arrived");
  EXPECT_EQ(open_fd_count(), before);
}

TEST(fd_channel, descriptors_after_the_first_read_are_rejected_and_closed) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("late");
  std::array<int, 1> const first_fds{memfd.get()};
  std::array<int, 2> const late_fds{memfd.get(), memfd.get()};
  send_raw(sender.get(), header_bytes(vmm::ipc::frame_magic, 1, 4), first_fds);
  send_raw(sender.get(), to_bytes("late"), late_fds);

  std::size_t const before = open_fd_count();
  expect_error<vmm::ipc::protocol_error>([&] { (void)vmm::ipc::receive_message(receiver.get()); },
                                         "2 descriptors arrived after 0 payload bytes");
  EXPECT_EQ(open_fd_count(), before);
}

TEST(fd_channel, truncated_descriptors_are_an_error_and_leak_nothing) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("truncated");
  std::array<int, 3> const fds{memfd.get(), memfd.get(), memfd.get()};
  vmm::ipc::send_message(sender.get(), to_bytes("x"), fds);

  std::size_t const before = open_fd_count();
  // With the soft limit just above the lowest free descriptor number, the kernel can
  // install one of the three descriptors and must truncate the rest (MSG_CTRUNC).
  int const lowest_free = lowest_free_descriptor();
  std::exception_ptr failure;
  {
    // Only catch under the lowered limit: UBSan's vptr check opens a pipe, and would
    // report a false "invalid vptr" when it cannot.
    descriptor_limit const limit{static_cast<rlim_t>(lowest_free) + 1};
    try {
      (void)vmm::ipc::receive_message(receiver.get());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  EXPECT_EQ(open_fd_count(), before);
  ASSERT_TRUE(failure) << "expected vmm::os_error";
  try {
    std::rethrow_exception(failure);
  } catch (const vmm::os_error& error) {
    EXPECT_EQ(error.code().value(), EMFILE);
    EXPECT_NE(std::string_view{error.what()}.find("MSG_CTRUNC) after 1"), std::string_view::npos)
        << error.what();
  }
}

TEST(fd_channel, send_refuses_too_many_descriptors_or_too_large_a_payload) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("limits");
  std::vector<int> const too_many(vmm::ipc::max_fds_per_message + 1, memfd.get());
  expect_error<vmm::invalid_argument>([&] { vmm::ipc::send_message(sender.get(), to_bytes("x"), too_many); },
                                      "254 descriptors; a message carries at most 253");

  std::vector<std::byte> const too_large(vmm::ipc::max_payload_bytes + 1);
  expect_error<vmm::invalid_argument>([&] { vmm::ipc::send_message(sender.get(), too_large); },
                                      "payload of " + std::to_string(too_large.size()) + " bytes");

  // Nothing of the refused messages reached the stream.
  vmm::ipc::send_message(sender.get(), to_bytes("valid"));
  EXPECT_EQ(to_string(vmm::ipc::receive_message(receiver.get(), 0).payload), "valid");
}

TEST(fd_channel, send_to_a_closed_peer_is_epipe_not_sigpipe) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  receiver.reset();
  try {
    vmm::ipc::send_message(sender.get(), to_bytes("nobody"));
    ADD_FAILURE() << "expected vmm::os_error";
  } catch (const vmm::os_error& error) {
    EXPECT_EQ(error.code().value(), EPIPE);
  }
}

/// The timeout of the deadline tests: short, so that they run quickly, and long enough
/// that a loaded machine does not matter, since the peer in these tests never sends more.
constexpr std::chrono::milliseconds short_timeout{200};

/// Runs `receive` and expects a timeout_error (ETIMEDOUT) whose what() contains
/// `expected_text`.
template <typename Receive>
void expect_timeout(Receive&& receive, std::string_view expected_text) {
  try {
    receive();
    ADD_FAILURE() << "expected vmm::ipc::timeout_error containing \"" << expected_text << "\"";
  } catch (const vmm::ipc::timeout_error& error) {
    EXPECT_EQ(error.code().value(), ETIMEDOUT);
    EXPECT_NE(std::string_view{error.what()}.find(expected_text), std::string_view::npos)
        << "what(): " << error.what();
  }
}

TEST(fd_channel, peer_stopping_mid_payload_times_out_and_closes_what_arrived) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("stalled");
  std::array<int, 2> const fds{memfd.get(), memfd.get()};
  std::vector<std::byte> frame = header_bytes(vmm::ipc::frame_magic, 2, 100);
  frame.resize(frame.size() + 3, std::byte{0x5a});
  send_raw(sender.get(), frame, fds);  // and the sender stays open, sending nothing more

  std::size_t const before = open_fd_count();
  expect_timeout([&] { (void)vmm::ipc::receive_message(receiver.get(), 2, short_timeout); },
                 "timed out with 3 of 100 payload bytes received");
  EXPECT_EQ(open_fd_count(), before);
}

TEST(fd_channel, peer_stopping_mid_header_times_out) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  std::vector<std::byte> frame = header_bytes(vmm::ipc::frame_magic, 0, 0);
  frame.resize(5);
  send_raw(sender.get(), frame);

  expect_timeout([&] { (void)vmm::ipc::receive_message(receiver.get(), {}, short_timeout); },
                 "timed out with 5 of 16 header bytes received");
}

TEST(fd_channel, peer_sending_nothing_times_out) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  try {
    (void)vmm::ipc::receive_message(receiver.get(), {}, short_timeout);
    ADD_FAILURE() << "expected vmm::ipc::timeout_error";
  } catch (const vmm::ipc::peer_closed& error) {
    ADD_FAILURE() << "the peer is still there: " << error.what();
  } catch (const vmm::ipc::timeout_error& error) {
    EXPECT_EQ(error.code().value(), ETIMEDOUT);
    EXPECT_NE(std::string_view{error.what()}.find("timed out with 0 of 16 header bytes received"),
              std::string_view::npos)
        << error.what();
    EXPECT_NE(std::string_view{error.what()}.find("(timeout 200 ms)"), std::string_view::npos)
        << error.what();
  }
}

TEST(fd_channel, zero_timeout_takes_only_what_has_arrived) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  using std::chrono::milliseconds;
  expect_timeout([&] { (void)vmm::ipc::receive_message(receiver.get(), {}, milliseconds{0}); },
                 "0 of 16 header bytes");
  vmm::ipc::send_message(sender.get(), to_bytes("queued"), {}, milliseconds{0});
  EXPECT_EQ(to_string(vmm::ipc::receive_message(receiver.get(), 0, milliseconds{0}).payload), "queued");
}

TEST(fd_channel, no_timeout_carries_messages_as_before) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  unique_fd const memfd = make_memfd("unbounded");
  std::array<int, 1> const fds{memfd.get()};
  vmm::ipc::send_message(sender.get(), to_bytes("no deadline"), fds, vmm::ipc::no_timeout);
  message const received = vmm::ipc::receive_message(receiver.get(), 1, vmm::ipc::no_timeout);
  EXPECT_EQ(to_string(received.payload), "no deadline");
  EXPECT_EQ(read_file(received.fds.at(0).get()), "unbounded");
}

TEST(fd_channel, signals_during_the_wait_do_not_postpone_the_deadline) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  interrupting_signal const handler;
  interruptions = 0;

  // Without SA_RESTART every signal ends the reader's poll() with EINTR. A poll() called
  // again with the whole timeout would never end while the signals keep coming; the
  // deadline holds only if each call waits for the time left (else this test hangs until
  // ctest's TIMEOUT fails it).
  std::atomic<bool> receive_done{false};
  pthread_t const reader_thread = ::pthread_self();
  std::thread interrupter([&] {
    while (!receive_done) ::pthread_kill(reader_thread, SIGUSR1);
  });
  std::exception_ptr failure;
  try {
    (void)vmm::ipc::receive_message(receiver.get(), {}, short_timeout);
  } catch (...) {
    failure = std::current_exception();
  }
  receive_done = true;
  interrupter.join();

  EXPECT_GT(interruptions.load(), 0);
  ASSERT_TRUE(failure) << "expected vmm::ipc::timeout_error";
  expect_timeout([&] { std::rethrow_exception(failure); }, "0 of 16 header bytes");
}

TEST(fd_channel, send_to_a_peer_that_never_reads_times_out) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  constexpr std::size_t payload_size = std::size_t{8} << 20;
  int send_buffer = 0;
  socklen_t length = sizeof(send_buffer);
  ASSERT_EQ(::getsockopt(sender.get(), SOL_SOCKET, SO_SNDBUF, &send_buffer, &length), 0);
  ASSERT_LT(static_cast<std::size_t>(send_buffer), payload_size / 2)
      << "the socket buffer would hold the whole payload, so the send would not wait";

  std::vector<std::byte> const payload(payload_size);
  expect_timeout([&] { vmm::ipc::send_message(sender.get(), payload, {}, short_timeout); },
                 " of " + std::to_string(sizeof(frame_header) + payload_size) + " bytes sent");
}

TEST(fd_channel, non_blocking_sockets_carry_a_large_message_whole) {
  auto [sender, receiver] = vmm::ipc::make_socket_pair();
  for (int const fd : {sender.get(), receiver.get()}) {
    ASSERT_EQ(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK), 0) << std::strerror(errno);
  }
  std::vector<std::byte> payload(std::size_t{4} << 20);
  for (std::size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<std::byte>((i * 13) ^ (i >> 9));
  }
  unique_fd const memfd = make_memfd("non-blocking");
  std::array<int, 1> const fds{memfd.get()};

  // Both ends find the socket full or empty many times over (EAGAIN) and wait in poll().
  std::exception_ptr send_error;
  std::thread writer([&, socket = std::move(sender)]() mutable {
    try {
      vmm::ipc::send_message(socket.get(), payload, fds);
    } catch (...) {
      send_error = std::current_exception();
    }
    socket.reset();  // a message cut short then fails the reader instead of blocking it
  });
  std::optional<message> received;
  std::exception_ptr receive_error;
  try {
    received = vmm::ipc::receive_message(receiver.get(), 1);
  } catch (...) {
    receive_error = std::current_exception();
    receiver.reset();  // unblocks the writer with EPIPE
  }
  writer.join();
  if (send_error) std::rethrow_exception(send_error);
  if (receive_error) std::rethrow_exception(receive_error);

  EXPECT_TRUE(received->payload == payload) << "the payload was corrupted or reordered";
  EXPECT_EQ(read_file(received->fds.at(0).get()), "non-blocking");
}

TEST(fd_channel, a_negative_socket_is_ebadf_at_once) {
  // poll() would skip it and wait out the whole timeout.
  for (auto const& call : std::array<std::function<void()>, 2>{
           [] { (void)vmm::ipc::receive_message(-1, {}, vmm::ipc::no_timeout); },
           [] { vmm::ipc::send_message(-1, to_bytes("x"), {}, vmm::ipc::no_timeout); }}) {
    try {
      call();
      ADD_FAILURE() << "expected vmm::os_error";
    } catch (const vmm::os_error& error) {
      EXPECT_EQ(error.code().value(), EBADF) << error.what();
    }
  }
}

TEST(fd_channel, unix_socket_paths_are_validated) {
  std::string const long_path = "/tmp/" + std::string(200, 'p');
  expect_error<vmm::invalid_argument>([&] { (void)vmm::ipc::listen_unix(long_path); }, "is 205 bytes");
  expect_error<vmm::invalid_argument>([&] { (void)vmm::ipc::connect_unix(long_path); }, "is 205 bytes");
  expect_error<vmm::invalid_argument>([&] { (void)vmm::ipc::connect_unix(""); }, "empty");

  temporary_directory const directory;
  try {
    (void)vmm::ipc::connect_unix((directory.path() / "missing.sock").string());
    ADD_FAILURE() << "expected vmm::os_error";
  } catch (const vmm::os_error& error) {
    EXPECT_EQ(error.code().value(), ENOENT);
  }
}

TEST(fd_channel, listen_connect_accept_carry_messages_both_ways) {
  temporary_directory const directory;
  std::string const path = (directory.path() / "channel.sock").string();
  unique_fd const listener = vmm::ipc::listen_unix(path);
  expect_error<vmm::os_error>([&] { (void)vmm::ipc::listen_unix(path); }, path);

  unique_fd const client = vmm::ipc::connect_unix(path);
  unique_fd const server = vmm::ipc::accept_unix(listener.get());
  EXPECT_NE(::fcntl(server.get(), F_GETFD) & FD_CLOEXEC, 0);

  unique_fd const memfd = make_memfd("via path");
  std::array<int, 1> const fds{memfd.get()};
  vmm::ipc::send_message(client.get(), to_bytes("ping"), fds);
  message const request = vmm::ipc::receive_message(server.get(), 1);
  EXPECT_EQ(to_string(request.payload), "ping");
  EXPECT_EQ(read_file(request.fds[0].get()), "via path");

  vmm::ipc::send_message(server.get(), to_bytes("pong"));
  EXPECT_EQ(to_string(vmm::ipc::receive_message(client.get(), 0).payload), "pong");
}

/// A spawned process, reaped at scope exit if the test did not reap it.
class child_process {
 public:
  child_process(const char* program, const std::string& argument) {
    std::string program_copy = program;
    std::string argument_copy = argument;
    std::array<char*, 3> argv{program_copy.data(), argument_copy.data(), nullptr};
    int const error = ::posix_spawn(&pid_, program, nullptr, nullptr, argv.data(), environ);
    if (error != 0) throw vmm::os_error(error, std::string{"posix_spawn "} + program);
    exit_watch_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
  }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  ~child_process() {
    if (pid_ > 0) (void)wait();
  }

  /// Readable once the child has exited; -1 where pidfd_open is unavailable.
  [[nodiscard]] int exit_watch() const { return exit_watch_.get(); }

  /// Waits for the child and returns its wait status.
  int wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {}
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  unique_fd exit_watch_;
};

/// Accepts the child's connection, or fails if the child exits without connecting
/// (instead of blocking in accept forever).
unique_fd accept_from(child_process& child, int listen_fd) {
  if (child.exit_watch() >= 0) {
    std::array<pollfd, 2> watched{pollfd{listen_fd, POLLIN, 0}, pollfd{child.exit_watch(), POLLIN, 0}};
    while (::poll(watched.data(), watched.size(), -1) < 0) {
      if (errno != EINTR) throw vmm::os_error(errno, "poll");
    }
    if ((watched[0].revents & POLLIN) == 0) {
      int const status = child.wait();
      throw std::runtime_error("fd_peer exited before connecting, wait status " + std::to_string(status));
    }
  }
  return vmm::ipc::accept_unix(listen_fd);
}

TEST(fd_channel, second_process_reads_the_memfd_and_replies) {
  temporary_directory const directory;
  std::string const path = (directory.path() / "peer.sock").string();
  unique_fd const listener = vmm::ipc::listen_unix(path);
  child_process child(FD_PEER_PATH, path);
  unique_fd const channel = accept_from(child, listener.get());

  std::string const contents = "bytes for another process \x01\x02\x03";
  unique_fd const memfd = make_memfd(contents);
  std::array<int, 1> const fds{memfd.get()};
  vmm::ipc::send_message(channel.get(), to_bytes("take this"), fds);

  message const reply = vmm::ipc::receive_message(channel.get(), 1);
  EXPECT_EQ(to_string(reply.payload), contents);
  std::string reversed = contents;
  std::reverse(reversed.begin(), reversed.end());
  EXPECT_EQ(read_file(reply.fds[0].get()), reversed);
  EXPECT_EQ(read_file(memfd.get()), contents + "|seen by fd_peer");

  int const status = child.wait();
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
