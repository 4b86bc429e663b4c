// Fault sweeps (tests/fault_sweep.hpp) over every path that creates, maps, shares or hands
// off memory: each OS call (on the OS provider, with ENOMEM, EINVAL and EINTR) and each
// driver call (on the GPU, with CUDA_ERROR_OUT_OF_MEMORY and CUDA_ERROR_UNKNOWN) fails in
// turn, and the run must end in success or in a documented exception, keep the strong
// guarantee where one is documented, and leak nothing.
//
// The OS paths are plain tests on an OS provider of their own (64 KiB granularity, so that
// chunks are cheap and ranges need alignment padding). The driver paths are the same path
// classes in a typed suite over device memory, which skips without a GPU.
//
// protocol_error, peer_closed and timeout_error are documented for the receiving calls, but
// a failure injected in this process never causes them (the other end is this test, and it
// behaves): the paths leave them out of what they accept, so that a local failure reported
// as the peer's fault is caught.

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <numeric>
#include <optional>
#include <vector>

#include "fault_sweep.hpp"
#include "resource/host_copies.hpp"
#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/chunk_view.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/ipc/exporter.hpp"
#include "vmm/ipc/handoff.hpp"
#include "vmm/ipc/importer.hpp"
#include "vmm/mapped_range.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/retirement.hpp"
#include "vmm/ring_buffer.hpp"
#include "vmm/striped_buffer.hpp"

namespace vmm::testing {
namespace {

constexpr unsigned resize_errors = fails_out_of_memory | fails_os_error | fails_driver_error;

std::uintptr_t address_of(const void* data) {
  return reinterpret_cast<std::uintptr_t>(data);
}

// Memory read through its provider, uncounted by the armed fault.
std::vector<std::uint8_t> read_through(memory_provider& provider, const void* data, std::size_t n) {
  return without_faults([&] { return read_bytes(provider, address_of(data), n); });
}

void write_through(memory_provider& provider, const void* data, const std::vector<std::uint8_t>& bytes) {
  without_faults([&] { write_bytes(provider, address_of(data), bytes); });
}

// What the strong guarantee of growable_buffer::resize / reserve keeps.
struct buffer_state {
  void* data = nullptr;
  std::size_t size = 0;
  std::size_t capacity = 0;
  std::size_t chunk_count = 0;
  std::size_t pool_used = 0;
  std::vector<std::uint8_t> bytes;  // [0, size)
};

buffer_state state_of(const growable_buffer& buffer) {
  return {buffer.data(),
          buffer.size(),
          buffer.capacity(),
          buffer.chunk_count(),
          buffer.pool()->statistics().used_current,
          read_through(*buffer.provider(), buffer.data(), buffer.size())};
}

void expect_unchanged(const buffer_state& before, const growable_buffer& buffer, const char* call) {
  const buffer_state now = state_of(buffer);
  EXPECT_EQ(now.data, before.data) << call << " failed and moved the buffer";
  EXPECT_EQ(now.size, before.size) << call << " failed and changed size()";
  EXPECT_EQ(now.capacity, before.capacity) << call << " failed and changed capacity()";
  EXPECT_EQ(now.chunk_count, before.chunk_count) << call << " failed and changed chunk_count()";
  EXPECT_EQ(now.pool_used, before.pool_used) << call << " failed and kept chunks from the pool";
  EXPECT_TRUE(now.bytes == before.bytes) << call << " failed and changed the bytes up to the old size";
}

// ---- grow: resize and reserve up in several steps --------------------------------------------

template <bool Fixed>
class grow_path : public sweep_path {
 public:
  explicit grow_path(const sweep_context& context)
      : g_(context.granularity()),
        buffer_(context.pool, {.max_size = 64 * g_,
                               .policy = Fixed ? chunk_policy::fixed(g_) : chunk_policy::geometric()}) {
    buffer_.resize(g_ / 2);
    write_bytes(*context.provider, address_of(buffer_.data()), pattern(g_ / 2, 1));
  }

  void operator()() {
    for (const std::size_t target : {3 * g_ / 2, 4 * g_, 4 * g_ + 1, 9 * g_, 20 * g_ + 5}) {
      before_ = state_of(buffer_);
      during("growable_buffer::resize", resize_errors);
      buffer_.resize(target);
    }
    before_ = state_of(buffer_);
    during("growable_buffer::reserve", resize_errors);
    buffer_.reserve(30 * g_);
  }

  void check(const outcome& result) {
    if (!result.succeeded()) {
      expect_unchanged(before_, buffer_, call());
      return;
    }
    EXPECT_EQ(buffer_.size(), 20 * g_ + 5);
    EXPECT_GE(buffer_.capacity(), 30 * g_);
    EXPECT_EQ(read_through(*buffer_.provider(), buffer_.data(), g_ / 2), pattern(g_ / 2, 1));
  }

 private:
  std::size_t g_;
  growable_buffer buffer_;
  buffer_state before_;
};

// ---- shrink: resize down (chunks retired, and unmapped at once on host memory), then up -----
//
// A chunk that cannot be unmapped while shrinking stays mapped and retired; the grow that
// follows must take it back rather than map past it, and the pool must not lend it.

class shrink_path : public sweep_path {
 public:
  explicit shrink_path(const sweep_context& context)
      : g_(context.granularity()),
        pool_(context.pool),
        buffer_(context.pool, {.max_size = 16 * g_, .policy = chunk_policy::fixed(g_)}) {
    buffer_.resize(8 * g_);
    write_bytes(*context.provider, address_of(buffer_.data()), pattern(8 * g_, 2));
  }

