#pragma once
/// @file
/// Tensor sets: a model's weights kept once by a vmm-store daemon, mapped read-only by every
/// process that gets them.
///
///     vmm::store::client store;
///     std::vector<vmm::store::tensor_source> weights = {
///         {.name = "embed.weight", .type = vmm::store::dtype::bf16, .shape = {32000, 4096},
///          .data = embed_on_gpu}};                           // host or device memory
///     vmm::store::tensor_set::put(store, "llama-7b", weights, vmm::location::device(0));
///     // in another process:
///     vmm::store::tensor_set set = vmm::store::tensor_set::get(store, "llama-7b");
///     vmm::store::tensor_view embed = set.at("embed.weight");  // const data, dtype, shape
///
/// A set is one store buffer (client.hpp) and a table of its tensors (tensors.hpp). The
/// buffer holds the tensors, in the table's order, then the encoded table; seal_set hands
/// the daemon the table's place, and the daemon checks and keeps a copy before sealing.
/// Every byte that no tensor and no table covers is zero.
///
/// Layouts (tensor_set_options::layout). one_chunk, the default: each tensor at the next
/// multiple of tensor_alignment, the whole set one physical chunk, so that a first get
/// imports one handle. per_tensor: chunks that end where tensors end (lay_out_per_tensor):
/// a tensor of a granule or more has physical memory of its own, which is what sharing a
/// tensor's memory with another set, or replacing it in one process, needs (a mapping
/// starts at a chunk's first byte: the driver maps a handle only from offset 0). The
/// buffer is created with one chunk and grown by one chunk per boundary (create_options::
/// one_chunk: every create and grow maps exactly its growth as one chunk).
///
/// A get is a read-only get of the buffer (so a repeated get is local, as for every
/// buffer) and one request for the table of the entry it holds, so the table always
/// describes the memory mapped.
///
/// Writing. tensor_set_builder creates the buffer and lays the tensors out; the caller fills
/// each tensor's range, and commit() writes the table and seals. A builder not committed
/// (an exception, a refusal of the table) removes the name again: a failed put leaves
/// nothing in the store. put() is a builder filled from pointers.
///
/// De-duplication (tensor_set_options::deduplicate). commit() drops the builder's writable
/// mapping before it gets the set read-only, so the set this process holds maps the chunks
/// the daemon kept: a put that shares memory leaves no second copy here either.

#include <vmm/location.hpp>
#include <vmm/store/client.hpp>
#include <vmm/store/tensors.hpp>
#include <vmm/stream_ref.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace vmm::store {

/// One tensor to put: its description and where its bytes are now.
struct tensor_source {
  std::string name;
  dtype type = dtype::u8;
  std::vector<std::uint64_t> shape;
  /// element_bytes(type) x product(shape) bytes in host memory or in memory of the set's
  /// location (any pointer the location's copy engine reads).
  const void* data = nullptr;
};

/// How a set's tensors lie in its memory: see the file comment.
enum class set_layout : std::uint8_t {
  one_chunk,   ///< packed, one physical chunk: the fastest first get
  per_tensor,  ///< a chunk per tensor of a granule or more, small ones packed by the granule
};

/// How to put a set.
struct tensor_set_options {
  set_layout layout = set_layout::one_chunk;
  /// Seal with de-duplication (seal_options::deduplicate; docs/store.md, "De-duplication"):
  /// each chunk whose bytes equal a chunk of another de-duplicated set is stored once. The
  /// unit is a chunk, so per_tensor is the layout that lets single tensors be shared. It costs
  /// the daemon a read of every byte at the seal.
  bool deduplicate = false;
};

/// A tensor of a set as this process maps it: read-only.
struct tensor_view {
  const void* data = nullptr;
  const tensor_info* info = nullptr;  ///< name, dtype, shape, offset, bytes
};

/// What tensor_set::make_private made private.
struct private_tensors {
  /// Every tensor private now that was not before, in the set's order: those asked for and
  /// those that share a replaced chunk with them (the same bytes, now writable too).
  std::vector<std::string> names;
  /// Bytes of fresh memory mapped (whole chunks).
  std::size_t bytes = 0;
};

/// A read-only tensor set held by this process. Move-only (the buffer handle is); holding
/// it keeps the set alive in the daemon.
class tensor_set {
 public:
  tensor_set() = default;

  /// Puts a set: creates `name` at `where`, copies every source's bytes in on `stream` (and
  /// waits), seals; returns the set read-only.
  /// @throws vmm::invalid_argument a source has no data, a bad dtype or name, or two
  ///         sources share a name; nothing was created.
  /// @throws store_error, vmm::ipc::protocol_error, vmm::out_of_memory, vmm::driver_error
  ///         as client::create and client::seal_set; the name is removed again.
  static tensor_set put(client& store, std::string_view name, std::span<const tensor_source> tensors,
                        location where, stream_ref stream = {});
  /// put() laid out as `options` say.
  /// @throws as put() above.
  static tensor_set put(client& store, std::string_view name, std::span<const tensor_source> tensors,
                        location where, tensor_set_options options, stream_ref stream = {});
  /// Gets `name` read-only with its table.
  /// @throws store_error not_found, invalid (a plain buffer); daemon_gone.
  /// @throws vmm::ipc::protocol_error, vmm::out_of_memory, vmm::invalid_argument,
  ///         vmm::driver_error as client::get.
  static tensor_set get(client& store, std::string_view name);
  /// Gets `name` at addresses of this set's own (get_options::own_mapping) and makes the
  /// tensors named private (make_private); a set that cannot be made so is released again.
  /// @throws as get() and make_private().
  static tensor_set get(client& store, std::string_view name, std::span<const std::string> private_names,
                        stream_ref stream = {});

