// The exception contracts of the public headers: one case per public entry point that can be
// given bad input, each asserting that exactly the type its @throws names comes out (not a
// base, not a sibling: a catch clause written against the header must catch it), and that
// nothing changed where the contract says so. Typed over the providers where the entry point
// takes memory; the rest run once.

#include <gtest/gtest.h>
#include <cxxabi.h>
#include <sys/stat.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "helpers/store_peer_protocol.hpp"
#include "provider_kinds.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/device_vector.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/ipc/exporter.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/importer.hpp"
#include "vmm/ipc/manifest.hpp"
#include "vmm/ipc/resource_sharing.hpp"
#include "vmm/mapping.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/physical_allocation.hpp"
#include "vmm/ring_buffer.hpp"
#include "vmm/stream_executor.hpp"
#include "vmm/stripe_layout.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/host_mirror.hpp"
#include "vmm/store/protocol.hpp"
#include "vmm/store/safetensors.hpp"
#include "vmm/store/server.hpp"
#include "vmm/store/tensors.hpp"

namespace vmm::testing {
namespace {

std::string type_name(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string result = status == 0 ? name : type.name();
  std::free(name);
  return result;
}

// Runs `call`, which must throw exactly `Expected`.
template <class Expected, class Call>
void expect_exactly(const char* entry_point, Call&& call) {
  try {
    call();
    ADD_FAILURE() << entry_point << ": nothing thrown, " << type_name(typeid(Expected)) << " expected";
  } catch (const std::exception& error) {
    EXPECT_EQ(typeid(error), typeid(Expected))
        << entry_point << ": " << type_name(typeid(error)) << " thrown, " << type_name(typeid(Expected))
        << " expected (" << error.what() << ")";
  }
}

constexpr std::size_t mib = std::size_t{1} << 20;

template <class Kind>
class contracts : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->provider_ != nullptr) pool_ = chunk_pool::create(this->provider_);
  }
  std::shared_ptr<chunk_pool> pool_;
};
TYPED_TEST_SUITE(contracts, all_memory_kinds, memory_kind_names);

TYPED_TEST(contracts, provider_and_pool) {
  const std::size_t g = this->granularity_;
  memory_provider& provider = *this->provider_;
  expect_exactly<invalid_argument>("memory_provider::allocate_range(g + 1)",
                                   [&] { (void)provider.allocate_range(g + 1); });
  expect_exactly<invalid_argument>("memory_provider::free_range(not a range)",
                                   [&] { provider.free_range(g, g); });
  expect_exactly<invalid_argument>("memory_provider::create(0)", [&] { (void)provider.create(0); });
  expect_exactly<invalid_argument>("memory_provider::map(unreserved)", [&] {
    const physical_allocation memory(this->provider_, g);
    provider.map(g, g, memory.get());
  });
  expect_exactly<invalid_argument>("memory_provider::set_access(no grants)",
                                   [&] { provider.set_access(g, g, {}); });
  expect_exactly<invalid_argument>("chunk_pool::create(nullptr)", [] { (void)chunk_pool::create(nullptr); });
  const pool_statistics before = this->pool_->statistics();
  expect_exactly<invalid_argument>("chunk_pool::acquire(0)", [&] { (void)this->pool_->acquire(0); });
  EXPECT_EQ(this->pool_->statistics().reserved_current, before.reserved_current);
  expect_exactly<invalid_argument>("pooled_chunk::give_back(empty)", [] { pooled_chunk{}.give_back({}); });
  expect_exactly<out_of_memory>("chunk_pool::acquire past the cap", [&] {
    this->pool_->set_cap(g);
    (void)this->pool_->acquire(2 * g);
  });
  this->pool_->set_cap(std::numeric_limits<std::size_t>::max());
  expect_exactly<invalid_argument>("mapping(unreserved address)", [&] {
    const physical_allocation memory(this->provider_, g);
    const mapping mapped(memory, g, access_mode::read_write);
  });
}

