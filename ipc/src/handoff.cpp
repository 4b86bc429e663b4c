#include <vmm/ipc/handoff.hpp>

#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/protocol_error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <span>
#include <vector>

#include "vmm/detail/enum_names.hpp"
#include "vmm/ipc/detail/little_endian.hpp"

namespace vmm::ipc {
namespace {

using detail::load;
using detail::store;

constexpr std::uint32_t handoff_magic = 0x484d4d56;  // "VMMH"
constexpr std::size_t header_bytes = 16;
constexpr std::size_t handle_bytes = sizeof(interprocess_event_handle::bytes);

enum class message_type : std::uint32_t { events = 1, ready = 2, done = 3 };

const char* name(message_type type) {
  static constexpr vmm::detail::enum_name<message_type> names[] = {
      {message_type::events, "events"}, {message_type::ready, "ready"}, {message_type::done, "done"}};
  return vmm::detail::name_of(type, names, "?");
}

std::vector<std::byte> header(message_type type, std::uint64_t sequence, std::size_t extra = 0) {
  std::vector<std::byte> bytes(header_bytes + extra);
  store<std::uint32_t>(bytes, 0, handoff_magic);
  store<std::uint32_t>(bytes, 4, static_cast<std::uint32_t>(type));
  store<std::uint64_t>(bytes, 8, sequence);
  return bytes;
}

// Receives one hand-off message of `type` and round `sequence`, waiting at most `timeout`;
// returns what follows the header (exactly `extra` bytes).
std::vector<std::byte> receive(int socket_fd, std::chrono::milliseconds timeout, message_type type,
                               std::uint64_t sequence, std::size_t extra = 0) {
  message received = receive_message(socket_fd, 0, timeout);
  const std::span<const std::byte> bytes(received.payload);
  if (bytes.size() < header_bytes)
    throw protocol_error(
        fmt::format("handoff on socket {}: a message of {} bytes where \"{}\" was due; "
                    "the header alone is {}",
                    socket_fd, bytes.size(), name(type), header_bytes));
  if (const auto magic = load<std::uint32_t>(bytes, 0); magic != handoff_magic)
    throw protocol_error(
        fmt::format("handoff on socket {}: bad magic {:#010x} (expected {:#010x}): not a "
                    "hand-off message",
                    socket_fd, magic, handoff_magic));
  if (const auto got = load<std::uint32_t>(bytes, 4); got != static_cast<std::uint32_t>(type))
    throw protocol_error(fmt::format("handoff on socket {}: message type {} where \"{}\" ({}) was due",
                                     socket_fd, got, name(type), static_cast<std::uint32_t>(type)));
  if (bytes.size() != header_bytes + extra)
    throw protocol_error(fmt::format("handoff on socket {}: a \"{}\" message of {} bytes, expected {}",
                                     socket_fd, name(type), bytes.size(), header_bytes + extra));
  if (const auto got = load<std::uint64_t>(bytes, 8); got != sequence)
    throw protocol_error(fmt::format("handoff on socket {}: \"{}\" of round {} where round {} was due",
                                     socket_fd, name(type), got, sequence));
  return {bytes.begin() + header_bytes, bytes.end()};
}

std::shared_ptr<memory_provider> require(std::shared_ptr<memory_provider> provider) {
  if (provider == nullptr) throw invalid_argument("handoff: the provider is null");
  return provider;
}

interprocess_event_handle handle_at(std::span<const std::byte> bytes, std::size_t at) {
  interprocess_event_handle handle;
  std::copy_n(bytes.begin() + static_cast<std::ptrdiff_t>(at), handle_bytes, handle.bytes.begin());
  return handle;
}

}  // namespace

handoff_producer::handoff_producer(int socket_fd, std::shared_ptr<memory_provider> provider,
                                   std::chrono::milliseconds timeout)
    : handoff_end(socket_fd, timeout) {
  ready_ = interprocess_event(require(provider));
  done_ = interprocess_event(provider);
  std::vector<std::byte> message = header(message_type::events, 0, 2 * handle_bytes);
  std::copy(ready_.handle().bytes.begin(), ready_.handle().bytes.end(), message.begin() + header_bytes);
  std::copy(done_.handle().bytes.begin(), done_.handle().bytes.end(),
            message.begin() + header_bytes + handle_bytes);
  send_message(socket_, message, {}, timeout_);
}

void handoff_producer::publish(stream_ref stream) {
  if (in_round_)
    throw invalid_argument(fmt::format("handoff: round {} is published and not consumed yet", sequence_));
  ready_.record(stream);
  send_message(socket_, header(message_type::ready, sequence_ + 1), {}, timeout_);
  ++sequence_;
  in_round_ = true;
}

void handoff_producer::wait_consumed(stream_ref stream) {
  if (!in_round_) throw invalid_argument("handoff: wait_consumed with no round published");
  (void)receive(socket_, timeout_, message_type::done, sequence_);
  in_round_ = false;
  done_.enqueue_wait(stream);
}

handoff_consumer::handoff_consumer(int socket_fd, std::shared_ptr<memory_provider> provider,
                                   std::chrono::milliseconds timeout)
    : handoff_end(socket_fd, timeout) {
  provider = require(std::move(provider));
  const std::vector<std::byte> handles =
      receive(socket_, timeout_, message_type::events, 0, 2 * handle_bytes);
  // The handles are the peer's bytes: one this memory cannot open is the peer's fault.
  const auto open = [&](std::size_t at, const char* which) {
    try {
      return interprocess_event::open(provider, handle_at(handles, at));
    } catch (const invalid_argument& error) {
      throw protocol_error(
          fmt::format("handoff on socket {}: the producer's \"{}\" event handle cannot be "
                      "opened: {}",
                      socket_, which, error.what()));
    }
  };
  ready_ = open(0, "ready");
  done_ = open(handle_bytes, "done");
}

void handoff_consumer::acquire(stream_ref stream) {
  if (in_round_)
    throw invalid_argument(fmt::format("handoff: round {} is acquired and not finished yet", sequence_));
  (void)receive(socket_, timeout_, message_type::ready, sequence_ + 1);
  ++sequence_;
  in_round_ = true;
  ready_.enqueue_wait(stream);
}

void handoff_consumer::finish(stream_ref stream) {
  if (!in_round_) throw invalid_argument("handoff: finish with no round acquired");
  done_.record(stream);
  send_message(socket_, header(message_type::done, sequence_), {}, timeout_);
  in_round_ = false;
}

}  // namespace vmm::ipc
