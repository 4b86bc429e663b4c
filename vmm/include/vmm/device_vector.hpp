#pragma once
/// @file
/// device_vector<T>: a vector of trivially copyable elements that grows in place.
///
///     vmm::device_vector<float> v(vmm::location::device(0));
///     v.append(host_batch);                          // on the vector's default stream
///     v.resize(1 << 30, vmm::element_init::zeroed, stream);   // on `stream`
///     kernel<<<grid, block, 0, stream.get()>>>(v.data(), v.size());
///     std::vector<float> back = v.to_host(stream);   // waits for `stream`
///
/// The elements live in one growable_buffer: an address range reserved once for the
/// vector's max_size(), with physical chunks mapped at its end as the vector grows. So
/// data() never changes (pointers held by kernels and captured CUDA graphs stay valid across
/// any growth), growing never copies an element, and begin()/end() are plain T* that thrust
/// and kernels take as they are.
///
/// Growth. push_back() and append() map memory only when the vector is full, and then ask
/// the buffer for room for the new size; the buffer's chunk policy picks the chunk. With the
/// default chunk_policy::geometric() a chunk is at least 1/8 of the new size, so n
/// push_backs map O(log n) chunks: amortized O(1) driver calls each, and no element is
/// ever moved.
///
/// Why the vector counts its elements itself: growable_buffer::resize() gives back the
/// chunks past the new size, but a vector keeps its capacity when it gets smaller (as
/// std::vector does) until shrink_to_fit() or destruction. So the vector maps memory with
/// growable_buffer::reserve() only, and its size is its own count, never the buffer's.
///
/// Stream order. Every function that queues work takes a stream_ref; without one it uses
/// the vector's default stream (stream(), set_stream()). Copies and fills are queued through
/// the provider's executor on that stream, so they are ordered with the kernels the caller
/// queues there; nothing waits for the GPU except the reads into host memory
/// (copy_to_host(), to_host()), which synchronize their stream. On the OS host provider
/// every call completes before it returns. Host sources follow cuMemcpyAsync: pageable host
/// memory may be reused as soon as the call returns; page-locked host memory must stay
/// unchanged until the stream has passed the copy. Shrinking is stream-ordered too (see
/// growable_buffer): memory past the size is unmapped only once the stream has passed the
/// shrink; destruction retires the memory after the default stream and never blocks.
///
/// Guarantees. push_back, append, resize and reserve either complete or leave the vector
/// exactly as it was: size, capacity, data() and contents (the buffer's strong guarantee,
/// and a failed copy or fill retires again the capacity mapped for it).
///
/// Thread safety: none. One vector is used by one thread at a time; different vectors may
/// be used from different threads, also over one pool (chunk_pool is thread-safe).

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/location.hpp"
#include "vmm/provider.hpp"
#include "vmm/stream_ref.hpp"

namespace vmm {

/// What device_vector::resize() writes into the elements it adds.
enum class element_init : std::uint8_t {
  zeroed,         ///< every new byte is 0: a fill queued on the vector's stream
  uninitialized,  ///< nothing is written: the new elements hold what the memory held
};

namespace detail {

// Retires the capacity mapped for an operation that then failed, unless dismissed: what
// makes a failed copy or fill after a successful grow leave the vector exactly as it was.
class capacity_rollback {
 public:
  capacity_rollback(growable_buffer& buffer, stream_ref stream) noexcept
      : buffer_(&buffer), capacity_(buffer.capacity()), stream_(stream) {}
  capacity_rollback(const capacity_rollback&) = delete;
  capacity_rollback& operator=(const capacity_rollback&) = delete;
  ~capacity_rollback() {
    if (buffer_ == nullptr || buffer_->capacity() == capacity_) return;
    try {
      buffer_->resize(capacity_, stream_);  // retires exactly the chunks mapped past capacity_
    } catch (...) {
      report_cleanup_failure("device_vector: retiring the capacity of a failed operation failed");
    }
  }
  void dismiss() noexcept { buffer_ = nullptr; }

