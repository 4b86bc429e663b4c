// What the library does when operator new fails where it must not lose track of memory.
// A program of its own: it replaces the global operator new with one that fails on
// request, which the sanitizers' own allocators would not allow.

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <optional>
#include <string>

#include "vmm/chunk_pool.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/provider.hpp"
#include "vmm/store/protocol.hpp"
#include "vmm/store/server.hpp"

namespace {

std::atomic<int> fail_countdown{0};  // 0: never; n: the nth allocation from now fails

void* allocate(std::size_t size) {
  if (int left = fail_countdown.load(); left > 0 && fail_countdown.fetch_sub(1) == 1) throw std::bad_alloc();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t size) {
  return allocate(size);
}
void* operator new[](std::size_t size) {
  return allocate(size);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}

namespace vmm {
namespace {

// One request to the store daemon, and the reply it has written, through a socket of a pair.
void send(int socket, const store::request& r) {
  ipc::send_message(socket, store::encode(r));
}
store::reply answer(int socket) {
  return store::decode_reply(ipc::receive_message(socket, {}, std::chrono::milliseconds(1000)).payload);
}

// 11. The idle chunk's map node could not be allocated inside give_back: the memory was
// released, but reserved_current was never decremented, and with a cap the pool refused
// every later acquire.
TEST(allocation_failure, a_give_back_that_cannot_allocate_keeps_the_books_right) {
  constexpr std::size_t g = std::size_t{2} << 20;
  auto pool =
      chunk_pool::create(make_os_host_provider({.granularity = g, .commit_budget = 16 * g}), {.cap = 2 * g});
  {
    pooled_chunk chunk = pool->acquire(g);
    fail_countdown = 1;  // the give-back's node
  }
  fail_countdown = 0;
  const pool_statistics after = pool->statistics();
  EXPECT_EQ(after.reserved_current, 0u);
  EXPECT_EQ(after.used_current, 0u);
  EXPECT_EQ(after.chunks_released, 1u);
  // The cap holds two chunks again.
  pooled_chunk a = pool->acquire(g);
  pooled_chunk b = pool->acquire(g);
  EXPECT_EQ(pool->statistics().reserved_current, 2 * g);
}

// 12. The daemon of vmm-store ran out of memory for a hold's node: bad_alloc left
// serve_once and the daemon died, taking every client's buffers with it; closing a
// connection allocated inside a noexcept function. Now a failure closes the one connection
// whose request or reply could not be made, and the daemon serves on. Every allocation of
// one turn is made to fail, one after another.
TEST(allocation_failure, the_store_daemon_serves_on_when_a_request_cannot_allocate) {
  using namespace std::chrono_literals;
  int failures = 0;
  for (int n = 1;; ++n) {
    store::server daemon({.cap = std::size_t{64} << 20, .client_cap = std::size_t{32} << 20});
    const auto serve = [&] {
      for (int turn = 0; turn < 4; ++turn) ASSERT_TRUE(daemon.serve_once(0ms)) << "allocation " << n;
    };
    auto [client, served] = ipc::make_socket_pair();
    daemon.add_connection(std::move(served), ::getpid(), ::getuid());
    // A sealed entry the client holds (entry 1), made with nothing failing.
    send(client.get(), {.op = store::operation::create,
                        .name = "kept",
                        .where = location::os_host(),
                        .size = 4096,
                        .max_size = std::size_t{2} << 20});
    serve();
    const store::reply created = answer(client.get());
    ASSERT_EQ(created.code, store::status::ok) << created.message;
    (void)ipc::receive_message(client.get(), {}, 1000ms);  // the manifest (its fds close)
    send(client.get(), {.op = store::operation::seal, .name = "kept"});
    serve();
    ASSERT_EQ(answer(client.get()).code, store::status::ok);
    // A hold (no reply) and a statistics request, with the nth allocation failing.
    send(client.get(), {.op = store::operation::hold, .entry = 1});
    send(client.get(), {.op = store::operation::statistics});
    fail_countdown = n;
    serve();
    const bool failed = fail_countdown.exchange(0) == 0;
    failures += failed ? 1 : 0;
    // Either the client was served whole, or its connection was closed and its holds went.
    const store::daemon_statistics s = daemon.statistics();
    if (s.connections == 1) {
      EXPECT_EQ(s.holds, 2u) << "allocation " << n;
      const store::status code = answer(client.get()).code;
      EXPECT_TRUE(code == store::status::ok || (failed && code == store::status::out_of_memory))
          << "allocation " << n << ": " << store::to_string(code);
    } else {
      EXPECT_TRUE(failed);
      EXPECT_EQ(s.connections, 0u) << "allocation " << n;
      EXPECT_EQ(s.holds, 0u) << "allocation " << n;
    }
    EXPECT_EQ(s.entries, 1u) << "allocation " << n;  // sealed and named: it stays
    // Another client is served either way.
    auto [second, served_second] = ipc::make_socket_pair();
    daemon.add_connection(std::move(served_second), ::getpid(), ::getuid());
    send(second.get(), {.op = store::operation::stat, .name = "kept"});
    serve();
    const store::reply stat = answer(second.get());
    ASSERT_EQ(stat.code, store::status::ok) << "allocation " << n;
    EXPECT_EQ(store::decode_buffer_info(stat.body).holders, s.holds) << "allocation " << n;
    client.reset();
    serve();
    EXPECT_EQ(daemon.statistics().holds, 0u);
    if (!failed) break;  // the turn needed fewer than n allocations: each one has failed
  }
  EXPECT_GT(failures, 5);
}

// A de-duplicating seal that could not allocate entered part of its chunks in the daemon's
// content index and was refused: asked again, it counted the entry twice on those chunks, and
// once the entry ended the other one still reported them shared. Now a refused seal leaves
// the index as it was. Every allocation of the seal's turn is made to fail, one after another;
// both entries are two chunks of zeros, so the second shares both of the first's.
TEST(allocation_failure, a_deduplicating_seal_that_cannot_allocate_leaves_the_index_as_it_was) {
  using namespace std::chrono_literals;
  constexpr std::size_t g = std::size_t{2} << 20;
  int failures = 0;
  for (int n = 1;; ++n) {
    store::server daemon({});
    const auto serve = [&] {
      for (int turn = 0; turn < 4; ++turn) ASSERT_TRUE(daemon.serve_once(0ms)) << "allocation " << n;
    };
    const auto connect = [&] {
      auto [client, served] = ipc::make_socket_pair();
      daemon.add_connection(std::move(served), ::getpid(), ::getuid());
      return std::move(client);
    };
    const auto stat = [&](int socket, const std::string& name) {
      send(socket, {.op = store::operation::stat, .name = name});
      serve();
      const store::reply got = answer(socket);
      return got.code == store::status::ok ? std::optional(store::decode_buffer_info(got.body))
                                           : std::nullopt;
    };
    unique_fd client = connect();
    // Two chunks of g, made with nothing failing.
    const auto make = [&](const std::string& name) {
      send(client.get(), {.op = store::operation::create,
                          .name = name,
                          .where = location::os_host(),
                          .size = g,
                          .max_size = 2 * g,
                          .one_chunk = true});
      serve();
      const store::reply created = answer(client.get());
      ASSERT_EQ(created.code, store::status::ok) << created.message;
      (void)ipc::receive_message(client.get(), {}, 1000ms);  // the manifest (its fds close)
      send(client.get(), {.op = store::operation::grow, .name = name, .size = 2 * g});
      serve();
      const store::reply grown = answer(client.get());
      ASSERT_EQ(grown.code, store::status::ok) << grown.message;
    };
    make("first");
    send(client.get(), {.op = store::operation::seal, .name = "first", .deduplicate = true});
    serve();
    ASSERT_EQ(answer(client.get()).code, store::status::ok);
    make("second");
    send(client.get(), {.op = store::operation::seal, .name = "second", .deduplicate = true});
    fail_countdown = n;
    serve();
    const bool failed = fail_countdown.exchange(0) == 0;
    failures += failed ? 1 : 0;
    unique_fd other = connect();
    const bool connected = daemon.statistics().connections == 2;
    if (connected) {
      const store::reply sealed = answer(client.get());
      if (sealed.code != store::status::ok) {
        EXPECT_TRUE(failed) << "allocation " << n << ": " << sealed.message;
        EXPECT_EQ(sealed.code, store::status::out_of_memory) << "allocation " << n << ": " << sealed.message;
        // Asked again, with nothing failing.
        send(client.get(), {.op = store::operation::seal, .name = "second", .deduplicate = true});
        serve();
        ASSERT_EQ(answer(client.get()).code, store::status::ok) << "allocation " << n;
      }
    } else {
      EXPECT_TRUE(failed) << "allocation " << n;
    }
    client.reset();  // its holds go; an unsealed "second" goes with its creator
    serve();
    const std::optional<store::buffer_info> second = stat(other.get(), "second");
    if (second) {
      EXPECT_TRUE(second->sealed) << "allocation " << n;
      EXPECT_EQ(second->shared_bytes, 2 * g) << "allocation " << n;
      EXPECT_EQ(second->stored_bytes, 0u) << "allocation " << n;
      EXPECT_EQ(stat(other.get(), "first")->shared_bytes, 2 * g) << "allocation " << n;
      send(other.get(), {.op = store::operation::remove, .name = "second"});
      serve();
      ASSERT_EQ(answer(other.get()).code, store::status::ok) << "allocation " << n;
    } else {
      EXPECT_FALSE(connected) << "allocation " << n << ": a refused seal lost its entry";
    }
    // "second" ended either way: "first" shares with nobody, and pays for its own two chunks.
    const std::optional<store::buffer_info> first = stat(other.get(), "first");
    ASSERT_TRUE(first) << "allocation " << n;
    EXPECT_EQ(first->shared_bytes, 0u) << "allocation " << n;
    EXPECT_EQ(first->stored_bytes, 2 * g) << "allocation " << n;
    EXPECT_EQ(daemon.statistics().entries, 1u) << "allocation " << n;
    EXPECT_EQ(daemon.statistics().bytes, 2 * g) << "allocation " << n;
    if (!failed) break;  // the seal needed fewer than n allocations: each one has failed
  }
  EXPECT_GT(failures, 3);
}

}  // namespace
}  // namespace vmm
