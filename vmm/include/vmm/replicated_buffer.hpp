#pragma once
/// @file
/// Read-mostly bytes with one replica on every GPU: each GPU's kernels read their own copy.
///
///     vmm::replicated_buffer table({vmm::location::device(0), vmm::location::device(1)});
///     table.append(vmm::update_source::host(bytes), stream0);   // H2D once, then a peer copy
///     auto view = table.view<float>();
///     for (int d : {0, 1}) lookup<<<grid, block, 0, streams[d]>>>(view.on(d), ...);
///
/// Rule: one replica per location (a GPU; on the OS provider, a provider per location id),
/// all of one size and contents, each mapped read-only for its GPU (the hardware refuses
/// writes) and written only by the buffer's calls, through writable chunk_view aliases of the
/// same chunks. Why: a table every GPU reads runs at local bandwidth only from every GPU's
/// own memory, and N copies stay equal only if nobody writes one behind the buffer's back.
///
/// Updates are checked whole first, then copied once into the root replica (the one on the
/// source's GPU; the first for host memory) and spread along a broadcast tree over the peer
/// matrix: each round, every replica that has the bytes pushes them to one that has not, on
/// its own stream (N - 1 copies, ceil(log2 N) rounds when all pairs connect; no link carries
/// the bytes twice). Growth maps memory on every replica (growable_buffer: addresses stay);
/// a failed growth leaves every replica as it was.
///
/// Visibility: work queued on the update's stream after the call sees the bytes everywhere;
/// a reader on another stream calls enqueue_wait(stream), or enqueue_wait(where, stream) for
/// the copy into one replica; readers still running when an update is queued must be ordered
/// before its stream by the caller. Updates are ordered among themselves by the buffer.
///
/// Device code cannot ask which GPU it runs on (device-side cudaGetDevice needs relocatable
/// device code), so replica_view is a table of replica addresses by location id and the host
/// names the GPU: view.on(d). An optional owner replica is read-write for its GPU; publish()
/// spreads its changes. Destruction never blocks. docs/replicated.md has the details.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "vmm/chunk_pool.hpp"
#include "vmm/chunk_view.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/host_device.hpp"
#include "vmm/location.hpp"
#include "vmm/stream_executor.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm {

/// Where the bytes of an update come from: host memory, or GPU memory of one device.
struct update_source {
  const void* data = nullptr;            ///< the first byte
  std::size_t size = 0;                  ///< bytes readable at data
  location where = location::os_host();  ///< os_host: host memory; device(d): GPU d's memory

  /// `bytes` in host memory (pageable or page-locked).
  static update_source host(std::span<const std::byte> bytes) noexcept {
    return {bytes.data(), bytes.size(), location::os_host()};
  }
  /// `size` bytes at `data` in the memory of GPU `ordinal` (one that holds a replica).
  static update_source device(int ordinal, const void* data, std::size_t size) noexcept {
    return {data, size, location::device(ordinal)};
  }
};

/// Settings of a replicated_buffer.
struct replicated_buffer_options {
  /// The most each replica may hold. 0: the smallest physical memory size of the locations.
  std::size_t max_size = 0;
  /// How each replica's chunks grow (the same for every replica).
  chunk_policy policy = chunk_policy::geometric();
  /// The replica whose GPU (or, on the OS provider, the host) may write it through data():
  /// publish() broadcasts its changes. None: every replica is read-only.
  std::optional<location> owner;
};

/// The locations of a view's table: location ids 0 to this - 1.
inline constexpr int replica_table_size = 32;

/// A trivially copyable view for kernels: every replica's address by location id, and the
/// one to read. Pass it by value, made for the GPU of the launch (on()).
template <class T = std::byte>
class replica_view {
 public:
  /// The replica of location id `id` (the GPU ordinal), for a kernel launched there.
  [[nodiscard]] constexpr replica_view on(int id) const noexcept {
    replica_view result = *this;
    result.current_ = id;
    return result;
  }
  /// The replica chosen with on() (nullptr when that id holds none).
  VMM_HOST_DEVICE const T* data() const noexcept { return data(current_); }
  /// The replica of location id `id` (nullptr when it holds none, or id is out of the table).
  VMM_HOST_DEVICE const T* data(int id) const noexcept {
    return id >= 0 && id < replica_table_size ? reinterpret_cast<const T*>(table_[id]) : nullptr;
  }
  /// Elements when the view was made (later growth is not seen; addresses stay).
  VMM_HOST_DEVICE std::size_t size() const noexcept { return size_; }
  /// Element i of the chosen replica.
  VMM_HOST_DEVICE const T& operator[](std::size_t i) const noexcept { return data()[i]; }
  /// The location id chosen with on() (-1: none yet).
  VMM_HOST_DEVICE int current() const noexcept { return current_; }

 private:
  friend class replicated_buffer;
  std::uintptr_t table_[replica_table_size] = {};
  std::size_t size_ = 0;
  int current_ = -1;
};

