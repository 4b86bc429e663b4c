// A vmm-store daemon restarted inside this process (two vmm::store::server in turn on one
// socket, each on a thread of its own), so that a fault injected here reaches the client
// and the daemon alike: every provider export is refused, as a GPU's driver refuses to
// export a handle the process imported. What is offered and served after the restart must
// then come from the descriptors the imports kept (vmm/physical_allocation.hpp). OS host
// memory: the provider every machine has.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fault_injection.hpp"  // vmm/src: test-only fault injection
#include "helpers/store_peer_protocol.hpp"
#include "memory_io.hpp"
#include "vmm/provider.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/server.hpp"
#include "vmm/store/tensor_set.hpp"

namespace vmm::testing {
namespace {

namespace fault = vmm::detail::fault;
using store::dtype;

// A daemon serving on a thread until it is destroyed.
class daemon_thread {
 public:
  explicit daemon_thread(const std::string& socket)
      : daemon_(std::make_unique<store::server>(store::server_options{.socket_path = socket})),
        loop_([this] { daemon_->run(); }) {}
  daemon_thread(const daemon_thread&) = delete;
  daemon_thread& operator=(const daemon_thread&) = delete;
  // Stops the loop, then destroys every buffer and connection, as a daemon that dies does
  // (what clients map stays theirs).
  ~daemon_thread() {
    daemon_->stop();
    loop_.join();
  }

 private:
  std::unique_ptr<store::server> daemon_;
  std::thread loop_;
};

class store_restart : public ::testing::Test {
 protected:
  store_restart() {
    const std::size_t g = provider_for(location::os_host())->capabilities().granularity;
    for (std::uint32_t i = 0; i < 3; ++i) {
      bytes_.push_back(pattern(i == 2 ? 20 : g, 40 + i));
      sources_.push_back({.name = fmt::format("t{}", i),
                          .type = dtype::u8,
                          .shape = {bytes_.back().size()},
                          .data = bytes_.back().data()});
    }
  }

  [[nodiscard]] std::string socket() const { return directory_.path() + "/socket"; }
  [[nodiscard]] store::tensor_set put(store::client& store) const {
    return store::tensor_set::put(store, "model", sources_, location::os_host(),
                                  {.layout = store::set_layout::per_tensor});
  }
  [[nodiscard]] std::vector<std::uint8_t> read(const store::tensor_set& set, std::size_t i) const {
    return read_bytes(*set.memory().provider(),
                      reinterpret_cast<std::uintptr_t>(set.at(sources_[i].name).data), bytes_[i].size());
  }

  temporary_directory directory_;
  std::vector<std::vector<std::uint8_t>> bytes_;
  std::vector<store::tensor_source> sources_;
};

// The client offers its set from kept descriptors and the new daemon, which kept the
// descriptors of what it adopted, serves it to another client: no provider export is asked
// on either side, and the bytes are the ones put.
TEST_F(store_restart, a_set_is_offered_and_served_again_from_kept_descriptors_alone) {
  auto daemon = std::make_unique<daemon_thread>(socket());
  store::client store({.socket_path = socket()});
  const store::tensor_set held = put(store);
  ASSERT_EQ(held.memory().chunk_count(), 4u);  // t0, t1, t2 and the table
  daemon.reset();
  daemon = std::make_unique<daemon_thread>(socket());

  fault::arm(fault::provider_export, 1, EINVAL);
  std::vector<std::string> refused{"not run"};
  std::vector<std::vector<std::uint8_t>> served;
  std::string failure;
  try {
    refused = store.reconnect();
    store::client other({.socket_path = socket()});
    const store::tensor_set got = store::tensor_set::get(other, "model");
    for (std::size_t i = 0; i < bytes_.size(); ++i) served.push_back(read(got, i));
  } catch (const std::exception& error) {
    failure = error.what();
  }
  const std::uint64_t asked = fault::calls();
  fault::disarm();
  EXPECT_EQ(failure, "");
  EXPECT_EQ(refused, std::vector<std::string>{});
  EXPECT_EQ(asked, 0u) << "a provider export was asked for";
  EXPECT_EQ(served, bytes_);
  EXPECT_EQ(store.stat("model").holders, 1u);
}

// The control: a client that keeps no descriptors cannot offer its set when the provider
// refuses to export, and says so; the set stays mapped and readable in its handle.
TEST_F(store_restart, without_kept_descriptors_a_refused_export_is_an_offer_that_cannot_be_made) {
  auto daemon = std::make_unique<daemon_thread>(socket());
  store::client store({.socket_path = socket(), .keep_descriptors = false});
  const store::tensor_set held = put(store);
  daemon.reset();
  daemon = std::make_unique<daemon_thread>(socket());

  fault::arm(fault::provider_export, 1, EINVAL);
  std::vector<std::string> refused;
  std::string failure;
  try {
    refused = store.reconnect();
  } catch (const std::exception& error) {
    failure = error.what();
  }
  const bool fired = fault::fired();
  fault::disarm();
  EXPECT_EQ(failure, "");
  EXPECT_TRUE(fired);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("model: cannot be offered"), std::string::npos) << refused[0];
  EXPECT_NE(refused[0].find("injected"), std::string::npos) << refused[0];
  EXPECT_TRUE(store.list().empty());
  EXPECT_EQ(read(held, 0), bytes_[0]);
}

}  // namespace
}  // namespace vmm::testing