  void operator()() {
    before_ = state_of(buffer_);
    during("growable_buffer::resize (down)", resize_errors);
    buffer_.resize(g_ + 100);
    before_ = state_of(buffer_);
    during("growable_buffer::resize (up again)", resize_errors);
    buffer_.resize(8 * g_);
  }

  void check(const outcome& result) {
    if (!result.succeeded()) {
      expect_unchanged(before_, buffer_, call());
      return;
    }
    EXPECT_EQ(buffer_.size(), 8 * g_);
    EXPECT_EQ(buffer_.capacity(), 8 * g_);
    // Chunks that stayed mapped were taken back, the others came back from the pool.
    EXPECT_EQ(buffer_.chunk_count(), 8u);
    EXPECT_EQ(pool_->statistics().chunks_created, 8u);
    EXPECT_EQ(pool_->statistics().used_current, 8 * g_);
    const auto prefix = pattern(8 * g_, 2);
    EXPECT_TRUE(
        read_through(*buffer_.provider(), buffer_.data(), g_ + 100) ==
        std::vector<std::uint8_t>(prefix.begin(), prefix.begin() + static_cast<std::ptrdiff_t>(g_ + 100)));
  }

 private:
  std::size_t g_;
  std::shared_ptr<chunk_pool> pool_;
  growable_buffer buffer_;
  buffer_state before_;
};

// ---- vector: device_vector push_back, append, resize, reserve ---------------------------------

class vector_path : public sweep_path {
 public:
  using element = std::uint32_t;

  explicit vector_path(const sweep_context& context)
      : g_(context.granularity()),
        per_chunk_(g_ / sizeof(element)),
        vector_(context.pool, {.max_size = 64 * g_}) {
    std::vector<element> first(per_chunk_ / 2);
    std::iota(first.begin(), first.end(), element{0});
    vector_.append(std::span<const element>(first));
  }

  void operator()() {
    std::vector<element> batch(3 * per_chunk_);
    std::iota(batch.begin(), batch.end(), element{1000});
    snapshot();
    during("device_vector::append", resize_errors);
    vector_.append(std::span<const element>(batch));
    for (int i = 0; i < 3; ++i) {
      snapshot();
      during("device_vector::push_back", resize_errors);
      vector_.push_back(static_cast<element>(7 + i));
    }
    snapshot();
    during("device_vector::resize", resize_errors);
    vector_.resize(9 * per_chunk_, element_init::zeroed);
    snapshot();
    during("device_vector::reserve", resize_errors);
    vector_.reserve(20 * per_chunk_);
  }

  void check(const outcome& result) {
    if (!result.succeeded()) {
      EXPECT_EQ(vector_.data(), data_) << call() << " failed and moved the vector";
      EXPECT_EQ(vector_.size(), size_) << call() << " failed and changed size()";
      EXPECT_EQ(vector_.capacity(), capacity_) << call() << " failed and changed capacity()";
      // On the GPU a failed copy retires the capacity mapped for it in stream order: the
      // chunks count until the stream passes (device_vector::chunk_count).
      if (vector_.provider()->capabilities().synchronous) {
        EXPECT_EQ(vector_.chunk_count(), chunk_count_) << call() << " failed and changed chunk_count()";
      }
      EXPECT_TRUE(vector_.to_host() == contents_) << call() << " failed and changed the elements";
      return;
    }
    EXPECT_EQ(vector_.size(), 9 * per_chunk_);
    EXPECT_GE(vector_.capacity(), 20 * per_chunk_);
    const std::vector<element> elements = vector_.to_host();
    EXPECT_EQ(elements[per_chunk_ / 2 + 3 * per_chunk_ + 2], 9u);
    EXPECT_EQ(elements.back(), 0u);
  }

 private:
  void snapshot() {
    without_faults([&] {
      data_ = vector_.data();
      size_ = vector_.size();
      capacity_ = vector_.capacity();
      chunk_count_ = vector_.chunk_count();
      contents_ = vector_.to_host();
    });
  }

  std::size_t g_;
  std::size_t per_chunk_;
  device_vector<element> vector_;
  const element* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  std::size_t chunk_count_ = 0;
  std::vector<element> contents_;
};

// ---- views: alias, permute and concatenate of buffers ------------------------------------------

class views_path : public sweep_path {
 public:
  explicit views_path(const sweep_context& context)
      : g_(context.granularity()),
        a_(context.pool, {.max_size = 8 * g_, .policy = chunk_policy::fixed(g_)}),
        b_(context.pool, {.max_size = 8 * g_, .policy = chunk_policy::fixed(g_)}) {
    a_.resize(4 * g_);
    b_.resize(2 * g_);
    write_bytes(*context.provider, address_of(a_.data()), pattern(4 * g_, 3));
    write_bytes(*context.provider, address_of(b_.data()), pattern(2 * g_, 4));
  }

