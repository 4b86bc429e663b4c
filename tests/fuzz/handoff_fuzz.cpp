/// @file
/// Fuzz target: the hand-off protocol (vmm/ipc/handoff.hpp) fed by a hostile peer, on the
/// OS provider.
///
/// Input: one byte of options, then a script of segments (fuzz_support.hpp) written raw to
/// the socket, descriptors included (hand-off messages carry none). Options bit 0 picks the
/// side under test:
///  - 0: a handoff_consumer reads the script: its constructor (the "events" message), then
///    acquire/finish rounds until something throws;
///  - 1: a handoff_producer (its "events" message goes to the peer, unread) runs
///    publish/wait_consumed rounds, wait_consumed reading the script, until something throws.
/// Checked: only the documented exceptions for what a peer sends (protocol_error, and
/// os_error: peer_closed, a broken frame; invalid_argument is for a caller's misuse, which
/// this target never commits), rounds() counts the completed rounds, and every descriptor
/// received is closed again.

#include <vmm/error.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/handoff.hpp>
#include <vmm/ipc/protocol_error.hpp>
#include <vmm/location.hpp>
#include <vmm/provider.hpp>
#include <vmm/stream_ref.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using vmm::fuzz::finding;
namespace ipc = vmm::ipc;

constexpr std::size_t max_segments = 32;
// The side under test writes one message a round to the peer, who never reads: a bound on
// the rounds keeps that under any socket's send buffer, so a write never blocks.
constexpr std::uint64_t max_rounds = 64;

void consume(int socket, const std::shared_ptr<vmm::memory_provider>& provider) {
  ipc::handoff_consumer consumer(socket, provider);
  for (std::uint64_t round = 1; round <= max_rounds; ++round) {
    consumer.acquire(vmm::stream_ref{});
    if (consumer.rounds() != round)
      finding(fmt::format("consumer: rounds() is {} after acquiring round {}", consumer.rounds(), round));
    consumer.finish(vmm::stream_ref{});
  }
}

void produce(int socket, const std::shared_ptr<vmm::memory_provider>& provider) {
  ipc::handoff_producer producer(socket, provider);
  for (std::uint64_t round = 1; round <= max_rounds; ++round) {
    producer.publish(vmm::stream_ref{});
    if (producer.rounds() != round)
      finding(fmt::format("producer: rounds() is {} after publishing round {}", producer.rounds(), round));
    producer.wait_consumed(vmm::stream_ref{});
  }
}

void run(vmm::fuzz::byte_reader input) {
  const bool producer_side = (input.u8() & 1) != 0;
  vmm::fuzz::fd_stock stock;
  vmm::fuzz::peer_channel channel;
  for (std::size_t i = 0; i < max_segments && !input.empty() && channel.open(); ++i) {
    const vmm::fuzz::segment part = vmm::fuzz::read_segment(input);
    const std::vector<int> fds = stock.make_all(part.fd_specs);
    (void)channel.send(part.bytes, fds);
  }
  stock.after_send();
  channel.finish();

  const std::shared_ptr<vmm::memory_provider> provider = vmm::provider_for(vmm::location::os_host());
  try {
    if (producer_side)
      produce(channel.reader(), provider);
    else
      consume(channel.reader(), provider);
  } catch (const vmm::os_error&) {
    // peer_closed, or a broken stream: the end of the conversation
  } catch (const ipc::protocol_error&) {
    // a malformed or out-of-order message: refused
  } catch (const std::exception& error) {
    finding(fmt::format("hand-off {} threw an undocumented exception: {}",
                        producer_side ? "producer" : "consumer", error.what()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  (void)vmm::provider_for(vmm::location::os_host());  // made once, before any input is counted
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const vmm::fuzz::leak_check leaks(false);
  run(vmm::fuzz::byte_reader(data, size));
  leaks.check("handoff");
  return 0;
}