  /// Private overlays (docs/store.md): maps fresh memory holding a copy of the named
  /// tensors' bytes under their addresses, in this process only and writable; every other
  /// tensor stays shared and read-only, and no address changes. The unit replaced is a
  /// chunk of the set's buffer: the tensors sharing one with a named tensor become private
  /// too (the result names them). All or nothing; the rules of buffer::make_private (no
  /// work in flight on those tensors, this set the only handle here that maps them) hold.
  /// The private memory lives as long as this set; a later get() maps the shared bytes.
  /// @throws vmm::invalid_argument a name is not in the set or named twice, or as
  ///         buffer::make_private; nothing changed.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error as
  ///         buffer::make_private; nothing changed.
  private_tensors make_private(std::span<const std::string> names, stream_ref stream = {});
  /// Whether the tensor of that name is private here (writable).
  /// @throws vmm::invalid_argument no tensor has that name.
  [[nodiscard]] bool is_private(std::string_view name) const;
  /// The writable bytes of a private tensor.
  /// @throws vmm::invalid_argument no tensor has that name, or it is not private.
  [[nodiscard]] void* data_writable(std::string_view name) const;

  /// The buffer handle (its name, location, size, entry).
  [[nodiscard]] const buffer& memory() const noexcept { return memory_; }
  /// The tensors, in the set's order.
  [[nodiscard]] std::span<const tensor_info> tensors() const noexcept { return table_; }
  [[nodiscard]] std::size_t size() const noexcept { return table_.size(); }
  /// Whether a tensor of that name is in the set.
  [[nodiscard]] bool contains(std::string_view name) const { return index_.contains(name); }
  /// The i-th tensor. @throws vmm::invalid_argument i is past size().
  [[nodiscard]] tensor_view operator[](std::size_t i) const;
  /// The tensor of that name. @throws vmm::invalid_argument no tensor has it.
  [[nodiscard]] tensor_view at(std::string_view name) const;

 private:
  friend class tensor_set_builder;
  tensor_set(buffer memory, std::vector<tensor_info> table);
  [[nodiscard]] std::size_t index_of(std::string_view name) const;
  buffer memory_;
  std::vector<tensor_info> table_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

/// A tensor set being written: see the file comment. Move-only.
class tensor_set_builder {
 public:
  /// Lays `tensors` out as options.layout says (their offsets and bytes are set here) and
  /// creates `name` at `where`, large enough for them and their table, its padding zeroed.
  /// @throws vmm::invalid_argument the table breaks a rule (tensors.hpp); nothing was sent.
  /// @throws vmm::driver_unavailable `where` is a GPU and there is no usable driver here.
  /// @throws store_error, vmm::ipc::protocol_error, vmm::out_of_memory, vmm::driver_error
  ///         as client::create, client::grow and buffer::refresh; a per_tensor set whose
  ///         chunks the daemon did not make end at the layout's boundaries is
  ///         vmm::ipc::protocol_error. The name is removed again after any of these.
  tensor_set_builder(client& store, std::string_view name, std::vector<tensor_info> tensors, location where,
                     tensor_set_options options = {});
  tensor_set_builder(tensor_set_builder&&) noexcept = default;
  tensor_set_builder& operator=(tensor_set_builder&&) = delete;
  /// Removes the name when not committed. Never throws.
  ~tensor_set_builder();

  [[nodiscard]] std::span<const tensor_info> tensors() const noexcept { return table_; }
  /// The writable buffer (its provider copies into it).
  [[nodiscard]] const buffer& memory() const noexcept { return memory_; }
  /// Where tensor i's bytes go in this process (writable memory of the set's location).
  /// @throws vmm::invalid_argument i is past tensors().size(), or the builder is committed.
  [[nodiscard]] void* data(std::size_t i) const;
  /// Writes the table, seals the set and gets it read-only; the builder is empty after.
  /// @throws store_error, vmm::ipc::protocol_error, vmm::driver_error as client::seal_set
  ///         and client::get; the name is removed again.
  /// @throws vmm::invalid_argument the builder is committed already.
  tensor_set commit();

 private:
  client* store_;
  std::string name_;
  std::vector<tensor_info> table_;
  std::uint64_t table_offset_ = 0;
  bool deduplicate_ = false;
  buffer memory_;
  bool committed_ = false;
};

}  // namespace vmm::store