TYPED_TEST(contracts, buffers) {
  const std::size_t g = this->granularity_;
  expect_exactly<invalid_argument>("growable_buffer(null pool)",
                                   [] { const growable_buffer b(std::shared_ptr<chunk_pool>{}); });
  expect_exactly<invalid_argument>("growable_buffer(fixed(0) chunks)", [&] {
    const growable_buffer b(this->pool_, {.max_size = 4 * g, .policy = chunk_policy::fixed(0)});
  });
  growable_buffer buffer(this->pool_, {.max_size = 4 * g});
  buffer.resize(g);
  const std::size_t capacity = buffer.capacity();
  expect_exactly<out_of_memory>("growable_buffer::resize past max_size", [&] { buffer.resize(5 * g); });
  EXPECT_EQ(buffer.size(), g);
  EXPECT_EQ(buffer.capacity(), capacity);
  expect_exactly<invalid_argument>("growable_buffer::chunks past capacity",
                                   [&] { (void)buffer.chunks(0, capacity + g); });
  device_vector<int> vector(this->pool_, {.max_size = g});
  vector.resize(4, element_init::zeroed);
  const int values[8] = {};
  expect_exactly<invalid_argument>("device_vector::copy_from_host past size",
                                   [&] { vector.copy_from_host(2, values); });
  expect_exactly<out_of_memory>("device_vector::resize past max_size",
                                [&] { vector.resize(g, element_init::zeroed); });
  EXPECT_EQ(vector.size(), 4u);
  expect_exactly<invalid_argument>("ring_buffer(capacity not of the granularity)",
                                   [&] { const ring_buffer ring(this->pool_, g + 1); });
}

TYPED_TEST(contracts, memory_resource) {
  const std::size_t g = this->granularity_;
  expect_exactly<invalid_argument>("memory_resource(null pool)",
                                   [] { const memory_resource r(std::shared_ptr<chunk_pool>{}); });
  expect_exactly<invalid_argument>("memory_resource(headroom 2)", [&] {
    const memory_resource r(this->pool_, {.max_size = 16 * g, .headroom = 2});
  });
  memory_resource resource(this->pool_, {.max_size = 16 * g});
  void* p = resource.allocate({}, 1000);
  const memory_resource_statistics before = resource.statistics();
  expect_exactly<invalid_argument>("memory_resource::allocate(alignment 3)",
                                   [&] { (void)resource.allocate({}, 10, 3); });
  expect_exactly<invalid_argument>("memory_resource::allocate(2^48 + 1)",
                                   [&] { (void)resource.allocate({}, (std::size_t{1} << 48) + 1); });
  expect_exactly<out_of_memory>("memory_resource::allocate past max_size",
                                [&] { (void)resource.allocate({}, 17 * g); });
  expect_exactly<out_of_memory>("memory_resource::allocate(2^48)",
                                [&] { (void)resource.allocate({}, std::size_t{1} << 48); });
  expect_exactly<invalid_argument>("memory_resource::allocate_sync(alignment 3)",
                                   [&] { (void)resource.allocate_sync(10, 3); });
  expect_exactly<invalid_argument>("memory_resource::pages_of(another size)",
                                   [&] { (void)resource.pages_of(p, 1001); });
  expect_exactly<invalid_argument>("memory_resource::register_memory(null registrar)",
                                   [&] { (void)resource.register_memory(p, 1000, nullptr); });
  expect_exactly<invalid_argument>("memory_resource::set_access(no grants)",
                                   [&] { resource.set_access({}); });
  expect_exactly<invalid_argument>("memory_resource::wake while awake", [&] { resource.wake(); });
  const memory_resource_statistics after = resource.statistics();
  EXPECT_EQ(after.segments, before.segments);
  EXPECT_EQ(after.reserved_current, before.reserved_current);
  EXPECT_EQ(after.used_current, before.used_current);
  EXPECT_EQ(after.allocations_total, before.allocations_total);
  resource.sleep({});
  expect_exactly<invalid_argument>("memory_resource::allocate while asleep",
                                   [&] { (void)resource.allocate({}, 10); });
  expect_exactly<invalid_argument>("memory_resource::sleep while asleep", [&] { resource.sleep({}); });
  resource.wake();
  resource.deallocate({}, p, 1000);
  EXPECT_EQ(resource.statistics().bad_deallocations, 0u);
}

