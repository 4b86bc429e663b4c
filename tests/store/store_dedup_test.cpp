// De-duplication by content in the vmm-store daemon (docs/store.md, "De-duplication"):
// tensor sets laid out per tensor and sealed with tensor_set_options::deduplicate share the
// chunks whose bytes are equal; the daemon counts a shared chunk once, to one of the sets.
// A vmm-store daemon (the tool, spawned per test, or a vmm::store::server on a thread of this
// process where a test needs a server option), this process and tests/helpers/store_peer.cpp.
// Typed over the kinds of memory that can be exported (the OS provider always; a GPU kind
// skips without a GPU). On OS host memory, /proc/self/maps tells which memory a tensor's
// address maps: each chunk is a memfd of its own, named by its inode.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "helpers/store_peer_protocol.hpp"
#include "memory_io.hpp"
#include "process_resources.hpp"
#include "provider_kinds.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/server.hpp"
#include "vmm/store/tensor_set.hpp"
#include "vmm/store/tensors.hpp"

namespace vmm::testing {
namespace {

using store::dtype;

// One tensor to put: a name, a length in bytes (u8) and the seed of its pattern.
struct tensor_spec {
  std::string name;
  std::size_t bytes = 0;
  std::uint32_t seed = 0;
};

template <class Kind>
class dedup_test : public provider_test<Kind> {
 protected:
  static constexpr bool os_host = std::is_same_v<Kind, os_host_memory>;

  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->IsSkipped()) return;
    g_ = this->granularity_;
    start_daemon({});
  }
  void TearDown() override {
    if (server_) {
      server_->stop();
      serving_.join();
    }
  }
  void start_daemon(const std::vector<std::string>& arguments) {
    daemon_.reset();
    daemon_ = std::make_unique<daemon_process>(directory_.path() + "/socket", arguments);
    socket_ = daemon_->socket();
  }
  // A daemon on a thread of this process instead, with `options` (its socket path set here).
  void start_server(store::server_options options) {
    daemon_.reset();
    socket_ = directory_.path() + "/server-socket";
    options.socket_path = socket_;
    server_ = std::make_unique<store::server>(std::move(options));
    serving_ = std::thread([this] { server_->run(); });
  }
  store::client connect() { return store::client({.socket_path = socket_}); }

  // Puts `tensors` as the set `name`, laid out per tensor, with de-duplication or without.
  store::tensor_set put(store::client& store, const std::string& name,
                        const std::vector<tensor_spec>& tensors, bool deduplicate = true) {
    std::vector<std::vector<std::uint8_t>> data;
    std::vector<store::tensor_source> sources;
    data.reserve(tensors.size());
    for (const tensor_spec& t : tensors) {
      data.push_back(pattern(t.bytes, t.seed));
      sources.push_back({.name = t.name, .type = dtype::u8, .shape = {t.bytes}, .data = data.back().data()});
    }
    return store::tensor_set::put(store, name, sources, Kind::where(),
                                  {.layout = store::set_layout::per_tensor, .deduplicate = deduplicate});
  }
  // What another process reads of tensor `tensor` of set `set`: the checksum of its bytes.
  std::uint64_t read_elsewhere(const std::string& set, const std::string& tensor) {
    child_process peer(
        std::vector<std::string>{VMM_STORE_PEER_PATH, socket_, Kind::name, "tensor", set, tensor});
    const store_report got = receive_store_report(peer.socket());
    peer.close_socket();
    (void)peer.wait();
    return got.checksum;
  }
  // The bytes of a tensor as this process maps it.
  std::vector<std::uint8_t> read_here(const store::tensor_set& set, const std::string& tensor) {
    const store::tensor_view view = set.at(tensor);
    return read_bytes(*set.memory().provider(), reinterpret_cast<std::uintptr_t>(view.data),
                      view.info->bytes);
  }
  static std::uint64_t checksum_of(const tensor_spec& t) {
    const std::vector<std::uint8_t> bytes = pattern(t.bytes, t.seed);
    return checksum(bytes.data(), bytes.size());
  }

  // A base model: an embedding of two granules, two layers of one, a small norm.
  std::vector<tensor_spec> base() const {
    return {{"embed", 2 * g_, 1}, {"layer.0", g_, 2}, {"layer.1", g_, 3}, {"norm", 20, 4}};
  }
  // A fine-tune of it: layer.1 differs, nothing else.
  std::vector<tensor_spec> fine_tune() const {
    std::vector<tensor_spec> made = base();
    made[2].seed = 30;
    return made;
  }

  std::size_t g_ = 0;
  temporary_directory directory_;
  std::unique_ptr<daemon_process> daemon_;
  std::unique_ptr<store::server> server_;
  std::thread serving_;
  std::string socket_;
};