  void operator()() {
    constexpr unsigned view_errors = fails_out_of_memory | fails_os_error | fails_driver_error;
    during("alias", view_errors);
    views_.push_back(alias(a_, g_, 2 * g_, access_mode::read_only));
    during("permute", view_errors);
    const std::array<std::size_t, 4> reversed{3, 2, 1, 0};
    views_.push_back(permute(a_, reversed));
    during("concatenate", view_errors);
    const std::array<const growable_buffer*, 2> both{&a_, &b_};
    views_.push_back(concatenate(both));
  }

  void check(const outcome& result) {
    memory_provider& provider = *a_.provider();
    const auto a = pattern(4 * g_, 3);
    const auto b = pattern(2 * g_, 4);
    EXPECT_EQ(read_through(provider, a_.data(), 4 * g_), a) << "a view failed and changed its buffer";
    if (!result.succeeded()) return;
    const auto slice = [](const std::vector<std::uint8_t>& bytes, std::size_t at, std::size_t n) {
      return std::vector<std::uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                                       bytes.begin() + static_cast<std::ptrdiff_t>(at + n));
    };
    ASSERT_EQ(views_.size(), 3u);
    EXPECT_EQ(read_through(provider, views_[0].data(), 2 * g_), slice(a, g_, 2 * g_));
    const auto reversed = read_through(provider, views_[1].data(), 4 * g_);
    for (std::size_t i = 0; i < 4; ++i)
      EXPECT_EQ(slice(reversed, i * g_, g_), slice(a, (3 - i) * g_, g_))
          << "chunk " << i << " of the permutation";
    auto joined = a;
    joined.insert(joined.end(), b.begin(), b.end());
    EXPECT_EQ(read_through(provider, views_[2].data(), 6 * g_), joined);
  }

 private:
  std::size_t g_;
  growable_buffer a_;
  growable_buffer b_;
  std::vector<chunk_view> views_;
};

// ---- ring_buffer construction -----------------------------------------------------------------

class ring_path : public sweep_path {
 public:
  explicit ring_path(const sweep_context& context) : pool_(context.pool), g_(context.granularity()) {}

  void operator()() {
    during("ring_buffer", fails_out_of_memory | fails_os_error | fails_driver_error);
    ring_.emplace(pool_, 2 * g_);
  }

  void check(const outcome& result) {
    if (!result.succeeded()) return;
    memory_provider& provider = *pool_->provider();
    EXPECT_EQ(ring_->head(), 0u);
    EXPECT_EQ(ring_->tail(), 0u);
    const auto bytes = pattern(2 * g_, 5);
    write_through(provider, ring_->data(), bytes);
    EXPECT_EQ(read_through(provider, ring_->data() + 2 * g_, 2 * g_), bytes) << "the second mapping";
  }

 private:
  std::shared_ptr<chunk_pool> pool_;
  std::size_t g_;
  std::optional<ring_buffer> ring_;
};

// ---- striping: a striped_buffer over GPU 0 alone (GPU memory only) ---------------------------

class striping_path : public sweep_path {
 public:
  explicit striping_path(const sweep_context& context) : pool_(context.pool), g_(context.granularity()) {}

  void operator()() {
    during("striped_buffer", fails_out_of_memory | fails_driver_error);
    striped_.emplace(std::vector<int>{0}, 4 * g_,
                     striped_buffer_options{.stripe_size = g_, .pools = {pool_}});
  }

  void check(const outcome& result) {
    if (!result.succeeded()) return;
    EXPECT_EQ(striped_->size(), 4 * g_);
    EXPECT_EQ(striped_->chunks().size(), 4u);
    const auto bytes = pattern(4 * g_, 6);
    write_through(*pool_->provider(), striped_->data(), bytes);
    EXPECT_EQ(read_through(*pool_->provider(), striped_->data(), 4 * g_), bytes);
  }

 private:
  std::shared_ptr<chunk_pool> pool_;
  std::size_t g_;
  std::optional<striped_buffer> striped_;
};

// ---- export: export_buffer and send_manifest, twice (the second from the cache) -------------

growable_buffer shared_source(const sweep_context& context, std::size_t chunks, std::uint32_t seed) {
  const std::size_t g = context.granularity();
  growable_buffer buffer(context.pool, {.max_size = 16 * g, .policy = chunk_policy::fixed(g)});
  buffer.resize(chunks * g - 100);
  write_bytes(*context.provider, address_of(buffer.data()), pattern(chunks * g, seed));
  return buffer;
}

constexpr unsigned export_errors = fails_out_of_memory | fails_os_error | fails_driver_error;
constexpr unsigned send_errors = fails_os_error;  // and timeout_error, which needs a peer that stops
// imported_buffer::receive / receive_growth: invalid_argument for a handle the provider
// refuses to import (a memfd whose seals cannot be read, an fd the driver does not take).
constexpr unsigned import_errors =
    fails_out_of_memory | fails_os_error | fails_driver_error | fails_invalid_argument;

class export_path : public sweep_path {
 public:
  explicit export_path(const sweep_context& context) : source_(shared_source(context, 3, 7)) {}

  void operator()() {
    for (ipc::exported_manifest* sent : {&first_, &second_}) {
      during("exporter::export_buffer", export_errors);
      *sent = exporter_.export_buffer(source_);
      during("send_manifest", send_errors);
      ipc::send_manifest(sockets_.first.get(), *sent);
    }
  }

