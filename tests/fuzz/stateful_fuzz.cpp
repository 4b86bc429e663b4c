/// @file
/// Fuzz target: a random life of one shared buffer, exporter and importer in one process,
/// on OS host providers of 4 KiB granularity (the importer has its own provider, as another
/// process would).
///
/// Input: one byte of configuration, then operations, one byte each plus its arguments:
///   config   bit 0: fixed chunks of (bits 1-3) + 1 pages, else the geometric policy;
///            bit 4: export read-only (and import read-only)
///   0 u16    resize(n * 5)             (the buffer's max size is 64 pages; more is refused)
///   1 u16 u16 u8  write a pattern at an offset and length within size()
///   2        export_buffer -> send_manifest -> imported_buffer::receive (replaces the import)
///   3        export_growth(buffer, the last manifest the import got) -> send_manifest ->
///            receive_growth (without an import: the manifest is dropped)
///   4        resize(0)
///   5 u8     collect_retired(wait = bit 0)
///   6        shrink_to_fit()
///   7 u16    reserve(n * 5)
///   8        exporter purge()
///   9        drop the import
///   10 u8 u8 export_range over whole chunks -> a second, temporary import
///   11       a new exporter (the old one's cache and layouts go)
///
/// The oracle: after every import, the imported bytes equal the buffer's over the bytes both
/// hold (host memory, so memcmp), and the import's capacity and size are the buffer's. The
/// only refusals allowed are the documented ones a user must expect: out_of_memory for a
/// size past the max size (the buffer then exactly as it was), and export_growth's
/// invalid_argument once the buffer may have dropped a chunk its export generation exported
/// (its capacity went below the generation's end since export_buffer: the importer "must
/// import it again"), or the generation is not this exporter's. Anything else thrown, a
/// mismatch, a leaked descriptor or mapping is a finding.

#include <vmm/chunk_pool.hpp>
#include <vmm/error.hpp>
#include <vmm/growable_buffer.hpp>
#include <vmm/ipc/exporter.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/importer.hpp>
#include <vmm/provider.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using vmm::fuzz::finding;
using vmm::fuzz::page;
namespace ipc = vmm::ipc;

constexpr std::size_t max_size = 64 * page;
constexpr std::size_t max_operations = 64;

enum class operation : std::uint8_t {
  resize,
  write,
  export_whole,
  export_growth,
  resize_to_zero,
  collect_retired,
  shrink_to_fit,
  reserve,
  purge,
  drop_import,
  export_range,
  new_exporter,
  count
};

class session {
 public:
  explicit session(std::uint8_t config)
      : buffer_provider_(vmm::make_os_host_provider({.granularity = page})),
        import_provider_(vmm::make_os_host_provider({.granularity = page})),
        buffer_(vmm::chunk_pool::create(buffer_provider_), options(config)),
        grant_((config & 0x10) != 0 ? vmm::access_mode::read_only : vmm::access_mode::read_write) {
    exporter_.emplace();
    auto [writer, reader] = ipc::make_socket_pair();
    writer_ = std::move(writer);
    reader_ = std::move(reader);
  }

  void step(vmm::fuzz::byte_reader& input) {
    const auto op = static_cast<operation>(input.u8() % static_cast<std::uint8_t>(operation::count));
    switch (op) {
      case operation::resize:
        change_size(std::size_t{input.u16()} * 5, false);
        break;
      case operation::write: {
        const std::size_t offset = input.u16();
        const std::size_t length = input.u16();
        write(offset, length, input.u8());
        break;
      }
      case operation::export_whole:
        export_whole();
        break;
      case operation::export_growth:
        export_growth();
        break;
      case operation::resize_to_zero:
        change_size(0, false);
        break;
      case operation::collect_retired:
        buffer_.collect_retired((input.u8() & 1) != 0);
        note_capacity();
        break;
      case operation::shrink_to_fit:
        buffer_.shrink_to_fit();
        note_capacity();
        break;
      case operation::reserve:
        change_size(std::size_t{input.u16()} * 5, true);
        break;
      case operation::purge:
        exporter_->purge();
        break;
      case operation::drop_import:
        import_.reset();
        break;
      case operation::export_range: {
        const std::uint8_t first = input.u8();
        export_range(first, input.u8());
        break;
      }
      case operation::new_exporter:
        exporter_.reset();
        exporter_.emplace();
        generation_current_ = false;
        break;
      case operation::count:
        break;
    }
  }