using store_kinds = ::testing::Types<os_host_memory, device_memory>;
TYPED_TEST_SUITE(dedup_test, store_kinds, memory_kind_names);

TYPED_TEST(dedup_test, a_fine_tune_stores_only_the_chunks_it_changed) {
  store::client store = this->connect();
  const std::size_t g = this->g_;
  store::tensor_set base = this->put(store, "base", this->base());
  const std::size_t capacity = base.memory().capacity();
  EXPECT_EQ(store.statistics().bytes, capacity);
  const store::buffer_info base_alone = store.stat("base");
  EXPECT_EQ(base_alone.stored_bytes, capacity);
  EXPECT_EQ(base_alone.shared_bytes, 0u);

  store::tensor_set tuned = this->put(store, "tuned", this->fine_tune());
  ASSERT_EQ(tuned.memory().capacity(), capacity);
  // Only layer.1's chunk is new: the embedding, layer.0, the chunk of the small tensors and
  // the table's (the same names and shapes: the same bytes) are the base's.
  const store::daemon_statistics both = store.statistics();
  EXPECT_EQ(both.bytes, capacity + g);
  EXPECT_EQ(both.capacity, 2 * capacity);
  // The fine-tune's own copies of what it shares went back to the pool: nothing in the daemon
  // (no cached manifest, no exported descriptor) keeps them in use.
  EXPECT_EQ(both.pool_used, capacity + g);
  const store::buffer_info info = store.stat("tuned");
  EXPECT_EQ(info.capacity, capacity);
  EXPECT_EQ(info.stored_bytes, g);
  EXPECT_EQ(info.shared_bytes, capacity - g);
  EXPECT_EQ(store.stat("base").stored_bytes, capacity);  // the first pays for what they share
  EXPECT_EQ(store.stat("base").shared_bytes, capacity - g);

  // Each reads back its own bytes, here and in another process.
  const std::vector<tensor_spec> b = this->base();
  const std::vector<tensor_spec> t = this->fine_tune();
  for (std::size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(this->read_here(base, b[i].name), pattern(b[i].bytes, b[i].seed)) << b[i].name;
    EXPECT_EQ(this->read_here(tuned, t[i].name), pattern(t[i].bytes, t[i].seed)) << t[i].name;
  }
  EXPECT_EQ(this->read_elsewhere("tuned", "layer.1"), this->checksum_of(t[2]));
  EXPECT_EQ(this->read_elsewhere("tuned", "embed"), this->checksum_of(t[0]));
  EXPECT_EQ(this->read_elsewhere("base", "layer.1"), this->checksum_of(b[2]));
  if constexpr (TestFixture::os_host) {
    // The set put returned maps the base's memory where they share: no second copy here.
    EXPECT_EQ(mapping_of(tuned.at("embed").data).inode, mapping_of(base.at("embed").data).inode);
    EXPECT_EQ(mapping_of(tuned.at("layer.0").data).inode, mapping_of(base.at("layer.0").data).inode);
    EXPECT_NE(mapping_of(tuned.at("layer.1").data).inode, mapping_of(base.at("layer.1").data).inode);
  }
}

TYPED_TEST(dedup_test, removing_the_base_keeps_the_fine_tune_and_counts_its_shared_chunks_to_it) {
  store::client store = this->connect();
  const std::size_t g = this->g_;
  std::optional<store::tensor_set> base = this->put(store, "base", this->base());
  const std::size_t capacity = base->memory().capacity();
  const store::tensor_set tuned = this->put(store, "tuned", this->fine_tune());
  ASSERT_EQ(store.statistics().bytes, capacity + g);

  store.remove("base");
  EXPECT_EQ(store.statistics().bytes, capacity + g);  // held still: nothing ends
  base.reset();                                       // the last hold: the base ends
  const store::daemon_statistics after = store.statistics();
  EXPECT_EQ(after.entries, 1u);
  // Only the base's own layer.1 went; what the fine-tune shared is counted to it now.
  EXPECT_EQ(after.bytes, capacity);
  EXPECT_EQ(after.capacity, capacity);
  const store::buffer_info info = store.stat("tuned");
  EXPECT_EQ(info.stored_bytes, capacity);
  EXPECT_EQ(info.shared_bytes, 0u);
  const std::vector<tensor_spec> t = this->fine_tune();
  for (const tensor_spec& spec : t) {
    EXPECT_EQ(this->read_here(tuned, spec.name), pattern(spec.bytes, spec.seed)) << spec.name;
    EXPECT_EQ(this->read_elsewhere("tuned", spec.name), this->checksum_of(spec)) << spec.name;
  }
  // A new set of the base's bytes shares with the fine-tune again: the index forgot
  // nothing that lives.
  const store::tensor_set again = this->put(store, "base-again", this->base());
  EXPECT_EQ(store.statistics().bytes, capacity + g);
  EXPECT_EQ(store.stat("base-again").stored_bytes, g);
}