  void check(const outcome& result) {
    if (!result.succeeded()) return;
    for (const ipc::exported_manifest* sent : {&first_, &second_}) {
      const ipc::received_manifest received = ipc::receive_manifest(sockets_.second.get());
      EXPECT_EQ(received.description, sent->description);
      EXPECT_EQ(received.fds.size(), 3u);
    }
    const ipc::export_statistics statistics = exporter_.statistics();
    EXPECT_EQ(statistics.handles_exported, 3u);
    EXPECT_EQ(statistics.cache_hits, 3u);
  }

 private:
  growable_buffer source_;
  ipc::exporter exporter_;
  std::pair<unique_fd, unique_fd> sockets_ = ipc::make_socket_pair();
  ipc::exported_manifest first_;
  ipc::exported_manifest second_;
};

// ---- import: imported_buffer::receive of a manifest this process sent itself -----------------

class import_path : public sweep_path {
 public:
  explicit import_path(const sweep_context& context)
      : provider_(context.provider), source_(shared_source(context, 3, 8)) {
    ipc::send_manifest(sockets_.first.get(), exporter_.export_buffer(source_));
  }

  void operator()() {
    during("imported_buffer::receive", import_errors);
    imported_.emplace(ipc::imported_buffer::receive(sockets_.second.get(), {.provider = provider_}));
  }

  void check(const outcome& result) {
    if (!result.succeeded()) return;
    EXPECT_EQ(imported_->size(), source_.size());
    EXPECT_EQ(imported_->capacity(), source_.capacity());
    EXPECT_EQ(read_through(*provider_, imported_->data(), source_.size()),
              read_through(*provider_, source_.data(), source_.size()));
  }

 private:
  std::shared_ptr<memory_provider> provider_;
  growable_buffer source_;
  ipc::exporter exporter_;
  std::pair<unique_fd, unique_fd> sockets_ = ipc::make_socket_pair();
  std::optional<ipc::imported_buffer> imported_;
};

// ---- a manifest of more chunks than one message carries fds: send, then receive --------------
//
// max_fds_per_message + 1 chunks: the manifest travels in two messages, and the importer
// has imported the first message's handles when the continuation arrives. Swept at the
// socket's sites only (poll, sendmsg, recvmsg): the per-chunk calls are the import path's.

class continuation_path : public sweep_path {
 public:
  static constexpr std::size_t chunks = ipc::max_fds_per_message + 1;

  explicit continuation_path(const sweep_context& context)
      : provider_(context.provider),
        source_(context.pool, {.max_size = chunks * context.granularity(),
                               .policy = chunk_policy::fixed(context.granularity())}) {
    source_.resize(chunks * context.granularity());
    std::memset(source_.data(), 0x5a, source_.size());
  }

  void operator()() {
    {
      during("exporter::export_buffer", export_errors);
      const ipc::exported_manifest exported = exporter_.export_buffer(source_);
      during("send_manifest", fails_os_error);
      ipc::send_manifest(sockets_.first.get(), exported);
    }
    during("imported_buffer::receive", import_errors);
    imported_.emplace(ipc::imported_buffer::receive(sockets_.second.get(), {.provider = provider_}));
  }

  void check(const outcome& result) {
    if (!result.succeeded()) return;
    EXPECT_EQ(imported_->chunk_count(), chunks);
    EXPECT_EQ(std::memcmp(imported_->data(), source_.data(), source_.size()), 0);
  }

 private:
  std::shared_ptr<memory_provider> provider_;
  growable_buffer source_;
  ipc::exporter exporter_;
  std::pair<unique_fd, unique_fd> sockets_ = ipc::make_socket_pair();
  std::optional<ipc::imported_buffer> imported_;
};

// ---- follow-growth: export_growth, send_manifest, receive_growth ----------------------------

class follow_path : public sweep_path {
 public:
  explicit follow_path(const sweep_context& context)
      : provider_(context.provider), g_(context.granularity()), source_(shared_source(context, 2, 9)) {
    const ipc::exported_manifest first = exporter_.export_buffer(source_);
    ipc::send_manifest(sockets_.first.get(), first);
    imported_ = ipc::imported_buffer::receive(sockets_.second.get(), {.provider = provider_});
    last_ = first.description;
    source_.resize(5 * g_ - 7);
    write_bytes(*provider_, address_of(source_.data()), pattern(5 * g_, 10));
  }

  void operator()() {
    during("exporter::export_growth", export_errors);
    const ipc::exported_manifest growth = exporter_.export_growth(source_, last_);
    during("send_manifest", send_errors);
    ipc::send_manifest(sockets_.first.get(), growth);
    before_ = current_import();
    during("imported_buffer::receive_growth", import_errors);
    imported_.receive_growth(sockets_.second.get());
  }

  void check(const outcome& result) {
    if (!result.succeeded()) {
      if (std::strcmp(call(), "imported_buffer::receive_growth") == 0) {
        const import_state now = current_import();
        EXPECT_EQ(now.data, before_.data) << "receive_growth failed and moved the import";
        EXPECT_EQ(now.size, before_.size) << "receive_growth failed and changed size()";
        EXPECT_EQ(now.capacity, before_.capacity) << "receive_growth failed and changed capacity()";
        EXPECT_EQ(now.chunk_count, before_.chunk_count) << "receive_growth failed and changed chunk_count()";
        EXPECT_TRUE(now.bytes == before_.bytes) << "receive_growth failed and changed the bytes";
      }
      EXPECT_EQ(imported_.capacity(), 2 * g_);
      return;
    }
    EXPECT_EQ(imported_.capacity(), 5 * g_);
    EXPECT_EQ(imported_.size(), source_.size());
    EXPECT_EQ(read_through(*provider_, imported_.data(), source_.size()),
              read_through(*provider_, source_.data(), source_.size()));
  }