/// One copy of the broadcast: replica `from` pushes to replica `to` (indices into
/// replicated_buffer::locations()).
struct replica_copy {
  std::size_t from = 0;
  std::size_t to = 0;
};

/// See the file comment. Move-only; not thread-safe.
class replicated_buffer {
 public:
  /// An empty buffer with one replica per location, on each location's default pool.
  /// Checks come first, before any driver call: then the pools, the peer matrix.
  /// @throws vmm::invalid_argument the list is empty, names a location twice, mixes kinds of
  ///         memory or names pinned host memory, a location id is negative or past the view
  ///         table (replica_table_size), the owner is not in the list, the policy is bad, a
  ///         location does not exist, or a replica's GPU cannot be reached from another by
  ///         peer copies (the message names both).
  /// @throws vmm::driver_unavailable GPU locations and no usable driver or GPU.
  /// @throws vmm::out_of_memory no address range of max_size is left.
  /// @throws vmm::driver_error, vmm::os_error reserving addresses or making a stream or an
  ///         event failed; nothing is left behind.
  explicit replicated_buffer(std::vector<location> locations, replicated_buffer_options options = {});
  /// As above, on the pools given (one per replica; their locations must differ). On the
  /// OS provider: pools of providers made with distinct os_host_options::id.
  /// @throws vmm::invalid_argument as above, or a pool is null.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error as above.
  explicit replicated_buffer(std::vector<std::shared_ptr<chunk_pool>> pools,
                             replicated_buffer_options options = {});
  replicated_buffer(replicated_buffer&&) noexcept;
  replicated_buffer& operator=(replicated_buffer&&) noexcept;
  replicated_buffer(const replicated_buffer&) = delete;
  replicated_buffer& operator=(const replicated_buffer&) = delete;
  /// Retires every replica after its GPU's legacy default stream and the copy streams;
  /// never blocks.
  ~replicated_buffer();

  /// The replicas' locations, in the order given.
  [[nodiscard]] const std::vector<location>& locations() const noexcept { return locations_; }
  /// The replica at `where`: read-only, or read-write for the owner (the address never
  /// changes).
  /// @throws vmm::invalid_argument no replica lives at `where`.
  [[nodiscard]] const void* data(location where) const;
  /// The owner's replica, writable by its GPU (or the host on the OS provider).
  /// @throws vmm::invalid_argument the buffer has no owner.
  [[nodiscard]] void* owner_data() const;
  /// The owner's location (none without one).
  [[nodiscard]] std::optional<location> owner() const noexcept;
  /// Bytes in every replica.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Bytes every replica has mapped (>= size()).
  [[nodiscard]] std::size_t capacity() const noexcept;
  /// The most any replica can hold.
  [[nodiscard]] std::size_t max_size() const noexcept;
  /// A view of every replica for kernels (choose the GPU with on()).
  /// @tparam T the element type; size() of the view is size() / sizeof(T).
  template <class T = std::byte>
  [[nodiscard]] replica_view<T> view() const noexcept {
    replica_view<T> result;
    fill_table(result.table_);
    result.size_ = size_ / sizeof(T);
    return result;
  }
  /// The broadcast from the replica at `root`: rounds of copies; the copies of one round run
  /// at the same time on the senders' streams.
  /// @throws vmm::invalid_argument no replica lives at `root`.
  [[nodiscard]] std::vector<std::vector<replica_copy>> broadcast_plan(location root) const;

  /// Writes `bytes` of `source` at `offset` into every replica, in stream order on `stream`
  /// (a stream of the source's GPU; for a host source, of the first replica's GPU): once
  /// into the root replica, then along broadcast_plan(root). See the visibility rule.
  /// @throws vmm::invalid_argument [offset, offset + bytes) passes size(), the source holds
  ///         fewer than `bytes` or is null, or it lives where no replica can take it (GPU
  ///         memory of a GPU without a replica, GPU memory for host replicas), or the buffer
  ///         was moved from; nothing is written.
  /// @throws vmm::driver_error a copy or an event could not be queued.
  void update(std::size_t offset, std::size_t bytes, const update_source& source, stream_ref stream = {});
  /// Broadcasts [offset, offset + bytes) of the owner's replica to the others, on `stream` (a
  /// stream of the owner's GPU).
  /// @throws vmm::invalid_argument no owner, or the range passes size().
  /// @throws vmm::driver_error a copy or an event could not be queued.
  void publish(std::size_t offset, std::size_t bytes, stream_ref stream = {});
  /// Sets the size of every replica to `bytes`, mapping memory on each where needed (new
  /// bytes are uninitialized and may differ between replicas); getting smaller keeps the
  /// memory. Each replica maps in order on its own copy stream (no caller's stream: growth
  /// writes nothing).
  /// @throws vmm::out_of_memory past max_size(), a pool's cap or a location's memory; every
  ///         replica is then as it was (size, contents, capacity, address).
  /// @throws vmm::driver_error, vmm::os_error mapping failed; every replica is as it was.
  /// @throws vmm::invalid_argument the buffer was moved from.
  void resize(std::size_t bytes);
  /// Maps at least `bytes` on every replica without changing size(). Errors and guarantee
  /// as resize().
  void reserve(std::size_t bytes);
  /// Grows by source.size bytes and writes the source there (update() at the old size).
  /// @throws vmm::invalid_argument the source is bad (as in update()); nothing changed.
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error as resize(), or the copies
  ///         could not be queued; every replica is as it was.
  void append(const update_source& source, stream_ref stream = {});