TYPED_TEST(dedup_test, a_hash_collision_of_different_bytes_shares_nothing) {
  // Every chunk hashes alike: each lookup finds every chunk of its size, and only the
  // comparison of the bytes may share.
  this->start_server({.test_hash_collisions = true});
  store::client store = this->connect();
  const std::vector<tensor_spec> first = this->base();
  std::vector<tensor_spec> second = {
      {"other.embed", 2 * this->g_, 11}, {"other.0", this->g_, 12}, {"other.1", this->g_, 13}, {"n", 20, 14}};
  const store::tensor_set a = this->put(store, "a", first);
  const store::tensor_set b = this->put(store, "b", second);
  const std::size_t capacity = a.memory().capacity();
  ASSERT_EQ(b.memory().capacity(), capacity);
  EXPECT_EQ(store.statistics().bytes, 2 * capacity);
  EXPECT_EQ(store.stat("b").shared_bytes, 0u);
  for (std::size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(this->read_here(a, first[i].name), pattern(first[i].bytes, first[i].seed));
    EXPECT_EQ(this->read_here(b, second[i].name), pattern(second[i].bytes, second[i].seed));
    EXPECT_EQ(this->read_elsewhere("a", first[i].name), this->checksum_of(first[i]));
    EXPECT_EQ(this->read_elsewhere("b", second[i].name), this->checksum_of(second[i]));
  }
  // Equal bytes still share under colliding hashes: a copy of "a" stores nothing new.
  const store::tensor_set copy = this->put(store, "a-copy", first);
  EXPECT_EQ(store.statistics().bytes, 2 * capacity);
  EXPECT_EQ(store.stat("a-copy").stored_bytes, 0u);
  EXPECT_EQ(this->read_elsewhere("a-copy", "layer.1"), this->checksum_of(first[2]));
}

TYPED_TEST(dedup_test, one_embedding_in_two_different_models_is_stored_once) {
  store::client store = this->connect();
  const std::size_t g = this->g_;
  const tensor_spec embed{"tok_embeddings", 3 * g, 77};
  // The embedding first in one model and last in the other: offsets do not matter, chunks do.
  const std::vector<tensor_spec> one = {embed, {"one.w", g, 1}, {"one.b", 40, 2}};
  const std::vector<tensor_spec> two = {{"two.w", 2 * g, 3}, {"two.v", g, 4}, embed};
  const store::tensor_set a = this->put(store, "one", one);
  const store::tensor_set b = this->put(store, "two", two);
  const std::size_t named = a.memory().capacity() + b.memory().capacity();
  const store::daemon_statistics s = store.statistics();
  EXPECT_EQ(s.capacity, named);
  EXPECT_EQ(s.bytes, named - 3 * g);
  EXPECT_EQ(store.stat("two").shared_bytes, 3 * g);
  EXPECT_EQ(store.stat("two").stored_bytes, b.memory().capacity() - 3 * g);
  EXPECT_EQ(this->read_elsewhere("two", "tok_embeddings"), this->checksum_of(embed));
  EXPECT_EQ(this->read_elsewhere("two", "two.v"), this->checksum_of(two[1]));
  EXPECT_EQ(this->read_here(b, "tok_embeddings"), pattern(embed.bytes, embed.seed));
  if constexpr (TestFixture::os_host) {
    EXPECT_EQ(mapping_of(a.at("tok_embeddings").data).inode, mapping_of(b.at("tok_embeddings").data).inode);
  }
}