 private:
  struct import_state {
    void* data = nullptr;
    std::size_t size = 0;
    std::size_t capacity = 0;
    std::size_t chunk_count = 0;
    std::vector<std::uint8_t> bytes;
  };
  [[nodiscard]] import_state current_import() const {
    return {imported_.data(), imported_.size(), imported_.capacity(), imported_.chunk_count(),
            read_through(*provider_, imported_.data(), imported_.capacity())};
  }

  std::shared_ptr<memory_provider> provider_;
  std::size_t g_;
  growable_buffer source_;
  ipc::exporter exporter_;
  std::pair<unique_fd, unique_fd> sockets_ = ipc::make_socket_pair();
  ipc::imported_buffer imported_;
  ipc::manifest last_;
  import_state before_;
};

// ---- teardown: destroying a view, an import and a buffer --------------------------------------
//
// Destructors never throw, so every run succeeds; what a failed unmap or free leaves behind
// must still be gone once the fault is disarmed and collect_retired(true) has run (the
// retirement list tries again; a later destruction in the same run may already have).

class teardown_path : public sweep_path {
 public:
  explicit teardown_path(const sweep_context& context)
      : provider_(context.provider), g_(context.granularity()) {
    buffer_.emplace(shared_source(context, 3, 11));
    view_.emplace(alias(*buffer_, g_, 2 * g_));
    ipc::exporter exporter;
    const auto sockets = ipc::make_socket_pair();
    ipc::send_manifest(sockets.first.get(), exporter.export_buffer(*buffer_));
    imported_.emplace(ipc::imported_buffer::receive(sockets.second.get(), {.provider = provider_}));
  }

  void operator()() {
    during("~chunk_view", 0);
    view_.reset();
    during("~imported_buffer", 0);
    imported_.reset();
    during("~growable_buffer", 0);
    buffer_.reset();
  }

  void check(const outcome& result) {
    EXPECT_TRUE(result.succeeded()) << "a destructor threw: " << result.what;
  }

 private:
  std::shared_ptr<memory_provider> provider_;
  std::size_t g_;
  std::optional<growable_buffer> buffer_;
  std::optional<chunk_view> view_;
  std::optional<ipc::imported_buffer> imported_;
};

// ---- hand-off: producer and consumer on one thread, in non-blocking order --------------------

// Any driver call may answer CUDA_ERROR_OUT_OF_MEMORY, which is vmm::out_of_memory.
constexpr unsigned handoff_driver_errors = fails_driver_error | fails_out_of_memory;
constexpr unsigned handoff_send_errors = fails_os_error | handoff_driver_errors;
constexpr unsigned handoff_receive_errors = fails_os_error;

class handoff_path : public sweep_path {
 public:
  explicit handoff_path(const sweep_context& context) : provider_(context.provider) {}

  void operator()() {
    during("handoff_producer", handoff_send_errors);
    producer_.emplace(sockets_.first.get(), provider_);
    during("handoff_consumer", handoff_receive_errors | handoff_driver_errors);
    consumer_.emplace(sockets_.second.get(), provider_);
    for (int round = 0; round < 2; ++round) {
      during("handoff_producer::publish", handoff_send_errors);
      producer_->publish({});
      during("handoff_consumer::acquire", handoff_receive_errors);
      consumer_->acquire({});
      during("handoff_consumer::finish", handoff_send_errors);
      consumer_->finish({});
      during("handoff_producer::wait_consumed", handoff_receive_errors);
      producer_->wait_consumed({});
    }
  }

  void check(const outcome& result) {
    if (!result.succeeded()) return;
    EXPECT_EQ(producer_->rounds(), 2u);
    EXPECT_EQ(consumer_->rounds(), 2u);
  }

 private:
  std::shared_ptr<memory_provider> provider_;
  std::pair<unique_fd, unique_fd> sockets_ = ipc::make_socket_pair();
  std::optional<ipc::handoff_producer> producer_;
  std::optional<ipc::handoff_consumer> consumer_;
};

// The producer's side alone, the consumer played by the test from the wire format of
// vmm/ipc/handoff.hpp: the driver refuses to open an IPC event in the process that created
// it, so on the GPU the consumer's side needs a second process.
class handoff_producer_path : public sweep_path {
 public:
  explicit handoff_producer_path(const sweep_context& context) : provider_(context.provider) {}

  void operator()() {
    during("handoff_producer", handoff_send_errors);
    producer_.emplace(sockets_.first.get(), provider_);
    without_faults([&] { (void)ipc::receive_message(sockets_.second.get(), 0); });  // the events
    for (std::uint64_t round = 1; round <= 2; ++round) {
      during("handoff_producer::publish", handoff_send_errors);
      producer_->publish({});
      without_faults([&] {
        (void)ipc::receive_message(sockets_.second.get(), 0);  // "ready"
        ipc::send_message(sockets_.second.get(), done_message(round));
      });
      during("handoff_producer::wait_consumed", handoff_receive_errors | handoff_driver_errors);
      producer_->wait_consumed({});
    }
  }