 private:
  static vmm::growable_buffer_options options(std::uint8_t config) {
    vmm::growable_buffer_options result{.max_size = max_size};
    if ((config & 1) != 0) result.policy = vmm::chunk_policy::fixed((((config >> 1) & 7) + 1) * page);
    return result;
  }

  void note_capacity() { generation_min_capacity_ = std::min(generation_min_capacity_, buffer_.capacity()); }

  void change_size(std::size_t bytes, bool reserve_only) {
    const std::size_t size = buffer_.size();
    const std::size_t capacity = buffer_.capacity();
    try {
      if (reserve_only)
        buffer_.reserve(bytes);
      else
        buffer_.resize(bytes);
    } catch (const vmm::out_of_memory& error) {
      if (bytes <= max_size)
        finding(fmt::format("{}({}) within the max size {} ran out of memory: {}",
                            reserve_only ? "reserve" : "resize", bytes, max_size, error.what()));
      if (buffer_.size() != size || buffer_.capacity() != capacity)
        finding(fmt::format("a refused {}({}) changed the buffer: size {} -> {}, capacity {} -> {}",
                            reserve_only ? "reserve" : "resize", bytes, size, buffer_.size(), capacity,
                            buffer_.capacity()));
      return;
    }
    if (buffer_.size() != (reserve_only ? size : bytes) ||
        buffer_.capacity() < std::max(bytes, buffer_.size()))
      finding(fmt::format("{}({}): size {}, capacity {}", reserve_only ? "reserve" : "resize", bytes,
                          buffer_.size(), buffer_.capacity()));
    note_capacity();
  }

  void write(std::size_t offset, std::size_t length, std::uint8_t seed) {
    if (buffer_.size() == 0) return;
    offset %= buffer_.size();
    length = std::min(length, buffer_.size() - offset);
    auto* bytes = static_cast<std::uint8_t*>(buffer_.data()) + offset;
    for (std::size_t i = 0; i < length; ++i) bytes[i] = static_cast<std::uint8_t>(seed + 31 * i);
  }

  // Sends `exported` to the importer's socket; what arrives must import.
  void send(const ipc::exported_manifest& exported) { ipc::send_manifest(writer_.get(), exported); }

  void compare(const ipc::imported_buffer& imported, std::size_t buffer_offset, const char* what) const {
    const std::size_t held = buffer_.size() > buffer_offset ? buffer_.size() - buffer_offset : 0;
    const std::size_t n = std::min(imported.size(), held);
    const auto* mine = static_cast<const std::uint8_t*>(buffer_.data()) + buffer_offset;
    const auto* theirs = static_cast<const std::uint8_t*>(imported.data());
    if (n != 0 && std::memcmp(mine, theirs, n) != 0) {
      std::size_t first = 0;
      while (mine[first] == theirs[first]) ++first;
      finding(fmt::format(
          "{}: the imported bytes differ from the buffer's at {} of {} (buffer offset {}: {:#04x}, "
          "import: {:#04x})",
          what, first, n, buffer_offset, mine[first], theirs[first]));
    }
  }

  void check_whole(const ipc::imported_buffer& imported, const char* what) const {
    if (imported.capacity() != buffer_.capacity() || imported.size() != buffer_.size() ||
        imported.max_size() != buffer_.max_size())
      finding(fmt::format("{}: the import has capacity {}, size {}, max size {}; the buffer {}, {}, {}", what,
                          imported.capacity(), imported.size(), imported.max_size(), buffer_.capacity(),
                          buffer_.size(), buffer_.max_size()));
    compare(imported, 0, what);
  }

  ipc::import_options import_options() const { return {.access = grant_, .provider = import_provider_}; }

  void export_whole() {
    const ipc::exported_manifest exported = exporter_->export_buffer(buffer_, {.grant = grant_});
    last_ = exported.description;
    generation_current_ = true;
    generation_end_ = exported.description.end;
    generation_min_capacity_ = buffer_.capacity();
    send(exported);
    import_.reset();
    try {
      import_.emplace(ipc::imported_buffer::receive(reader_.get(), import_options()));
    } catch (const std::exception& error) {
      finding(fmt::format("the import of a whole export failed: {}", error.what()));
    }
    check_whole(*import_, "import after export_buffer");
  }