TYPED_TEST(contracts, exports_and_imports) {
  const std::size_t g = this->granularity_;
  if (this->provider_->capabilities().export_kind == handle_kind::none)
    GTEST_SKIP() << TypeParam::name << " memory cannot be exported";
  growable_buffer buffer(this->pool_, {.max_size = 4 * g});
  buffer.resize(2 * g);
  ipc::exporter exporter;
  expect_exactly<invalid_argument>("exporter::export_range off chunk boundaries",
                                   [&] { (void)exporter.export_range(buffer, 1, g); });
  const ipc::exported_manifest exported = exporter.export_buffer(buffer);
  expect_exactly<invalid_argument>("imported_buffer(manifest, too few fds)",
                                   [&] { const ipc::imported_buffer imported(exported.description, {}); });
  memory_resource large_pages(this->pool_, {.max_size = 64 * g, .large_page_size = 2 * g});
  expect_exactly<invalid_argument>("resource_exporter(handle_type none)",
                                   [&] { const ipc::resource_exporter e(large_pages); });
  ipc::imported_resource imported({.resource_id = 1, .where = TypeParam::where(), .granularity = g});
  expect_exactly<invalid_argument>("imported_resource::allocate", [&] { (void)imported.allocate({}, 100); });
  expect_exactly<invalid_argument>("imported_resource::allocate_sync",
                                   [&] { (void)imported.allocate_sync(100); });
}

TEST(contracts_without_memory, manifests_channels_and_layouts) {
  const std::vector<std::byte> garbage(100, std::byte{0x5a});
  expect_exactly<ipc::bad_manifest>("ipc::parse_manifest(garbage)",
                                    [&] { (void)ipc::parse_manifest(garbage); });
  ipc::manifest broken;
  broken.granularity = 3;
  expect_exactly<ipc::bad_manifest>("ipc::validate(granularity 3)", [&] { ipc::validate(broken); });
  expect_exactly<ipc::bad_manifest>("ipc::serialize(granularity 3)", [&] { (void)ipc::serialize(broken); });
  expect_exactly<invalid_argument>("ipc::connect_unix(\"\")", [] { (void)ipc::connect_unix(""); });
  expect_exactly<invalid_argument>("ipc::listen_unix(200 bytes)",
                                   [] { (void)ipc::listen_unix(std::string(200, 'x')); });
  auto [left, right] = ipc::make_socket_pair();
  const std::vector<int> too_many(ipc::max_fds_per_message + 1, left.get());
  expect_exactly<invalid_argument>("ipc::send_message(254 fds)",
                                   [&] { ipc::send_message(left.get(), {}, too_many); });
  const ipc::frame_header forged{0x12345678, 0, 0};
  ASSERT_EQ(::write(left.get(), &forged, sizeof forged), static_cast<ssize_t>(sizeof forged));
  expect_exactly<ipc::protocol_error>("ipc::receive_message(wrong magic)",
                                      [&] { (void)ipc::receive_message(right.get()); });
  expect_exactly<invalid_argument>("make_stripe_layout(size 0)",
                                   [] { (void)make_stripe_layout(0, 1, 1, stripe_mode::round_robin); });
  expect_exactly<invalid_argument>("stream_event::record_again(empty)",
                                   [] { stream_event{}.record_again({}); });
  expect_exactly<invalid_argument>("chunk_pool(os host)::acquire(0)",
                                   [] { (void)default_pool(location::os_host())->acquire(0); });
}

TEST(contracts_without_memory, store_messages) {
  expect_exactly<invalid_argument>("store::encode(empty name)", [] {
    (void)store::encode(store::request{.op = store::operation::create});
  });
  expect_exactly<invalid_argument>("store::encode(get with access none)", [] {
    (void)store::encode(
        store::request{.op = store::operation::get, .name = "x", .access = access_mode::none});
  });
  const std::vector<std::byte> garbage(40, std::byte{0x01});
  expect_exactly<ipc::protocol_error>("store::decode_request(garbage)",
                                      [&] { (void)store::decode_request(garbage); });
  expect_exactly<ipc::protocol_error>("store::decode_reply(garbage)",
                                      [&] { (void)store::decode_reply(garbage); });
  expect_exactly<ipc::protocol_error>("store::decode_buffer_info(garbage)",
                                      [&] { (void)store::decode_buffer_info(garbage); });
  expect_exactly<ipc::protocol_error>("store::decode_tensor_table(garbage)",
                                      [&] { (void)store::decode_tensor_table(garbage, 1024); });
  expect_exactly<invalid_argument>("store::lay_out(an unknown dtype)", [] {
    std::vector<store::tensor_info> table = {{.name = "t", .type = static_cast<store::dtype>(0)}};
    (void)store::lay_out(table);
  });
  expect_exactly<invalid_argument>("store::parse_safetensors_header(garbage)",
                                   [&] { (void)store::parse_safetensors_header(garbage, 0); });
  expect_exactly<os_error>("store::read_safetensors_header(a missing file)",
                           [] { (void)store::read_safetensors_header("/nonexistent/model.safetensors"); });
  expect_exactly<invalid_argument>("store::server(socket path of 200 bytes)", [] {
    const store::server daemon({.socket_path = "/tmp/" + std::string(200, 'x')});
  });
}