  /// Makes work queued on `stream` from now on wait for the last update's (or publish's)
  /// copies into every replica. The legacy default stream ({}) is the first replica's GPU's.
  /// @throws vmm::driver_error the wait could not be queued.
  void enqueue_wait(stream_ref stream) const;
  /// Makes work queued on `stream` wait for the last copy into the replica at `where` only.
  /// The legacy default stream ({}) is that of `where`'s GPU.
  /// @throws vmm::invalid_argument no replica lives at `where`.
  /// @throws vmm::driver_error the wait could not be queued.
  void enqueue_wait(location where, stream_ref stream) const;

 private:
  struct replica;
  [[nodiscard]] std::size_t index_of(location where) const;
  void fill_table(std::uintptr_t (&table)[replica_table_size]) const noexcept;
  // Checks an update of [offset, offset + bytes) against `size` and the source; returns the
  // index of the replica the copies start from.
  [[nodiscard]] std::size_t root_for(std::size_t offset, std::size_t bytes, const update_source& source,
                                     std::size_t size) const;
  // Maps `bytes` on every replica, then runs `write`; if either throws, every replica is as
  // it was.
  template <class Write>
  void grow_to(std::size_t bytes, Write&& write);
  // Copies [offset, offset + bytes) from `from` (readable by the executor's device) into
  // replica `root`, then broadcasts from there.
  void broadcast(std::size_t root, const void* from, std::size_t offset, std::size_t bytes,
                 stream_ref stream);

  std::vector<location> locations_;
  std::vector<std::vector<bool>> can_push_;  // can_push_[a][b]: replica a writes into b's memory
  std::vector<std::unique_ptr<replica>> replicas_;
  std::optional<std::size_t> owner_;
  std::size_t size_ = 0;
};

/// A replicated_buffer of trivially copyable `T`: sizes and offsets in elements.
template <class T>
class replicated_vector {
  static_assert(std::is_trivially_copyable_v<T>, "vmm::replicated_vector<T> copies its elements as bytes");

 public:
  /// See replicated_buffer's constructor (max_size in bytes).
  /// @throws as replicated_buffer's constructor.
  explicit replicated_vector(std::vector<location> locations, replicated_buffer_options options = {})
      : buffer_(std::move(locations), std::move(options)) {}
  /// See replicated_buffer's constructor over pools.
  /// @throws as replicated_buffer's constructor.
  explicit replicated_vector(std::vector<std::shared_ptr<chunk_pool>> pools,
                             replicated_buffer_options options = {})
      : buffer_(std::move(pools), std::move(options)) {}

  /// Elements in every replica.
  [[nodiscard]] std::size_t size() const noexcept { return buffer_.size() / sizeof(T); }
  /// The replica at `where`. @throws vmm::invalid_argument no replica lives there.
  [[nodiscard]] const T* data(location where) const { return static_cast<const T*>(buffer_.data(where)); }
  /// A view for kernels. See replicated_buffer::view().
  [[nodiscard]] replica_view<T> view() const noexcept { return buffer_.view<T>(); }
  /// The bytes underneath.
  [[nodiscard]] replicated_buffer& bytes() noexcept { return buffer_; }
  /// The bytes underneath.
  [[nodiscard]] const replicated_buffer& bytes() const noexcept { return buffer_; }

  /// Appends host elements to every replica. @throws as replicated_buffer::append().
  void append(std::span<const T> values, stream_ref stream = {}) {
    buffer_.append(update_source::host(std::as_bytes(values)), stream);
  }
  /// Overwrites elements [first, first + values.size()) with host elements.
  /// @throws as replicated_buffer::update().
  void update(std::size_t first, std::span<const T> values, stream_ref stream = {}) {
    if (first > max_elements())
      throw invalid_argument("replicated_vector::update: first element past max_size");
    buffer_.update(first * sizeof(T), values.size_bytes(), update_source::host(std::as_bytes(values)),
                   stream);
  }
  /// Sets the size to `count` elements (new ones uninitialized).
  /// @throws vmm::out_of_memory count passes max_size, or as replicated_buffer::resize().
  void resize(std::size_t count) {
    if (count > max_elements())
      throw out_of_memory("replicated_vector::resize: " + std::to_string(count) + " elements pass max_size");
    buffer_.resize(count * sizeof(T));
  }

 private:
  [[nodiscard]] std::size_t max_elements() const noexcept { return buffer_.max_size() / sizeof(T); }
  replicated_buffer buffer_;
};

}  // namespace vmm