  void export_growth() {
    if (!last_) return;  // nothing exported whole yet: nothing to follow
    std::optional<ipc::exported_manifest> exported;
    try {
      exported.emplace(exporter_->export_growth(buffer_, *last_, {.grant = grant_}));
    } catch (const vmm::invalid_argument& error) {
      if (generation_current_ && generation_min_capacity_ >= generation_end_)
        finding(fmt::format(
            "export_growth after {} bytes refused though the buffer kept every chunk its generation "
            "exported (capacity never below {} since export_buffer): {}",
            last_->end, generation_end_, error.what()));
      return;
    }
    last_ = exported->description;
    generation_end_ = std::max<std::size_t>(generation_end_, exported->description.end);
    if (!import_) return;  // the importer went away: the manifest is dropped
    send(*exported);
    try {
      import_->receive_growth(reader_.get());
    } catch (const std::exception& error) {
      finding(fmt::format("receive_growth of an export_growth after {} bytes failed: {}",
                          exported->description.start, error.what()));
    }
    check_whole(*import_, "import after export_growth");
  }

  void export_range(std::uint8_t first, std::uint8_t count) {
    if (buffer_.capacity() == 0) return;
    std::vector<std::size_t> sizes;
    for (const vmm::shared_chunk& chunk : buffer_.chunks(0, buffer_.capacity()))
      sizes.push_back(chunk->size());
    const std::size_t begin = first % sizes.size();
    const std::size_t end = begin + count % (sizes.size() - begin) + 1;
    std::size_t offset = 0;
    for (std::size_t i = 0; i < begin; ++i) offset += sizes[i];
    std::size_t length = 0;
    for (std::size_t i = begin; i < end; ++i) length += sizes[i];

    const ipc::exported_manifest exported =
        exporter_->export_range(buffer_, offset, length, {.grant = grant_});
    send(exported);
    std::optional<ipc::imported_buffer> imported;
    try {
      imported.emplace(ipc::imported_buffer::receive(reader_.get(), import_options()));
    } catch (const std::exception& error) {
      finding(fmt::format("the import of export_range({}, {}) failed: {}", offset, length, error.what()));
    }
    const std::size_t size = buffer_.size() > offset ? std::min(length, buffer_.size() - offset) : 0;
    if (imported->capacity() != length || imported->size() != size || imported->base_offset() != offset)
      finding(fmt::format(
          "import of export_range({}, {}): capacity {}, size {}, base offset {}; expected {}, {}, {}", offset,
          length, imported->capacity(), imported->size(), imported->base_offset(), length, size, offset));
    compare(*imported, offset, "import after export_range");
  }

  std::shared_ptr<vmm::memory_provider> buffer_provider_;
  std::shared_ptr<vmm::memory_provider> import_provider_;
  vmm::growable_buffer buffer_;
  vmm::access_mode grant_;
  // Declared after the buffer, so destroyed before it: the exporter's cache first.
  std::optional<ipc::exporter> exporter_;
  vmm::unique_fd writer_;
  vmm::unique_fd reader_;
  std::optional<ipc::imported_buffer> import_;
  // The export generation the import follows (vmm/ipc/exporter.hpp): the last manifest it
  // got, whether this exporter started the generation, the end of every chunk exported in
  // it, and the least capacity the buffer had since (below that end, a chunk may be gone).
  std::optional<ipc::manifest> last_;
  bool generation_current_ = false;
  std::size_t generation_end_ = 0;
  std::size_t generation_min_capacity_ = 0;
};

void run(vmm::fuzz::byte_reader input) {
  session life(input.u8());
  for (std::size_t i = 0; i < max_operations && !input.empty(); ++i) {
    try {
      life.step(input);
    } catch (const std::exception& error) {
      finding(fmt::format("operation {} threw: {}", i, error.what()));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmm::fuzz::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const vmm::fuzz::leak_check leaks(true);
  run(vmm::fuzz::byte_reader(data, size));
  leaks.check("stateful");
  return 0;
}
