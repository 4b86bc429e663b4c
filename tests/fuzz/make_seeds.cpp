/// @file
/// Writes the seed corpora of the fuzz targets from real, valid conversations: manifests
/// made by a real exporter, frames and hand-off messages captured from the library's own
/// senders, operation scripts that a user could run. The bytes are encoded in each target's
/// input format (fuzz_support.hpp and the targets' file comments).
///
///   vmm_fuzz_make_seeds DIR     writes DIR/<target>/seed-* (tests/fuzz/corpus in the tree)
///
/// Buffer ids are random per process, so a new run changes the manifest bytes but not what
/// the seeds exercise.

#include <vmm/chunk_pool.hpp>
#include <vmm/growable_buffer.hpp>
#include <vmm/ipc/exporter.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/ipc/handoff.hpp>
#include <vmm/ipc/manifest.hpp>
#include <vmm/provider.hpp>
#include <vmm/store/protocol.hpp>
#include <vmm/store/tensors.hpp>
#include <vmm/stream_ref.hpp>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_support.hpp"

namespace {

namespace fs = std::filesystem;
namespace ipc = vmm::ipc;
using bytes = std::vector<std::byte>;
using vmm::fuzz::fd_kind;
using vmm::fuzz::fd_spec;
using vmm::fuzz::page;
using vmm::fuzz::put_u16;
using vmm::fuzz::put_u8;

fs::path corpus_root;

void write_seed(const std::string& target, const std::string& name, const bytes& content) {
  const fs::path dir = corpus_root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / ("seed-" + name), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
  if (!out) throw std::runtime_error("cannot write " + (dir / name).string());
}

bytes text(std::string_view s) {
  const auto view = std::as_bytes(std::span(s));
  return {view.begin(), view.end()};
}

// Everything queued on `socket` now (it must be non-blocking), without its descriptors.
bytes drain(int socket) {
  bytes all;
  std::array<std::byte, 4096> chunk{};
  for (;;) {
    const ssize_t got = ::recv(socket, chunk.data(), chunk.size(), MSG_DONTWAIT);
    if (got <= 0) break;
    all.insert(all.end(), chunk.begin(), chunk.begin() + got);
  }
  return all;
}

std::pair<vmm::unique_fd, vmm::unique_fd> socket_pair() {
  auto pair = ipc::make_socket_pair();
  ::fcntl(pair.second.get(), F_SETFL, O_NONBLOCK);
  return pair;
}

// The specs of memfds as large as the chunks of a manifest, `kind` each.
std::vector<std::uint8_t> memfds_for(const ipc::manifest& description, fd_kind kind = fd_kind::memfd) {
  std::vector<std::uint8_t> specs;
  for (const ipc::manifest_chunk& chunk : description.chunks)
    if (chunk.handle == vmm::handle_kind::posix_fd) specs.push_back(fd_spec(kind, chunk.size / page));
  return specs;
}

vmm::growable_buffer small_buffer(vmm::chunk_policy policy = vmm::chunk_policy::geometric()) {
  return vmm::growable_buffer(vmm::chunk_pool::create(vmm::make_os_host_provider({.granularity = page})),
                              {.max_size = 64 * page, .policy = policy});
}

// The payloads of the frames in a captured stream.
std::vector<bytes> payloads(const bytes& stream) {
  std::vector<bytes> result;
  for (std::size_t at = 0; at + sizeof(ipc::frame_header) <= stream.size();) {
    ipc::frame_header header{};
    std::memcpy(&header, stream.data() + at, sizeof(header));
    at += sizeof(header);
    result.emplace_back(stream.begin() + static_cast<std::ptrdiff_t>(at),
                        stream.begin() + static_cast<std::ptrdiff_t>(at + header.payload_size));
    at += header.payload_size;
  }
  return result;
}

// A buffer of `pages` one-page chunks, exported whole, and the messages send_manifest makes
// of it (the manifest, then continuations of at most max_fds_per_message fds each).
struct many_chunks {
  ipc::exported_manifest exported;
  bytes stream;  // the frames as captured
};
many_chunks export_many_chunks(ipc::exporter& exporter, std::size_t pages) {
  vmm::growable_buffer buffer(vmm::chunk_pool::create(vmm::make_os_host_provider({.granularity = page})),
                              {.max_size = pages * page, .policy = vmm::chunk_policy::fixed(page)});
  buffer.resize(pages * page);
  many_chunks result{exporter.export_buffer(buffer), {}};
  auto [sender, receiver] = socket_pair();
  ipc::send_manifest(sender.get(), result.exported);
  result.stream = drain(receiver.get());
  return result;
}

void manifest_seeds() {
  ipc::exporter exporter;
  vmm::growable_buffer buffer = small_buffer();
  write_seed("manifest", "empty-buffer", exporter.export_buffer(buffer).bytes);
  buffer.resize(3 * page);
  write_seed("manifest", "one-chunk", exporter.export_buffer(buffer).bytes);
  for (std::size_t size = 4 * page; size <= 40 * page; size += 5 * page) buffer.resize(size);
  const ipc::exported_manifest whole = exporter.export_buffer(buffer);
  write_seed("manifest", "geometric-chunks", whole.bytes);
  write_seed("manifest", "read-only-grant",
             exporter.export_buffer(buffer, {.grant = vmm::access_mode::read_only}).bytes);
  buffer.resize(60 * page);
  const ipc::exported_manifest growth = exporter.export_growth(buffer, whole.description);
  write_seed("manifest", "growth", growth.bytes);
  write_seed("manifest", "growth-up-to-date", exporter.export_growth(buffer, growth.description).bytes);
  const std::vector<vmm::shared_chunk> chunks = buffer.chunks(0, buffer.capacity());
  write_seed("manifest", "range",
             exporter.export_range(buffer, chunks[0]->size(), chunks[1]->size() + chunks[2]->size()).bytes);

  vmm::growable_buffer fixed = small_buffer(vmm::chunk_policy::fixed(page));
  fixed.resize(9 * page + 100);
  write_seed("manifest", "fixed-chunks", exporter.export_buffer(fixed).bytes);
  write_seed("manifest", "300-chunks", export_many_chunks(exporter, 300).exported.bytes);

  // GPU memory cannot be made here: a manifest as a GPU exporter would write it, through
  // the real serializer (a fabric chunk, then a posix-fd chunk).
  ipc::manifest gpu;
  gpu.where = vmm::location::device(1);
  gpu.buffer_id = 0x1234;
  gpu.granularity = std::size_t{2} << 20;
  gpu.max_size = std::size_t{64} << 20;
  gpu.end = gpu.size = std::size_t{6} << 20;
  ipc::manifest_chunk fabric{0, std::size_t{2} << 20, gpu.where, vmm::handle_kind::fabric, {}};
  for (std::size_t i = 0; i < fabric.fabric.bytes.size(); ++i)
    fabric.fabric.bytes[i] = static_cast<std::byte>(i + 1);
  gpu.chunks = {fabric,
                {std::size_t{2} << 20, std::size_t{4} << 20, gpu.where, vmm::handle_kind::posix_fd, {}}};
  write_seed("manifest", "gpu-fabric-and-fd", ipc::serialize(gpu));
}

// A frame as send_message writes it, captured from the socket.
bytes frame(std::span<const std::byte> payload, std::span<const int> fds = {}) {
  auto [sender, receiver] = socket_pair();
  ipc::send_message(sender.get(), payload, fds);
  return drain(receiver.get());
}

bytes script_input(std::uint8_t options, const std::vector<vmm::fuzz::segment>& parts) {
  bytes input;
  put_u8(input, options);
  for (const vmm::fuzz::segment& part : parts) vmm::fuzz::put_segment(input, part);
  return input;
}

void fd_channel_seeds() {
  vmm::fuzz::fd_stock stock;
  const int memfd = stock.make(fd_spec(fd_kind::memfd, 1));
  const int null = stock.make(fd_spec(fd_kind::dev_null));
  const int pipe = stock.make(fd_spec(fd_kind::pipe));
  const std::array<int, 3> three{memfd, null, pipe};
  const std::vector<std::uint8_t> three_specs{fd_spec(fd_kind::memfd, 1), fd_spec(fd_kind::dev_null),
                                              fd_spec(fd_kind::pipe)};

  write_seed("fd_channel", "empty-message", script_input(0, {{{}, frame({})}}));
  write_seed("fd_channel", "payload", script_input(0, {{{}, frame(text("hello, peer"))}}));
  write_seed("fd_channel", "three-fds", script_input(0, {{three_specs, frame(text("fds"), three)}}));
  write_seed("fd_channel", "three-fds-expected",
             script_input(0x83, {{three_specs, frame(text("fds"), three)}}));
  const int file = stock.make(fd_spec(fd_kind::read_only_file));
  write_seed("fd_channel", "read-only-file",
             script_input(0, {{{fd_spec(fd_kind::read_only_file)}, frame(text("file"), std::array{file})}}));

  // Three messages in a row, the second one split over two writes.
  const bytes second = frame(text("second, with one fd"), std::array{memfd});
  const auto half = static_cast<std::ptrdiff_t>(second.size() / 2);
  write_seed("fd_channel", "three-messages",
             script_input(0, {{{}, frame(text("first"))},
                              {{fd_spec(fd_kind::memfd, 2)}, bytes(second.begin(), second.begin() + half)},
                              {{}, bytes(second.begin() + half, second.end())},
                              {{}, frame(text("third"))}}));

  // A real manifest message with its chunks' fds.
  ipc::exporter exporter;
  vmm::growable_buffer buffer = small_buffer(vmm::chunk_policy::fixed(2 * page));
  buffer.resize(8 * page);
  const ipc::exported_manifest exported = exporter.export_buffer(buffer);
  std::vector<int> fds;
  for (const vmm::unique_fd& fd : exported.fds) fds.push_back(fd.get());
  write_seed("fd_channel", "manifest",
             script_input(0, {{memfds_for(exported.description), frame(exported.bytes, fds)}}));

  // A manifest of 300 chunks: 253 fds with the manifest, 47 with its continuation.
  const many_chunks many = export_many_chunks(exporter, 300);
  const std::vector<bytes> messages = payloads(many.stream);
  std::vector<vmm::fuzz::segment> parts;
  std::size_t sent = 0;
  for (const bytes& payload : messages) {
    const std::size_t count = std::min(many.exported.fds.size() - sent, ipc::max_fds_per_message);
    std::vector<int> batch;
    for (std::size_t i = sent; i < sent + count; ++i) batch.push_back(many.exported.fds[i].get());
    parts.push_back({std::vector<std::uint8_t>(count, fd_spec(fd_kind::memfd, 1)), frame(payload, batch)});
    sent += count;
  }
  write_seed("fd_channel", "manifest-with-continuation", script_input(0, parts));
}

void handoff_seeds() {
  // A producer and a consumer on two socket pairs, relayed by hand so that each side's bytes
  // are captured: what the producer sends is the consumer's input, and the other way round.
  auto [producer_end, producer_peer] = socket_pair();
  auto [consumer_end, consumer_peer] = socket_pair();
  bytes from_producer;
  bytes from_consumer;
  const auto relay = [&](int from, int to, bytes& captured) {
    const bytes got = drain(from);
    captured.insert(captured.end(), got.begin(), got.end());
    if (!got.empty() && ::write(to, got.data(), got.size()) != static_cast<ssize_t>(got.size()))
      throw vmm::os_error(errno, "relay write");
  };
  const auto provider = vmm::provider_for(vmm::location::os_host());
  ipc::handoff_producer producer(producer_end.get(), provider);
  relay(producer_peer.get(), consumer_peer.get(), from_producer);
  ipc::handoff_consumer consumer(consumer_end.get(), provider);
  for (int round = 0; round < 3; ++round) {
    producer.publish(vmm::stream_ref{});
    relay(producer_peer.get(), consumer_peer.get(), from_producer);
    consumer.acquire(vmm::stream_ref{});
    consumer.finish(vmm::stream_ref{});
    relay(consumer_peer.get(), producer_peer.get(), from_consumer);
    producer.wait_consumed(vmm::stream_ref{});
  }

  const auto input = [](std::uint8_t side, const bytes& stream, std::size_t piece) {
    std::vector<vmm::fuzz::segment> parts;
    for (std::size_t at = 0; at < stream.size(); at += piece)
      parts.push_back(
          {{},
           bytes(stream.begin() + static_cast<std::ptrdiff_t>(at),
                 stream.begin() + static_cast<std::ptrdiff_t>(std::min(stream.size(), at + piece)))});
    return script_input(side, parts);
  };
  write_seed("handoff", "consumer-three-rounds", input(0, from_producer, from_producer.size()));
  write_seed("handoff", "consumer-three-rounds-in-pieces", input(0, from_producer, 40));
  write_seed("handoff", "producer-three-rounds", input(1, from_consumer, from_consumer.size()));
  write_seed("handoff", "producer-three-rounds-in-pieces", input(1, from_consumer, 24));
}

// An import input: options, then one message per manifest with memfds of its chunks' sizes,
// sealed as vmm's exporter seals them unless `kind` says otherwise.
bytes import_input(std::uint8_t options, const std::vector<const ipc::exported_manifest*>& messages,
                   fd_kind kind = fd_kind::sealed_memfd) {
  bytes input;
  put_u8(input, options);
  for (const ipc::exported_manifest* exported : messages)
    vmm::fuzz::put_segment(input, {memfds_for(exported->description, kind), exported->bytes});
  return input;
}

void import_seeds() {
  ipc::exporter exporter;
  vmm::growable_buffer buffer = small_buffer();
  const ipc::exported_manifest empty = exporter.export_buffer(buffer);
  write_seed("import", "empty-buffer", import_input(0, {&empty}));
  buffer.resize(5 * page);
  const ipc::exported_manifest first = exporter.export_buffer(buffer);
  write_seed("import", "one-chunk", import_input(0, {&first}));
  write_seed("import", "one-unsealed-chunk", import_input(0, {&first}, fd_kind::memfd));
  write_seed("import", "peer-truncates-sealed-chunk", import_input(2, {&first}));
  write_seed("import", "one-write-sealed-chunk", import_input(0, {&first}, fd_kind::write_sealed_memfd));
  const ipc::exported_manifest read_only =
      exporter.export_buffer(buffer, {.grant = vmm::access_mode::read_only});
  write_seed("import", "read-only", import_input(1, {&read_only}));
  buffer.resize(20 * page);
  const ipc::exported_manifest growth = exporter.export_growth(buffer, first.description);
  buffer.resize(50 * page);
  const ipc::exported_manifest more = exporter.export_growth(buffer, growth.description);
  const ipc::exported_manifest none = exporter.export_growth(buffer, more.description);
  write_seed("import", "two-growths", import_input(0, {&first, &growth, &more, &none}));
  const ipc::exported_manifest from_empty = exporter.export_growth(buffer, empty.description);
  write_seed("import", "growth-of-empty", import_input(0, {&empty, &from_empty}));

  vmm::growable_buffer fixed = small_buffer(vmm::chunk_policy::fixed(page));
  fixed.resize(7 * page);
  const ipc::exported_manifest pages = exporter.export_buffer(fixed);
  write_seed("import", "seven-pages", import_input(0, {&pages}));

  // 300 one-page chunks: the manifest with 253 fds, then a continuation with 47.
  const many_chunks many = export_many_chunks(exporter, 300);
  bytes input;
  put_u8(input, 0);
  std::size_t sent = 0;
  for (const bytes& payload : payloads(many.stream)) {
    const std::size_t count = std::min(many.exported.fds.size() - sent, ipc::max_fds_per_message);
    vmm::fuzz::put_segment(input,
                           {std::vector<std::uint8_t>(count, fd_spec(fd_kind::sealed_memfd, 1)), payload});
    sent += count;
  }
  write_seed("import", "continuation", input);
}

// A stateful target's input, written as the target reads it.
class operations {
 public:
  explicit operations(std::uint8_t config) { put_u8(bytes_, config); }
  operations& op(std::uint8_t code) {
    put_u8(bytes_, code);
    return *this;
  }
  operations& u8(std::uint8_t value) { return op(value); }
  operations& u16(std::uint16_t value) {
    put_u16(bytes_, value);
    return *this;
  }
  [[nodiscard]] const bytes& get() const noexcept { return bytes_; }