  void check(const outcome& result) {
    if (result.succeeded()) {
      EXPECT_EQ(producer_->rounds(), 2u);
    }
  }

 private:
  static std::vector<std::byte> done_message(std::uint64_t round) {
    static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");
    std::vector<std::byte> bytes(16);
    const std::uint32_t magic = 0x484d4d56;  // "VMMH"
    const std::uint32_t done = 3;
    std::memcpy(bytes.data(), &magic, 4);
    std::memcpy(bytes.data() + 4, &done, 4);
    std::memcpy(bytes.data() + 8, &round, 8);
    return bytes;
  }

  std::shared_ptr<memory_provider> provider_;
  std::pair<unique_fd, unique_fd> sockets_ = ipc::make_socket_pair();
  std::optional<ipc::handoff_producer> producer_;
};

// ---- wake: a memory resource's pages mapped again, a run at a time, the copies as it goes ------
//
// A failed wake gives back every page it mapped (the copies queued into them finish first)
// and its tags stay asleep; the wake after it restores every byte. The swept call wakes one
// tag of two, so that no host copy is given back (on a thread of its own) while the failure
// is armed.

class wake_path : public sweep_path {
 public:
  explicit wake_path(const sweep_context& context)
      : provider_(context.provider), g_(context.granularity()), resource_(context.pool) {
    // More pages than one step of wake() grants, runs of one tag that cross its steps, and
    // pages shared by the two tags.
    for (const auto& [bytes, tag] : {std::pair{12 * g_ + g_ / 2, woken}, std::pair{g_, later},
                                     std::pair{20 * g_ + g_ / 4, woken}, std::pair{6 * g_ + 4096, woken}}) {
      allocations_.push_back({resource_.allocate({}, bytes, 256, tag), bytes, tag,
                              pattern(bytes, static_cast<std::uint32_t>(allocations_.size() + 60))});
      write_through(*provider_, allocations_.back().data, allocations_.back().bytes);
    }
    const allocation_tag offload[] = {woken, later};
    resource_.sleep(offload);
  }
  wake_path(const wake_path&) = delete;
  wake_path& operator=(const wake_path&) = delete;
  ~wake_path() {
    for (const allocation& a : allocations_) resource_.deallocate({}, a.data, a.size);
  }

  void operator()() {
    during("memory_resource::wake", fails_out_of_memory | fails_os_error | fails_driver_error);
    const allocation_tag tags[] = {woken};
    resource_.wake(tags);
  }

  void check(const outcome& result) {
    EXPECT_TRUE(resource_.asleep());
    const allocation_tag tags[] = {woken};
    if (!result.succeeded()) {
      EXPECT_EQ(resource_.statistics().reserved_current, 0u) << "the failed wake kept pages";
      resource_.wake(tags);
    }
    resource_.wake();
    for (const allocation& a : allocations_)
      EXPECT_EQ(read_through(*provider_, a.data, a.size), a.bytes) << "tag " << a.tag.value;
  }

 private:
  static constexpr allocation_tag woken{1};
  static constexpr allocation_tag later{2};
  struct allocation {
    void* data;
    std::size_t size;
    allocation_tag tag;
    std::vector<std::uint8_t> bytes;
  };
  std::shared_ptr<memory_provider> provider_;
  std::size_t g_;
  memory_resource resource_;
  std::vector<allocation> allocations_;
};

// sleep() of a resource: the host copies are had first, so a failure anywhere leaves the
// resource awake, its pages mapped and its bytes as they were, and no host copy made. With
// `into_kept_copies`, a sleep and a wake that keeps its host copies come first: the sleep
// swept copies into those, and a failure leaves them kept.
template <bool into_kept_copies>
class sleep_path : public sweep_path {
 public:
  explicit sleep_path(const sweep_context& context)
      : provider_(context.provider), g_(context.granularity()), resource_(context.pool) {
    for (const std::size_t bytes : {9 * g_ + g_ / 2, 3 * g_ + 4096}) {
      allocations_.push_back({resource_.allocate({}, bytes, 256, saved), bytes,
                              pattern(bytes, static_cast<std::uint32_t>(allocations_.size() + 80))});
      write_through(*provider_, allocations_.back().data, allocations_.back().bytes);
    }
    if (into_kept_copies) {
      const allocation_tag tags[] = {saved};
      resource_.sleep(tags);
      resource_.wake({}, {}, after_wake::keep_host_copies);
      kept_ = resource_.statistics().host_copy_bytes;
    }
    reserved_ = resource_.statistics().reserved_current;
  }
  sleep_path(const sleep_path&) = delete;
  sleep_path& operator=(const sleep_path&) = delete;
  ~sleep_path() {
    for (const allocation& a : allocations_) resource_.deallocate({}, a.data, a.size);
  }

  void operator()() {
    during("memory_resource::sleep", fails_out_of_memory | fails_os_error | fails_driver_error);
    const allocation_tag tags[] = {saved};
    resource_.sleep(tags);
  }

