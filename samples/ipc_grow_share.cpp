// ipc_grow_share: two processes share one growing buffer without copying it.
//
// The producer fills a growable buffer and keeps growing it. After each growth it sends
// the consumer a manifest of the new chunks only (vmm::ipc::exporter::export_growth) and
// hands the round over in stream order (vmm::ipc::handoff_producer: an interprocess event
// on the GPU). The consumer (this program again, started with posix_spawn) imports the
// buffer once, maps each new tail at the same offsets (its address never changes), waits
// for the producer's writes (handoff_consumer::acquire), checksums everything it sees and
// tells the producer, which compares with its own checksum.
// Runs on GPU 0 when there is one, otherwise on the OS host-memory provider.

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/ipc/exporter.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/handoff.hpp"
#include "vmm/ipc/importer.hpp"

extern char** environ;

namespace {

constexpr int consumer_socket_fd = 3;
constexpr int rounds = 6;

struct consumer_report {
  std::uint64_t checksum;
  std::uint64_t size;
  std::uint64_t capacity;
  std::uint64_t address;
};

std::uint64_t checksum(vmm::memory_provider& provider, const void* data, std::size_t n) {
  std::vector<std::uint8_t> bytes(n);
  provider.executor().copy(bytes.data(), data, n, {});
  provider.executor().synchronize({});
  std::uint64_t hash = 14695981039346656037ull;
  for (std::uint8_t byte : bytes) hash = (hash ^ byte) * 1099511628211ull;
  return hash;
}

std::string mib(std::size_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

// The consumer: import once, then per round map the new tail, wait for the producer's
// writes, checksum, release, report. The producer closing the socket ends it.
int run_consumer() {
  const int socket = consumer_socket_fd;
  vmm::ipc::imported_buffer shared = vmm::ipc::imported_buffer::receive(socket);
  vmm::ipc::handoff_consumer handoff(socket, shared.provider());
  for (int round = 0;; ++round) {
    if (round > 0) {
      try {
        shared.receive_growth(socket);
      } catch (const vmm::ipc::peer_closed&) {
        return 0;  // the producer is done
      }
    }
    handoff.acquire(nullptr);  // the default stream waits for the producer's writes
    const consumer_report report{checksum(*shared.provider(), shared.data(), shared.size()), shared.size(),
                                 shared.capacity(), reinterpret_cast<std::uintptr_t>(shared.data())};
    handoff.finish(nullptr);
    vmm::ipc::send_message(socket, std::as_bytes(std::span(&report, 1)));
  }
}

int run_producer() {
  std::string why;
  const bool gpu = vmm::gpu_available(&why);
  const vmm::location where = gpu ? vmm::location::device(0) : vmm::location::os_host();
  if (!gpu) fmt::print("no GPU ({}): using the OS host-memory provider\n", why);
  const auto provider = vmm::provider_for(where);
  const std::size_t g = provider->capabilities().granularity;
  vmm::growable_buffer buffer(where, {.max_size = 256 * g});
  fmt::print("producer {}: {} memory, a buffer of up to {} at {}\n", ::getpid(), vmm::to_string(where),
             mib(buffer.max_size()), buffer.data());

  // The consumer: this program again, with one end of a socket pair as its descriptor 3.
  auto [socket, theirs] = vmm::ipc::make_socket_pair();
  const vmm::unique_fd child_end(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, 10));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_end.get(), consumer_socket_fd);
  char self[] = "/proc/self/exe";
  char flag[] = "--consumer";
  char* argv[] = {self, flag, nullptr};
  pid_t consumer = -1;
  std::fflush(stdout);
  const int spawned = ::posix_spawn(&consumer, self, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) throw vmm::os_error(spawned, "posix_spawn of the consumer");

  vmm::ipc::exporter exporter;
  bool all_match = true;
  {
    std::optional<vmm::ipc::manifest> consumer_has;  // the last manifest it received
    std::optional<vmm::ipc::handoff_producer> handoff;
    for (int round = 0; round < rounds; ++round) {
      // Grow by one and a half granules: sizes off chunk boundaries, chunks mapped ahead.
      const std::size_t old_size = buffer.size();
      buffer.resize(old_size + g + g / 2);
      provider->executor().fill(static_cast<char*>(buffer.data()) + old_size,
                                static_cast<std::uint8_t>(0x11 * (round + 1)), buffer.size() - old_size, {});
      const vmm::ipc::exported_manifest manifest =
          consumer_has ? exporter.export_growth(buffer, *consumer_has) : exporter.export_buffer(buffer);
      consumer_has = manifest.description;
      vmm::ipc::send_manifest(socket.get(), manifest);
      if (!handoff) handoff.emplace(socket.get(), provider);
      handoff->publish(nullptr);  // after the fill, in stream order
      handoff->wait_consumed(nullptr);
      consumer_report report{};
      const vmm::ipc::message reply = vmm::ipc::receive_message(socket.get(), 0);
      if (reply.payload.size() != sizeof report) throw vmm::invalid_argument("a malformed report");
      std::memcpy(&report, reply.payload.data(), sizeof report);
      const bool match = report.checksum == checksum(*provider, buffer.data(), buffer.size());
      all_match = all_match && match && report.size == buffer.size();
      fmt::print(
          "round {}: grew to {} in {} chunks; sent {} new chunk(s); the consumer maps {} at {:#x}, "
          "checksum {:016x} {}\n",
          round, mib(buffer.size()), buffer.chunk_count(), manifest.description.chunks.size(),
          mib(report.capacity), report.address, report.checksum, match ? "matches" : "DIFFERS");
    }
    // End of stream for the consumer; it exits, and only then do the events go.
    ::shutdown(socket.get(), SHUT_WR);
    int status = 0;
    ::waitpid(consumer, &status, 0);
    all_match = all_match && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  const vmm::ipc::export_statistics statistics = exporter.statistics();
  fmt::print("exported {} handles, each once: a growth manifest carries only the new chunks\n",
             statistics.handles_exported);
  fmt::print("{}\n", all_match ? "the consumer saw every byte the producer wrote" : "MISMATCH");
  return all_match ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc == 2 && std::strcmp(argv[1], "--consumer") == 0) return run_consumer();
  return run_producer();
} catch (const std::exception& error) {
  fmt::print(stderr, "ipc_grow_share: {}\n", error.what());
  return 1;
}