 private:
  growable_buffer* buffer_;
  std::size_t capacity_;
  stream_ref stream_;
};

}  // namespace detail

/// A vector of `T` in memory that grows in place; see the file comment. Move-only.
/// @tparam T a trivially copyable type: elements are moved as bytes and never constructed
///         or destroyed.
template <class T>
class device_vector {
  static_assert(std::is_trivially_copyable_v<T>,
                "vmm::device_vector<T> needs a trivially copyable T: its elements are copied "
                "and filled as bytes by the memory provider, and no constructor or destructor "
                "of T ever runs");
  static_assert(!std::is_const_v<T> && !std::is_volatile_v<T>,
                "vmm::device_vector<T> needs T without const or volatile");

 public:
  using value_type = T;                    ///< The element type.
  using size_type = std::size_t;           ///< Counts of elements.
  using difference_type = std::ptrdiff_t;  ///< Distances between iterators.
  using pointer = T*;                      ///< A pointer to an element (device memory).
  using const_pointer = const T*;          ///< A pointer to a const element.
  using iterator = T*;                     ///< A raw pointer: thrust and kernels take it as is.
  using const_iterator = const T*;         ///< A raw pointer to const.

  /// An empty vector drawing chunks from `pool`, with an address range of
  /// options.max_size bytes (0: the location's memory size) reserved now. Nothing is mapped
  /// yet.
  /// @throws vmm::invalid_argument the pool is null or an option is bad.
  /// @throws vmm::out_of_memory no address range of that size is left.
  explicit device_vector(std::shared_ptr<chunk_pool> pool, growable_buffer_options options = {})
      : buffer_(std::move(pool), std::move(options)) {}
  /// An empty vector on the default pool of `where` (vmm::default_pool).
  /// @throws vmm::invalid_argument the location does not exist or an option is bad.
  /// @throws vmm::driver_unavailable a GPU or pinned location, and no usable driver or GPU.
  /// @throws vmm::out_of_memory no address range of that size is left.
  explicit device_vector(location where, growable_buffer_options options = {})
      : buffer_(where, std::move(options)) {}
  /// Takes `other`'s memory; data() keeps its value. `other` may then only be destroyed or
  /// assigned to.
  device_vector(device_vector&& other) noexcept
      : buffer_(std::move(other.buffer_)), size_(std::exchange(other.size_, 0)) {}
  /// Gives this vector's memory back (after its stream) and takes `other`'s.
  device_vector& operator=(device_vector&& other) noexcept {
    if (this != &other) {
      buffer_ = std::move(other.buffer_);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  /// Retires the memory after the default stream (never blocks): it is unmapped and goes
  /// back to the pool once the stream has passed this point.
  ~device_vector() = default;

  /// The first element; never changes for the vector's life (nullptr once moved from).
  [[nodiscard]] T* data() noexcept { return static_cast<T*>(buffer_.data()); }
  /// The first element; never changes for the vector's life (nullptr once moved from).
  [[nodiscard]] const T* data() const noexcept { return static_cast<const T*>(buffer_.data()); }
  /// data(): a device pointer for thrust (thrust::cuda::par.on(stream())) and kernels.
  [[nodiscard]] iterator begin() noexcept { return data(); }
  /// data() + size().
  [[nodiscard]] iterator end() noexcept { return data() + size_; }
  /// data().
  [[nodiscard]] const_iterator begin() const noexcept { return data(); }
  /// data() + size().
  [[nodiscard]] const_iterator end() const noexcept { return data() + size_; }

  /// The number of elements.
  [[nodiscard]] size_type size() const noexcept { return size_; }
  /// Whether size() is 0.
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  /// Elements that fit in the memory mapped now (>= size()).
  [[nodiscard]] size_type capacity() const noexcept { return buffer_.capacity() / sizeof(T); }
  /// The most elements the vector can ever hold: its address range.
  [[nodiscard]] size_type max_size() const noexcept { return buffer_.max_size() / sizeof(T); }
  /// Physical chunks mapped, including those retired by a shrink that stream() has not
  /// passed yet: what the driver's per-handle costs scale with.
  [[nodiscard]] std::size_t chunk_count() const noexcept { return buffer_.chunk_count(); }
  /// The pool the chunks come from first (its statistics count this vector's memory there;
  /// growable_buffer_options::spill_to names any others).
  [[nodiscard]] const std::shared_ptr<chunk_pool>& pool() const noexcept { return buffer_.pool(); }
  /// The provider that copies and fills the elements.
  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept {
    return buffer_.provider();
  }

  /// The default stream: for calls given none, and what destruction is ordered after.
  [[nodiscard]] stream_ref stream() const noexcept { return buffer_.stream(); }
  /// Sets the default stream. Work already queued on the old one is not ordered before
  /// later work: synchronize the old stream (or make the new one wait for it) first.
  void set_stream(stream_ref stream) noexcept { buffer_.set_stream(stream); }

  /// Appends a copy of `value`, a host object, queued on `stream`. Maps a chunk only when
  /// the vector is full.
  /// @throws vmm::out_of_memory past max_size(), the pool's cap, or the memory; the vector
  ///         is then exactly as it was.
  /// @throws vmm::driver_error, vmm::os_error mapping memory failed (as in
  ///         growable_buffer::reserve), or the copy could not be queued; the vector is as it
  ///         was.
  void push_back(const T& value, stream_ref stream) {
    if (size_ == max_size()) throw_past_max_size(1);
    const size_type first = size_;
    grow_to(first + 1, stream, [&] { copy_in(data() + first, &value, sizeof(T), stream); });
  }
  /// push_back(value, stream()). @throws as push_back() on a stream.
  void push_back(const T& value) { push_back(value, stream()); }

  /// Appends the elements of a host range with one copy queued on `stream`.
  /// @throws vmm::out_of_memory past max_size(), the pool's cap, or the memory; the vector
  ///         is then exactly as it was.
  /// @throws vmm::driver_error, vmm::os_error mapping memory failed (as in
  ///         growable_buffer::reserve), or the copy could not be queued; the vector is as it
  ///         was.
  void append(std::span<const T> values, stream_ref stream) {
    if (values.empty()) return;
    if (values.size() > max_size() - size_) throw_past_max_size(values.size());
    const size_type first = size_;
    grow_to(first + values.size(), stream,
            [&] { copy_in(data() + first, values.data(), values.size_bytes(), stream); });
  }
  /// append(values, stream()). @throws as append() on a stream.
  void append(std::span<const T> values) { append(values, stream()); }

  /// Appends [first, last), a host range. A contiguous range of T is copied as it is; any
  /// other is first gathered into host memory. One copy queued on stream() either way.
  /// @throws vmm::out_of_memory past max_size(), the pool's cap, or the memory; the vector
  ///         is then exactly as it was.
  /// @throws vmm::driver_error, vmm::os_error mapping memory failed (as in
  ///         growable_buffer::reserve), or the copy could not be queued; the vector is as it
  ///         was.
  template <std::input_iterator Iterator, std::sentinel_for<Iterator> Sentinel>
  requires std::convertible_to<std::iter_reference_t<Iterator>, T>
  void append(Iterator first, Sentinel last) {
    if constexpr (std::contiguous_iterator<Iterator> && std::sized_sentinel_for<Sentinel, Iterator> &&
                  std::is_same_v<std::iter_value_t<Iterator>, T>) {
      append(std::span<const T>(std::to_address(first), static_cast<size_type>(last - first)), stream());
    } else {
      std::vector<T> gathered;
      for (; first != last; ++first) gathered.push_back(static_cast<T>(*first));
      append(std::span<const T>(gathered), stream());
    }
  }

  /// Sets the size to `count`. Growing maps memory when needed and then, with
  /// element_init::zeroed, queues a fill of the new elements with 0 on `stream`; with
  /// element_init::uninitialized it writes nothing. Getting smaller keeps the capacity.
  /// @throws vmm::out_of_memory past max_size(), the pool's cap, or the memory; the vector
  ///         is then exactly as it was.
  /// @throws vmm::driver_error, vmm::os_error mapping memory failed (as in
  ///         growable_buffer::reserve), or the fill could not be queued; the vector is as it
  ///         was.
  void resize(size_type count, element_init init, stream_ref stream) {
    if (count <= size_) {
      size_ = count;
      return;
    }
    if (count > max_size()) throw_past_max_size(count - size_);
    const size_type first = size_;
    grow_to(count, stream, [&] {
      if (init == element_init::zeroed) fill_zero(data() + first, (count - first) * sizeof(T), stream);
    });
  }
  /// resize(count, init, stream()). @throws as resize() on a stream.
  void resize(size_type count, element_init init) { resize(count, init, stream()); }

  /// Maps memory for at least `count` elements without changing size(): later growth up to
  /// capacity() makes no driver call.
  /// @throws vmm::out_of_memory past max_size(), the pool's cap, or the memory; the vector
  ///         is then exactly as it was.
  /// @throws vmm::driver_error, vmm::os_error mapping memory failed; the vector is as it was.
  void reserve(size_type count, stream_ref stream) {
    if (count <= capacity()) return;
    if (count > max_size()) throw_past_max_size(count - size_);
    buffer_.reserve(count * sizeof(T), stream);
  }
  /// reserve(count, stream()). @throws as reserve() on a stream.
  void reserve(size_type count) { reserve(count, stream()); }
  /// As reserve, without the chunk policy's amortizing slack: maps what `count` elements
  /// need, rounded up to the granularity (growable_buffer::reserve_exact).
  /// @throws vmm::out_of_memory, vmm::driver_error, vmm::os_error as reserve().
  void reserve_exact(size_type count, stream_ref stream) {
    if (count <= capacity()) return;
    if (count > max_size()) throw_past_max_size(count - size_);
    buffer_.reserve_exact(count * sizeof(T), stream);
  }
  /// reserve_exact(count, stream()). @throws as reserve_exact() on a stream.
  void reserve_exact(size_type count) { reserve_exact(count, stream()); }

  /// Retires the chunks wholly past size(): capacity() drops now. They are unmapped and go
  /// back to the pool once `stream` has passed this point (at once on host providers); a
  /// grow before then takes them back with no driver call.
  /// @throws vmm::driver_error recording the point on the stream failed; nothing changed.
  void shrink_to_fit(stream_ref stream) { buffer_.resize(size_ * sizeof(T), stream); }
  /// shrink_to_fit(stream()). @throws as shrink_to_fit() on a stream.
  void shrink_to_fit() { shrink_to_fit(stream()); }

  /// Sets the size to 0; keeps the capacity and data().
  void clear() noexcept { size_ = 0; }

  /// Overwrites elements [first, first + values.size()) with a host range, queued on
  /// `stream`.
  /// @throws vmm::invalid_argument the range passes size().
  /// @throws vmm::driver_error the copy could not be queued.
  void copy_from_host(size_type first, std::span<const T> values, stream_ref stream) {
    check_range(first, values.size(), "copy_from_host");
    if (!values.empty()) copy_in(data() + first, values.data(), values.size_bytes(), stream);
  }
  /// copy_from_host(first, values, stream()). @throws as copy_from_host() on a stream.
  void copy_from_host(size_type first, std::span<const T> values) { copy_from_host(first, values, stream()); }

  /// Copies elements [first, first + destination.size()) into host memory, then waits for
  /// `stream`: the copy sees all work queued there before it.
  /// @throws vmm::invalid_argument the range passes size().
  /// @throws vmm::driver_error the copy or the wait failed.
  void copy_to_host(size_type first, std::span<T> destination, stream_ref stream) const {
    check_range(first, destination.size(), "copy_to_host");
    if (destination.empty()) return;
    const auto* from = reinterpret_cast<const std::uint8_t*>(data() + first);
    auto* to = reinterpret_cast<std::uint8_t*>(destination.data());
    for_each_piece(from, destination.size_bytes(), [&](std::size_t offset, std::size_t n) {
      provider()->executor().copy(to + offset, from + offset, n, stream);
    });
    provider()->executor().synchronize(stream);
  }
  /// copy_to_host(first, destination, stream()). @throws as copy_to_host() on a stream.
  void copy_to_host(size_type first, std::span<T> destination) const {
    copy_to_host(first, destination, stream());
  }

  /// All elements, copied into a new host vector after the work queued on `stream`.
  /// @throws vmm::driver_error the copy or the wait failed.
  [[nodiscard]] std::vector<T> to_host(stream_ref stream) const {
    std::vector<T> result(size_);
    copy_to_host(0, result, stream);
    return result;
  }
  /// to_host(stream()). @throws as to_host() on a stream.
  [[nodiscard]] std::vector<T> to_host() const { return to_host(stream()); }

 private:
  // Maps room for `count` elements, runs `write` (which queues the copy or fill of the new
  // elements), then sets the size. If either throws, the vector is as it was.
  template <class Write>
  void grow_to(size_type count, stream_ref stream, Write&& write) {
    detail::capacity_rollback rollback(buffer_, stream);
    if (count > capacity()) buffer_.reserve(count * sizeof(T), stream);
    std::forward<Write>(write)();
    rollback.dismiss();
    size_ = count;
  }

  // Calls fn(offset, bytes) over [at, at + n) of this vector's memory: once, or, in a buffer
  // with a host part, once per mapping (the driver refuses some operations over a range
  // that spans two allocations, and the GPU and host parts are two kinds of memory).
  template <class Fn>
  void for_each_piece(const void* at, std::size_t n, Fn&& fn) const {
    if (!buffer_.spills_to_host()) {
      fn(std::size_t{0}, n);
      return;
    }
    const auto start = reinterpret_cast<std::uintptr_t>(at);
    for (const std::pair<std::uintptr_t, std::size_t>& piece :
         provider()->address_space().mapped_pieces(start, n))
      fn(static_cast<std::size_t>(piece.first - start), piece.second);
  }
  void copy_in(T* destination, const T* source, std::size_t n, stream_ref stream) {
    auto* to = reinterpret_cast<std::uint8_t*>(destination);
    const auto* from = reinterpret_cast<const std::uint8_t*>(source);
    for_each_piece(to, n, [&](std::size_t offset, std::size_t bytes) {
      provider()->executor().copy(to + offset, from + offset, bytes, stream);
    });
  }
  void fill_zero(T* destination, std::size_t n, stream_ref stream) {
    auto* to = reinterpret_cast<std::uint8_t*>(destination);
    for_each_piece(to, n, [&](std::size_t offset, std::size_t bytes) {
      provider()->executor().fill(to + offset, 0, bytes, stream);
    });
  }

  [[noreturn]] void throw_past_max_size(size_type added) const {
    throw out_of_memory("device_vector: " + std::to_string(size_) + " + " + std::to_string(added) +
                        " elements of " + std::to_string(sizeof(T)) + " bytes pass max_size() of " +
                        std::to_string(max_size()) + " elements");
  }

  void check_range(size_type first, size_type count, const char* what) const {
    if (first > size_ || count > size_ - first)
      throw invalid_argument(std::string("device_vector::") + what + ": elements [" + std::to_string(first) +
                             ", " + std::to_string(first) + " + " + std::to_string(count) + ") pass size() " +
                             std::to_string(size_));
  }

  growable_buffer buffer_;
  size_type size_ = 0;  // elements; capacity is the buffer's (see the file comment)
};

}  // namespace vmm
