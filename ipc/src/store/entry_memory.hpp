#pragma once
// The memory behind one entry of the vmm-store daemon: either a growable buffer the daemon
// made (create), or a fixed list of chunks mapped here read-only: the chunks a client offered
// back to a restarted daemon (offer), or the chunks of a de-duplicated entry, some of them
// another entry's too (content_index.hpp). Both are reference-counted physical chunks
// (vmm::shared_chunk): a chunk goes back to its pool, or its import is released, when the last
// holder lets go; the daemon's entries, their cached export manifests and the exporter's cache
// are holders.
//
// Fixed memory is sealed and never grows: export_growth() refuses it, so its holders import it
// whole (or are current).

#include <vmm/growable_buffer.hpp>
#include <vmm/ipc/exporter.hpp>
#include <vmm/location.hpp>
#include <vmm/mapped_range.hpp>
#include <vmm/unique_fd.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace vmm::store::detail {

class entry_memory {
 public:
  explicit entry_memory(growable_buffer made) : made_(std::move(made)) {}
  // `chunks` (of one provider, back to back) mapped here read-only, `size` bytes of them in use.
  // Throws vmm::invalid_argument (no chunk, a size past them), and what mapping throws
  // (vmm::out_of_memory, vmm::driver_error, vmm::os_error).
  entry_memory(const std::shared_ptr<memory_provider>& provider, std::span<const shared_chunk> chunks,
               std::size_t size);

  // Imports offered chunks (one descriptor each, in order) as a read-only whole manifest of
  // `size` bytes in use at `where`, with every check of vmm::ipc's importer (the manifest's
  // rules, the granularity, each descriptor's size), and keeps their chunks as fixed memory.
  // Throws vmm::ipc::bad_manifest (the sizes break a rule), vmm::invalid_argument (a
  // descriptor is not memory of its chunk's size, no provider for `where`), and what
  // importing throws (vmm::out_of_memory, vmm::driver_error, vmm::os_error).
  static entry_memory adopt(location where, std::uint64_t size, std::span<const std::uint64_t> chunk_sizes,
                            std::vector<unique_fd> fds);

  // Whether it is a fixed list of chunks (offered, or de-duplicated): it never grows.
  [[nodiscard]] bool fixed() const noexcept { return !made_.has_value(); }
  // The daemon-made buffer. Throws vmm::invalid_argument for fixed memory.
  [[nodiscard]] growable_buffer& buffer();
  [[nodiscard]] std::size_t size() const noexcept { return made_ ? made_->size() : fixed_size_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return made_ ? made_->capacity() : fixed_.mapped(); }
  [[nodiscard]] std::size_t max_size() const noexcept { return made_ ? made_->max_size() : fixed_.mapped(); }
  [[nodiscard]] location where() const;
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept {
    return made_ ? made_->provider() : fixed_.provider();
  }
  // The first byte, mapped readable here.
  [[nodiscard]] const std::byte* data() const noexcept {
    return static_cast<const std::byte*>(made_ ? made_->data() : fixed_.data());
  }
  // The chunks behind [0, capacity()), in address order. Throws std::bad_alloc.
  [[nodiscard]] std::vector<shared_chunk> chunks() const;
  // Copies [offset, offset + bytes) out (the caller checked the range).
  [[nodiscard]] std::vector<std::byte> read(std::uint64_t offset, std::uint64_t bytes) const;
  // Whether `sent`, a whole manifest made by export_whole(), still describes the memory.
  [[nodiscard]] bool describes(const ipc::manifest& sent) const noexcept;
  [[nodiscard]] ipc::exported_manifest export_whole(ipc::exporter& out, access_mode grant) const;
  // Throws vmm::invalid_argument where no growth can be described (fixed memory).
  [[nodiscard]] ipc::exported_manifest export_growth(ipc::exporter& out, const ipc::manifest& last,
                                                     access_mode grant) const;

 private:
  std::optional<growable_buffer> made_;
  mapped_range fixed_;  // fixed memory: its chunks, mapped read-only
  std::size_t fixed_size_ = 0;
};

}  // namespace vmm::store::detail