  void check(const outcome& result) {
    if (!result.succeeded()) {
      EXPECT_FALSE(resource_.asleep());
      EXPECT_EQ(resource_.statistics().reserved_current, reserved_) << "the failed sleep gave pages back";
      EXPECT_EQ(vmm::detail::host_copies::bytes_in_process(), host_before_ + kept_)
          << "the failed sleep kept host copies it made, or lost those kept before";
      EXPECT_EQ(resource_.statistics().host_copy_bytes, kept_);
    } else {
      resource_.wake();
    }
    for (const allocation& a : allocations_) EXPECT_EQ(read_through(*provider_, a.data, a.size), a.bytes);
  }

 private:
  static constexpr allocation_tag saved{1};
  struct allocation {
    void* data;
    std::size_t size;
    std::vector<std::uint8_t> bytes;
  };
  std::shared_ptr<memory_provider> provider_;
  std::size_t g_;
  memory_resource resource_;
  std::vector<allocation> allocations_;
  std::size_t reserved_ = 0;
  std::size_t kept_ = 0;  // host copies kept by the wake before
  std::size_t host_before_ = vmm::detail::host_copies::bytes_in_process();
};

// ---- the OS provider: every OS site, ENOMEM / EINVAL / EINTR -----------------------------------

class os_fault_sweep : public ::testing::Test {
 protected:
  static constexpr std::size_t granularity = std::size_t{64} << 10;

  template <class Path>
  sweep_report run(const char* name) {
    return sweep<Path>(name, provider_, fault::all_os, {ENOMEM, EINVAL, EINTR});
  }