TYPED_TEST(dedup_test, the_cap_counts_stored_bytes_after_the_seal) {
  const std::size_t g = this->g_;
  std::size_t capacity = 0;
  {
    store::client probe = this->connect();
    capacity = this->put(probe, "probe", this->base()).memory().capacity();
  }
  // Room for two whole sets and one more chunk: a put needs its whole capacity until its
  // seal (the memory is made before its bytes are known), then only what it does not share.
  const std::size_t cap = 2 * capacity + g;
  this->start_daemon({"--cap", std::to_string(cap)});
  store::client store = this->connect();
  const store::tensor_set base = this->put(store, "base", this->base());
  const store::tensor_set one = this->put(store, "tuned.1", this->fine_tune());
  std::vector<tensor_spec> other = this->fine_tune();
  other[2].seed = 31;
  const store::tensor_set two = this->put(store, "tuned.2", other);  // 2 x capacity + g at its create
  EXPECT_EQ(store.statistics().bytes, capacity + 2 * g);
  EXPECT_EQ(store.stat("tuned.2").stored_bytes, g);
  // Without de-duplication, the same set is refused: its whole capacity counts.
  std::vector<tensor_spec> third = this->fine_tune();
  third[2].seed = 32;
  try {
    (void)this->put(store, "tuned.3", third, false);
    ADD_FAILURE() << "a put past the cap was accepted";
  } catch (const store::store_error& error) {
    EXPECT_TRUE(error.is(store::status::cap_exceeded)) << error.what();
    EXPECT_NE(std::string(error.what()).find("--cap"), std::string::npos) << error.what();
  }
  EXPECT_EQ(store.statistics().bytes, capacity + 2 * g);
}

TYPED_TEST(dedup_test, the_next_set_is_counted_to_its_client_when_the_payer_ends) {
  const std::size_t g = this->g_;
  std::size_t capacity = 0;
  {
    store::client probe = this->connect();
    capacity = this->put(probe, "probe", this->base()).memory().capacity();
  }
  this->start_daemon({"--client-cap", std::to_string(capacity + g)});
  store::client first = this->connect();
  store::client second = this->connect();
  std::optional<store::tensor_set> base = this->put(first, "base", this->base());
  const store::tensor_set tuned = this->put(second, "tuned", this->fine_tune());  // counted: g
  {
    // The second client's creations hold g: room for 2g more under its cap.
    store::buffer more = second.create("more", 2 * g, TypeParam::where());
  }
  second.remove("more");
  first.remove("base");
  base.reset();  // the base ends: the fine-tune is counted for all it maps, with no refusal
  EXPECT_EQ(second.stat("tuned").stored_bytes, capacity);
  try {
    (void)second.create("more", 2 * g, TypeParam::where());
    ADD_FAILURE() << "a create past the client cap was accepted";
  } catch (const store::store_error& error) {
    EXPECT_TRUE(error.is(store::status::cap_exceeded)) << error.what();
    EXPECT_NE(std::string(error.what()).find("--client-cap"), std::string::npos) << error.what();
  }
  EXPECT_EQ(this->read_elsewhere("tuned", "layer.0"), this->checksum_of(this->fine_tune()[1]));
}

TYPED_TEST(dedup_test, without_the_flag_nothing_is_shared) {
  store::client store = this->connect();
  const store::tensor_set base = this->put(store, "base", this->base(), false);
  const std::size_t capacity = base.memory().capacity();
  const store::tensor_set copy = this->put(store, "copy", this->base(), false);
  EXPECT_EQ(store.statistics().bytes, 2 * capacity);
  // One side asking is not enough: a set sealed without the flag is in no index.
  const store::tensor_set third = this->put(store, "third", this->base(), true);
  EXPECT_EQ(store.statistics().bytes, 3 * capacity);
  EXPECT_EQ(store.stat("third").shared_bytes, 0u);
  const store::tensor_set fourth = this->put(store, "fourth", this->base(), false);
  EXPECT_EQ(store.statistics().bytes, 4 * capacity);
  for (const char* name : {"base", "copy", "third", "fourth"}) {
    EXPECT_EQ(store.stat(name).stored_bytes, capacity) << name;
    EXPECT_EQ(store.stat(name).shared_bytes, 0u) << name;
  }
  if constexpr (TestFixture::os_host) {
    EXPECT_NE(mapping_of(base.at("embed").data).inode, mapping_of(copy.at("embed").data).inode);
  }
}

TYPED_TEST(dedup_test, plain_buffers_sealed_with_the_flag_share_equal_chunks) {
  store::client store = this->connect();
  const std::size_t g = this->g_;
  const std::vector<std::uint8_t> bytes = pattern(2 * g, 5);
  for (const char* name : {"x", "y"}) {
    store::buffer made = store.create(name, 2 * g, TypeParam::where(), {.one_chunk = true});
    write_bytes(*made.provider(), reinterpret_cast<std::uintptr_t>(made.data()), bytes);
    store.seal(name, {.deduplicate = true});
  }
  EXPECT_EQ(store.statistics().bytes, 2 * g);
  EXPECT_EQ(store.stat("y").shared_bytes, 2 * g);
  const store::buffer y = store.get("y");
  EXPECT_EQ(read_bytes(*y.provider(), reinterpret_cast<std::uintptr_t>(y.data()), 2 * g), bytes);
  EXPECT_EQ(y.max_size(), 2 * g);  // fixed chunks: it never grows
}

}  // namespace
}  // namespace vmm::testing
