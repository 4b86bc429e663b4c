#pragma once
// The memory behind one entry of the vmm-store daemon: either a growable buffer the daemon
// made (create), or chunks a client offered back to a restarted daemon (offer), imported
// read-only. Both are reference-counted physical chunks (vmm::shared_chunk): a chunk goes
// back to its pool, or its import is released, when the last holder lets go; the daemon's
// entry, its cached export manifests and the exporter's cache are holders.
//
// An offered entry is sealed and never grows: export_growth() refuses it, so its holders
// import it whole (or are current).

#include <vmm/growable_buffer.hpp>
#include <vmm/ipc/exporter.hpp>
#include <vmm/ipc/importer.hpp>
#include <vmm/location.hpp>
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

  // Imports offered chunks (one descriptor each, in order) as a read-only whole manifest of
  // `size` bytes in use at `where`, with every check of vmm::ipc's importer (the manifest's
  // rules, the granularity, each descriptor's size).
  // Throws vmm::ipc::bad_manifest (the sizes break a rule), vmm::invalid_argument (a
  // descriptor is not memory of its chunk's size, no provider for `where`), and what
  // importing throws (vmm::out_of_memory, vmm::driver_error, vmm::os_error).
  static entry_memory adopt(location where, std::uint64_t size, std::span<const std::uint64_t> chunk_sizes,
                            std::vector<unique_fd> fds);

  [[nodiscard]] bool adopted() const noexcept { return adopted_.has_value(); }
  // The daemon-made buffer. Throws vmm::invalid_argument for adopted memory.
  [[nodiscard]] growable_buffer& buffer();
  [[nodiscard]] std::size_t size() const noexcept { return made_ ? made_->size() : adopted_size_; }
  [[nodiscard]] std::size_t capacity() const noexcept {
    return made_ ? made_->capacity() : adopted_->capacity();
  }
  [[nodiscard]] std::size_t max_size() const noexcept {
    return made_ ? made_->max_size() : adopted_->max_size();
  }
  [[nodiscard]] location where() const;
  // Copies [offset, offset + bytes) out (the caller checked the range).
  [[nodiscard]] std::vector<std::byte> read(std::uint64_t offset, std::uint64_t bytes) const;
  // Whether `sent`, a whole manifest made by export_whole(), still describes the memory.
  [[nodiscard]] bool describes(const ipc::manifest& sent) const noexcept;
  [[nodiscard]] ipc::exported_manifest export_whole(ipc::exporter& out, access_mode grant) const;
  // Throws vmm::invalid_argument where no growth can be described (adopted memory).
  [[nodiscard]] ipc::exported_manifest export_growth(ipc::exporter& out, const ipc::manifest& last,
                                                     access_mode grant) const;

 private:
  entry_memory(ipc::imported_buffer adopted, std::size_t size)
      : adopted_(std::move(adopted)), adopted_size_(size) {}
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept {
    return made_ ? made_->provider() : adopted_->provider();
  }
  [[nodiscard]] const void* data() const noexcept { return made_ ? made_->data() : adopted_->data(); }

  std::optional<growable_buffer> made_;
  std::optional<ipc::imported_buffer> adopted_;
  std::size_t adopted_size_ = 0;
};

}  // namespace vmm::store::detail