class store_contracts : public ::testing::Test {
 protected:
  void SetUp() override { daemon_ = std::make_unique<daemon_process>(directory_.path() + "/socket"); }
  temporary_directory directory_;
  std::unique_ptr<daemon_process> daemon_;
};

TEST_F(store_contracts, the_client_refuses_bad_input_with_the_documented_types) {
  expect_exactly<store::store_error>("store::client(no daemon)", [&] {
    const store::client c({.socket_path = directory_.path() + "/nothing"});
  });
  expect_exactly<invalid_argument>("store::client(socket path of 200 bytes)", [] {
    const store::client c({.socket_path = "/tmp/" + std::string(200, 'x')});
  });
  store::client store({.socket_path = daemon_->socket()});
  const store::daemon_statistics before = store.statistics();
  const std::string bad_names[] = {
      "",       std::string(store::max_name_bytes + 1, 'n'), "bad\xff", "tab\there", std::string("nul\0", 4),
      "del\x7f"};
  for (const std::string& name : bad_names) {
    expect_exactly<invalid_argument>("store::client::create(bad name)",
                                     [&] { (void)store.create(name, 4096, location::os_host()); });
    expect_exactly<invalid_argument>("store::client::get(bad name)", [&] { (void)store.get(name); });
    expect_exactly<invalid_argument>("store::client::grow(bad name)", [&] { (void)store.grow(name, 8192); });
    expect_exactly<invalid_argument>("store::client::seal(bad name)", [&] { store.seal(name); });
    expect_exactly<invalid_argument>("store::client::grant(bad name)", [&] { store.grant(name, 1); });
    expect_exactly<invalid_argument>("store::client::stat(bad name)", [&] { (void)store.stat(name); });
    expect_exactly<invalid_argument>("store::client::remove(bad name)", [&] { store.remove(name); });
  }
  expect_exactly<invalid_argument>("store::client::get(access none)",
                                   [&] { (void)store.get("frames", access_mode::none); });
  expect_exactly<invalid_argument>("store::client::create(negative location id)", [&] {
    (void)store.create("frames", 4096, location{memory_kind::device, -1});
  });
  expect_exactly<store::store_error>("store::client::get(missing)", [&] { (void)store.get("missing"); });
  expect_exactly<store::store_error>("store::client::remove(missing)", [&] { store.remove("missing"); });
  expect_exactly<invalid_argument>("store::buffer::refresh(empty)", [] { store::buffer{}.refresh(); });
  expect_exactly<invalid_argument>("store::host_mirror(empty buffer)", [] {
    const store::buffer empty;
    const store::host_mirror mirror(empty);
  });
  // The client is still usable, and the daemon holds what it held.
  EXPECT_EQ(store.statistics(), before);
  store::buffer made = store.create("frames", 4096, location::os_host());
  const store::buffer read_only = store.get("frames");
  store::host_mirror mirror(read_only);
  expect_exactly<invalid_argument>("store::host_mirror::copy_back(read-only)", [&] { mirror.copy_back(); });
  const std::string loose = directory_.path() + "/loose";
  ASSERT_EQ(::mkdir(loose.c_str(), 0755), 0);
  expect_exactly<invalid_argument>("store::prepare_socket_directory(mode 0755)",
                                   [&] { store::prepare_socket_directory(loose + "/socket"); });
}

}  // namespace
}  // namespace vmm::testing
