/// @file
/// Fuzz target: vmm::ipc::imported_buffer::receive and receive_growth fed by a hostile
/// exporter, on an OS host provider of 4 KiB granularity.
///
/// Input: one byte of options, then up to 16 messages, each a segment (fuzz_support.hpp)
/// whose bytes are sent as one well-formed vmm::ipc frame with the segment's descriptors:
/// memfds of sizes chosen by the input, sealed as vmm seals them or not, shrunk by the peer
/// after sending, of a size no granularity divides, sealed against writes, /dev/null, a
/// pipe, a read-only regular file. The first message is the manifest (or garbage); later
/// ones are its continuations and growth manifests. Options:
///   bit 0     import read-only (else read-write)
///   bit 1     once imported, the peer tries to truncate one of its memfds to 0 bytes (bits
///             2-6 pick which); the importer then reads its memory again
///   bit 7     no provider in import_options (each location's process-wide provider)
///
/// The importer calls receive(), then receive_growth() until something throws. Checked:
///  - only the documented exceptions: invalid_argument (bad_manifest included),
///    protocol_error, os_error (peer_closed included), out_of_memory, driver_error (a GPU
///    location, and no driver here);
///  - a successful import keeps its promises: size <= capacity <= max size <= the default
///    max_size_limit (the location's physical memory), the access asked, every mapped page
///    readable, and writable when read-write, even after the peer's truncation;
///  - nothing leaks: once the import is destroyed and the sockets and descriptors closed,
///    /proc/self/fd and the census of /proc/self/maps are as they were.

#include <vmm/error.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/importer.hpp>
#include <vmm/ipc/protocol_error.hpp>
#include <vmm/provider.hpp>

#include <fmt/format.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using vmm::fuzz::finding;
using vmm::fuzz::page;
namespace ipc = vmm::ipc;

constexpr std::size_t max_messages = 16;

std::shared_ptr<vmm::memory_provider> import_provider;  // made once, in LLVMFuzzerInitialize

// Touches one byte of every page: a page that is not mapped as promised faults here.
void touch(const ipc::imported_buffer& imported) {
  auto* bytes = static_cast<volatile std::uint8_t*>(imported.data());
  for (std::size_t at = 0; at < imported.capacity(); at += page) {
    const std::uint8_t value = bytes[at];
    if (imported.access() == vmm::access_mode::read_write) bytes[at] = value;
  }
}

void check(const ipc::imported_buffer& imported, vmm::access_mode asked) {
  if (imported.data() == nullptr || imported.max_size() == 0)
    finding("an import succeeded with no address range");
  if (const std::size_t limit = import_provider->capabilities().physical_memory_size;
      imported.max_size() > limit)
    finding(fmt::format("import: a max size of {} bytes reserved, past the default max_size_limit {}",
                        imported.max_size(), limit));
  if (imported.size() > imported.capacity() || imported.capacity() > imported.max_size())
    finding(fmt::format("import: size {}, capacity {}, max size {} out of order", imported.size(),
                        imported.capacity(), imported.max_size()));
  if ((imported.capacity() == 0) != (imported.chunk_count() == 0))
    finding(fmt::format("import: capacity {} with {} chunks", imported.capacity(), imported.chunk_count()));
  if (imported.access() != asked)
    finding(fmt::format("import: access {} where {} was asked", vmm::to_string(imported.access()),
                        vmm::to_string(asked)));
  touch(imported);
}

void run(vmm::fuzz::byte_reader input) {
  const std::uint8_t options = input.u8();
  const vmm::access_mode access =
      (options & 1) != 0 ? vmm::access_mode::read_only : vmm::access_mode::read_write;
  const bool truncate = (options & 2) != 0;
  const std::size_t truncated = (options >> 2) & 31;

  vmm::fuzz::fd_stock stock;
  vmm::fuzz::peer_channel channel;
  for (std::size_t i = 0; i < max_messages && !input.empty() && channel.open(); ++i) {
    const vmm::fuzz::segment part = vmm::fuzz::read_segment(input);
    const std::vector<int> fds = stock.make_all(part.fd_specs);
    (void)channel.send_frame(part.bytes, fds);
  }
  stock.after_send();
  channel.finish();

  ipc::import_options import_options{.access = access};
  if ((options & 0x80) == 0) import_options.provider = import_provider;
  try {
    ipc::imported_buffer imported = ipc::imported_buffer::receive(channel.reader(), import_options);
    check(imported, access);
    if (truncate && !stock.memfds().empty()) {
      // A peer may shrink its memfd at any time, unless it is sealed against shrinking.
      (void)::ftruncate(stock.memfds()[truncated % stock.memfds().size()], 0);
      touch(imported);
    }
    for (;;) {
      imported.receive_growth(channel.reader());
      check(imported, access);
    }
  } catch (const vmm::invalid_argument&) {
    // refused: a forged or broken manifest, wrong fds
  } catch (const ipc::protocol_error&) {
    // refused: a broken continuation message
  } catch (const vmm::os_error&) {
    // the end of the stream, or a broken frame
  } catch (const vmm::out_of_memory&) {
    // no address range of the manifest's max size
  } catch (const vmm::driver_error&) {
    // a GPU or pinned location named, and no driver here (driver_unavailable)
  } catch (const std::exception& error) {
    finding(fmt::format("import threw an undocumented exception: {}", error.what()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  import_provider = vmm::make_os_host_provider({.granularity = page});
  (void)vmm::provider_for(vmm::location::os_host());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const vmm::fuzz::leak_check leaks(true);
  run(vmm::fuzz::byte_reader(data, size));
  leaks.check("import");
  return 0;
}
