// Export -> fd over a real Unix socket -> import -> map in a second process, on every
// provider that can export; the ones that cannot must say so.

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/address_range.hpp"
#include "vmm/error.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/mapping.hpp"
#include "vmm/physical_allocation.hpp"

extern char** environ;

namespace vmm::testing {
namespace {

template <class Kind>
class sharing : public provider_test<Kind> {};
TYPED_TEST_SUITE(sharing, all_memory_kinds, memory_kind_names);

// Starts the import peer for Kind on `socket_path`; returns its pid.
template <class Kind>
pid_t spawn_peer(const std::string& socket_path) {
  const std::string program = VMM_IMPORT_PEER_PATH;
  std::string kind = Kind::name;
  char* argv[] = {const_cast<char*>(program.c_str()), kind.data(), const_cast<char*>(socket_path.c_str()),
                  nullptr};
  pid_t pid = -1;
  if (::posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv, environ) != 0) return -1;
  return pid;
}

std::string temporary_socket_path() {
  const auto directory = std::filesystem::temp_directory_path() / ("vmm-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  return (directory / "peer.sock").string();
}

TYPED_TEST(sharing, an_exported_handle_maps_in_another_process_with_the_same_bytes) {
  const std::size_t size = 2 * this->granularity_;
  physical_allocation memory(this->provider_, size);
  if (this->provider_->capabilities().export_kind == handle_kind::none) {
    EXPECT_THROW((void)memory.export_fd(), invalid_argument);
    return;
  }
  address_range range(this->provider_, size);
  mapping mapped(memory, range.address(), access_mode::read_write);
  const auto bytes = pattern(size, 11);
  write_bytes(*this->provider_, range.address(), bytes);

  const std::string path = temporary_socket_path();
  std::filesystem::remove(path);
  unique_fd listener = ipc::listen_unix(path);
  const pid_t peer = spawn_peer<TypeParam>(path);
  ASSERT_GT(peer, 0);
  unique_fd connection = ipc::accept_unix(listener.get());
  unique_fd exported = memory.export_fd();
  const std::uint64_t size_field = size;
  const int fds[] = {exported.get()};
  ipc::send_message(connection.get(), std::as_bytes(std::span(&size_field, 1)), fds);
  ipc::message reply = ipc::receive_message(connection.get(), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(peer, &status, 0), peer);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_EQ(reply.payload.size(), sizeof(std::uint64_t));
  std::uint64_t seen = 0;
  std::memcpy(&seen, reply.payload.data(), sizeof seen);
  EXPECT_EQ(seen, checksum(bytes.data(), bytes.size()));
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TYPED_TEST(sharing, an_import_in_the_same_process_aliases_the_memory) {
  const std::size_t g = this->granularity_;
  physical_allocation memory(this->provider_, g);
  if (this->provider_->capabilities().export_kind == handle_kind::none) {
    EXPECT_THROW((void)memory.export_fd(), invalid_argument);
    return;
  }
  unique_fd fd = memory.export_fd();
  physical_allocation imported = physical_allocation::import_fd(this->provider_, fd.get(), g);
  address_range range(this->provider_, 2 * g);
  mapping first(memory, range.address(), access_mode::read_write);
  mapping second(imported, range.address() + g, access_mode::read_write);
  const auto bytes = pattern(g, 12);
  write_bytes(*this->provider_, range.address(), bytes);
  EXPECT_EQ(read_bytes(*this->provider_, range.address() + g, g), bytes);
}

}  // namespace
}  // namespace vmm::testing