 private:
  bytes bytes_;
};

void stateful_seeds() {
  // The operation codes of stateful_fuzz.cpp; sizes are written divided by 5.
  enum : std::uint8_t {
    resize,
    write,
    whole,
    growth,
    to_zero,
    release,
    shrink,
    reserve,
    purge,
    drop,
    range,
    renew
  };
  write_seed("stateful", "grow-export-grow-follow",
             operations(0)
                 .op(resize)
                 .u16(2000)
                 .op(write)
                 .u16(10)
                 .u16(5000)
                 .u8(7)
                 .op(whole)
                 .op(resize)
                 .u16(20000)
                 .op(write)
                 .u16(9000)
                 .u16(40000)
                 .u8(9)
                 .op(growth)
                 .op(range)
                 .u8(1)
                 .u8(1)
                 .op(resize)
                 .u16(40000)
                 .op(growth)
                 .get());
  write_seed("stateful", "shrink-and-reimport",
             operations(0x01 | (3 << 1))  // fixed chunks of 4 pages
                 .op(resize)
                 .u16(30000)
                 .op(whole)
                 .op(resize)
                 .u16(100)
                 .op(release)
                 .u8(1)
                 .op(resize)
                 .u16(30000)
                 .op(growth)
                 .op(whole)
                 .op(write)
                 .u16(0)
                 .u16(60000)
                 .u8(3)
                 .op(whole)
                 .get());
  write_seed("stateful", "fixed-chunks-read-only",
             operations(0x10 | 0x01 | (1 << 1))
                 .op(reserve)
                 .u16(12000)
                 .op(resize)
                 .u16(9000)
                 .op(whole)
                 .op(shrink)
                 .op(resize)
                 .u16(20000)
                 .op(growth)
                 .op(drop)
                 .op(growth)
                 .op(renew)
                 .op(whole)
                 .op(purge)
                 .op(range)
                 .u8(0)
                 .u8(2)
                 .get());
  write_seed("stateful", "past-max-size",
             operations(0).op(resize).u16(60000).op(whole).op(reserve).u16(65000).op(growth).get());
}

// tensor_table: a u32 extent, then a table encoded by the library (tensor_table_fuzz.cpp).
// store_message: requests that make, seal and read a tensor set (store_message_fuzz.cpp).
void tensor_set_seeds() {
  namespace store = vmm::store;
  std::vector<store::tensor_info> table = {
      {.name = "model.embed_tokens.weight", .type = store::dtype::bf16, .shape = {320, 40}},
      {.name = "model.layers.0.input_layernorm.weight", .type = store::dtype::f32, .shape = {40}},
      {.name = "lm_head.scale", .type = store::dtype::f8_e4m3, .shape = {}},
      {.name = "empty", .type = store::dtype::i64, .shape = {0, 7}}};
  const std::uint64_t extent = store::lay_out(table);
  const auto with_extent = [](std::uint64_t set_bytes, const bytes& body) {
    bytes out;
    put_u16(out, static_cast<std::uint16_t>(set_bytes));
    put_u16(out, static_cast<std::uint16_t>(set_bytes >> 16));
    vmm::fuzz::put_bytes(out, body);
    return out;
  };
  write_seed("tensor_table", "four-tensors", with_extent(extent, store::encode(table)));
  write_seed("tensor_table", "one-scalar", with_extent(8, store::encode(std::span(table).subspan(2, 1))));
  // One request frame (kind 0) per request.
  const auto script = [](const std::vector<store::request>& requests) {
    bytes out;
    for (const store::request& r : requests) {
      const bytes payload = store::encode(r);
      put_u8(out, 0);
      put_u16(out, static_cast<std::uint16_t>(payload.size()));
      vmm::fuzz::put_bytes(out, payload);
    }
    return out;
  };
  const std::uint64_t table_at = (extent + 7) / 8 * 8;
  const std::uint64_t table_bytes = store::encode(table).size();
  write_seed("store_message", "create-seal_set-get-tensors",
             script({{.op = store::operation::hello},
                     {.op = store::operation::create,
                      .name = "set",
                      .where = vmm::location::os_host(),
                      .size = table_at + table_bytes},
                     {.op = store::operation::seal_set,
                      .name = "set",
                      .table_offset = table_at,
                      .table_bytes = table_bytes},
                     {.op = store::operation::tensors, .entry = 1},
                     {.op = store::operation::list}}));
  // Two buffers of equal bytes (fresh memory: zeros) sealed with de-duplication share their
  // chunk; the first removed, the second is counted for it.
  write_seed(
      "store_message", "two-buffers-deduplicated",
      script({{.op = store::operation::hello},
              {.op = store::operation::create, .name = "a", .where = vmm::location::os_host(), .size = 4096},
              {.op = store::operation::seal, .name = "a", .deduplicate = true},
              {.op = store::operation::create, .name = "b", .where = vmm::location::os_host(), .size = 4096},
              {.op = store::operation::seal, .name = "b", .deduplicate = true},
              {.op = store::operation::remove, .name = "a"},
              {.op = store::operation::stat, .name = "b"},
              {.op = store::operation::statistics}}));
  // An offer of one granule (kind 2: one memfd attached), then a get of it; and an offer in
  // two frames (two memfds, then one), as a client does after a daemon restart.
  const auto offered = [&](const store::request& r, std::uint8_t memfds) {
    bytes out;
    const bytes payload = store::encode(r);
    put_u8(out, 2);
    put_u16(out, static_cast<std::uint16_t>(payload.size() + 1));
    put_u8(out, static_cast<std::uint8_t>(memfds - 1));
    vmm::fuzz::put_bytes(out, payload);
    return out;
  };
  constexpr std::uint64_t g = std::uint64_t{2} << 20;
  const store::request offer{.op = store::operation::offer,
                             .name = "offered",
                             .where = vmm::location::os_host(),
                             .size = g,
                             .entry = 3,
                             .generation = 9,
                             .origin = 0x5eed,
                             .chunk_total = 1,
                             .chunk_sizes = {g}};
  bytes one = script({{.op = store::operation::hello}});
  vmm::fuzz::put_bytes(one, offered(offer, 1));
  vmm::fuzz::put_bytes(
      one, script({{.op = store::operation::get, .name = "offered"}, {.op = store::operation::list}}));
  write_seed("store_message", "offer-then-get", one);
  store::request first = offer;
  first.name = "two-frames";
  first.chunk_total = 3;
  first.chunk_sizes = {g, g};
  bytes two = script({{.op = store::operation::hello}});
  vmm::fuzz::put_bytes(two, offered(first, 2));
  vmm::fuzz::put_bytes(two,
                       offered(store::request{.op = store::operation::offer_more, .chunk_sizes = {g}}, 1));
  vmm::fuzz::put_bytes(two, script({{.op = store::operation::stat, .name = "two-frames"}}));
  write_seed("store_message", "offer-in-two-frames", two);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  corpus_root = argv[1];
  try {
    vmm::fuzz::initialize();
    manifest_seeds();
    fd_channel_seeds();
    handoff_seeds();
    import_seeds();
    stateful_seeds();
    tensor_set_seeds();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "make_seeds: %s\n", error.what());
    return 1;
  }
  return 0;
}