  std::shared_ptr<memory_provider> provider_ =
      make_os_host_provider({.granularity = granularity, .commit_budget = std::size_t{256} << 20});
};

TEST_F(os_fault_sweep, grow_with_fixed_chunks) {
  EXPECT_GT(run<grow_path<true>>("grow fixed").total_points(), 0u);
}

TEST_F(os_fault_sweep, wake_of_a_memory_resource) {
  // Once first used, the host copies' default pool and the C library's arena for the thread
  // that gives them back stay for the rest of the process: one wake before the sweep, so
  // that every run's baseline holds them already.
  {
    wake_path warm_up(sweep_context{provider_, chunk_pool::create(provider_)});
    warm_up();
    warm_up.check({});
  }
  EXPECT_GT(run<wake_path>("wake").total_points(), 0u);
}

TEST_F(os_fault_sweep, sleep_of_a_memory_resource) {
  {  // as for wake: what the first wake leaves for the rest of the process, before the sweep
    sleep_path<false> warm_up(sweep_context{provider_, chunk_pool::create(provider_)});
    warm_up();
    warm_up.check({});
  }
  EXPECT_GT(run<sleep_path<false>>("sleep").total_points(), 0u);
  EXPECT_GT(run<sleep_path<true>>("sleep into kept copies").total_points(), 0u);
}

TEST_F(os_fault_sweep, grow_with_geometric_chunks) {
  EXPECT_GT(run<grow_path<false>>("grow geometric").total_points(), 0u);
}

TEST_F(os_fault_sweep, shrink_then_grow_takes_back_chunks_that_stayed_mapped) {
  const sweep_report report = run<shrink_path>("shrink");
  EXPECT_GT(report.total_points(), 0u);
  EXPECT_GT(report.cleanup_reports, 0u) << "no unmap failed while shrinking: the stuck-chunk path never ran";
}

TEST_F(os_fault_sweep, device_vector_push_back_append_resize_reserve) {
  EXPECT_GT(run<vector_path>("vector").total_points(), 0u);
}

TEST_F(os_fault_sweep, views_alias_permute_concatenate) {
  EXPECT_GT(run<views_path>("views").total_points(), 0u);
}

TEST_F(os_fault_sweep, ring_buffer_construction) {
  EXPECT_GT(run<ring_path>("ring_buffer").total_points(), 0u);
}

TEST_F(os_fault_sweep, export_and_send_manifest) {
  EXPECT_GT(run<export_path>("export").total_points(), 0u);
}

TEST_F(os_fault_sweep, import_by_receive) {
  EXPECT_GT(run<import_path>("import").total_points(), 0u);
}

TEST_F(os_fault_sweep, import_of_a_manifest_with_a_continuation_message) {
  // The source's memfds, the exporter's cache, a message's fds and the imported handles:
  // about four descriptors a chunk at once, past the common soft limit of 1024.
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  const rlim_t wanted = 8 * continuation_path::chunks;
  if (limit.rlim_cur < wanted) {
    if (limit.rlim_max < wanted) GTEST_SKIP() << "RLIMIT_NOFILE's hard limit is below " << wanted;
    limit.rlim_cur = wanted;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  }
  // Page-sized chunks: hundreds of them per run cost little.
  const auto small_chunks =
      make_os_host_provider({.granularity = 4096, .commit_budget = std::size_t{64} << 20});
  const sweep_report report = sweep<continuation_path>(
      "continuation", small_chunks, fault::poll | fault::sendmsg | fault::recvmsg, {ENOMEM, EINVAL, EINTR});
  EXPECT_GT(report.total_points(), 0u);
}

TEST_F(os_fault_sweep, follow_growth) {
  EXPECT_GT(run<follow_path>("follow-growth").total_points(), 0u);
}

TEST_F(os_fault_sweep, teardown_of_a_view_an_import_and_a_buffer) {
  const sweep_report report = run<teardown_path>("teardown");
  EXPECT_GT(report.total_points(), 0u);
  EXPECT_GT(report.cleanup_reports, 0u) << "no unmap or free failed: the retry never ran";
}

// What the teardown sweep relies on, step by step: an unmap or a free that fails is kept on
// the retirement list, its chunks out of the pool, and done at the next collection.
TEST_F(os_fault_sweep, an_unmap_or_free_that_failed_is_tried_again_at_the_next_collection) {
  const counting_cleanup_reports counting;
  const std::size_t g = granularity;
  const auto pool = chunk_pool::create(provider_);
  const held_resources before = resources_of(*provider_);
  {
    growable_buffer buffer(pool, {.max_size = 4 * g, .policy = chunk_policy::fixed(g)});
    buffer.resize(2 * g);
    std::optional<chunk_view> view(alias(buffer, 0, 2 * g));
    {
      armed_fault failing(fault::mmap, 1, ENOMEM);  // the view's unmap of its last chunk
      view.reset();
    }
    EXPECT_EQ(retired_count(), 1u) << "the view that could not be unmapped waits on the list";
    EXPECT_EQ(provider_->address_space().usage().ranges, before.usage.ranges + 2);
    buffer.resize(0);
    EXPECT_EQ(pool->statistics().used_current, 2 * g)
        << "chunks still mapped by the view went back to the pool";
    collect_retired();
    EXPECT_EQ(retired_count(), 0u);
    EXPECT_EQ(pool->statistics().used_current, 0u);
    EXPECT_EQ(provider_->address_space().usage().ranges, before.usage.ranges + 1);
  }
  {
    std::optional<mapped_range> run(std::in_place, provider_, 2 * g);
    run->push_back(std::make_shared<const pooled_chunk>(pool->acquire(g)));
    {
      armed_fault failing(fault::munmap, 1, ENOMEM);  // freeing the range, once it is unmapped
      run.reset();                                    // at once, not retired
    }
    EXPECT_EQ(retired_count(), 1u) << "the range that could not be freed waits on the list";
    EXPECT_EQ(pool->statistics().used_current, 0u) << "its chunk was unmapped and given back";
    collect_retired();
    EXPECT_EQ(retired_count(), 0u);
  }
  pool->trim_to(0);
  expect_same_resources(before, resources_of(*provider_), true);
  EXPECT_GT(cleanup_reports.load(), 0u) << "the failures were reported";
}

TEST_F(os_fault_sweep, handoff_on_one_thread) {
  EXPECT_GT(run<handoff_path>("hand-off").total_points(), 0u);
}

// ---- the driver: every driver call, CUDA_ERROR_OUT_OF_MEMORY / CUDA_ERROR_UNKNOWN --------------

template <class Kind>
class driver_fault_sweep : public provider_test<Kind> {
 protected:
  template <class Path>
  sweep_report run(const char* name) {
    constexpr int cuda_error_out_of_memory = 2;
    constexpr int cuda_error_unknown = 999;
    return sweep<Path>(name, this->provider_, fault::driver, {cuda_error_out_of_memory, cuda_error_unknown});
  }
};
using driver_memory_kinds = ::testing::Types<device_memory>;
TYPED_TEST_SUITE(driver_fault_sweep, driver_memory_kinds, memory_kind_names);

TYPED_TEST(driver_fault_sweep, grow_with_fixed_chunks) {
  EXPECT_GT(this->template run<grow_path<true>>("grow fixed").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, grow_with_geometric_chunks) {
  EXPECT_GT(this->template run<grow_path<false>>("grow geometric").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, shrink_then_grow_takes_back_chunks_that_stayed_mapped) {
  EXPECT_GT(this->template run<shrink_path>("shrink").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, device_vector_push_back_append_resize_reserve) {
  EXPECT_GT(this->template run<vector_path>("vector").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, views_alias_permute_concatenate) {
  EXPECT_GT(this->template run<views_path>("views").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, striped_buffer_on_gpu_0) {
  EXPECT_GT(this->template run<striping_path>("striping").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, ring_buffer_construction) {
  EXPECT_GT(this->template run<ring_path>("ring_buffer").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, export_and_send_manifest) {
  if (this->provider_->capabilities().export_kind != handle_kind::posix_fd)
    GTEST_SKIP() << "the GPU's memory is not exported as a POSIX fd here";
  EXPECT_GT(this->template run<export_path>("export").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, import_by_receive) {
  if (this->provider_->capabilities().export_kind != handle_kind::posix_fd)
    GTEST_SKIP() << "the GPU's memory is not exported as a POSIX fd here";
  EXPECT_GT(this->template run<import_path>("import").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, follow_growth) {
  if (this->provider_->capabilities().export_kind != handle_kind::posix_fd)
    GTEST_SKIP() << "the GPU's memory is not exported as a POSIX fd here";
  EXPECT_GT(this->template run<follow_path>("follow-growth").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, teardown_of_a_view_an_import_and_a_buffer) {
  if (this->provider_->capabilities().export_kind != handle_kind::posix_fd)
    GTEST_SKIP() << "the GPU's memory is not exported as a POSIX fd here";
  EXPECT_GT(this->template run<teardown_path>("teardown").total_points(), 0u);
}

TYPED_TEST(driver_fault_sweep, handoff_producer_side) {
  EXPECT_GT(this->template run<handoff_producer_path>("hand-off producer").total_points(), 0u);
}

}  // namespace
}  // namespace vmm::testing
