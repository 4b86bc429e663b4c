#include <vmm/store/protocol.hpp>
#include <vmm/ipc/manifest.hpp>
#include <vmm/store/tensors.hpp>

#include <vmm/error.hpp>

#include <fmt/format.h>

#include <limits>

#include "vmm/ipc/detail/little_endian.hpp"
#include "vmm/detail/enum_names.hpp"

namespace vmm::store {
namespace {

using ipc::protocol_error;
using ipc::detail::load;

// Appends little-endian fields.
class writer {
 public:
  template <class T>
  writer& put(T value) {
    const std::size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    ipc::detail::store<T>(bytes_, at, value);
    return *this;
  }
  writer& put_string(std::string_view text) {
    put<std::uint16_t>(static_cast<std::uint16_t>(text.size()));
    for (const char c : text) bytes_.push_back(static_cast<std::byte>(c));
    return *this;
  }
  writer& put_bytes(std::span<const std::byte> more) {
    bytes_.insert(bytes_.end(), more.begin(), more.end());
    return *this;
  }
  [[nodiscard]] std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

// Reads little-endian fields, throwing protocol_error past the end.
class reader {
 public:
  reader(std::span<const std::byte> bytes, const char* what) : bytes_(bytes), what_(what) {}
  template <class T>
  T get() {
    need(sizeof(T));
    const T value = load<T>(bytes_, at_);
    at_ += sizeof(T);
    return value;
  }
  std::string get_string(std::size_t limit) {
    const std::size_t length = get<std::uint16_t>();
    if (length > limit)
      throw protocol_error(
          fmt::format("vmm-store {}: a string of {} bytes (at most {})", what_, length, limit));
    need(length);
    std::string text(reinterpret_cast<const char*>(bytes_.data() + at_), length);
    at_ += length;
    return text;
  }
  // A u8 that must be 0 or 1.
  bool get_flag(const char* name) {
    const auto flag = get<std::uint8_t>();
    if (flag > 1) throw protocol_error(fmt::format("vmm-store {}: {} flag neither 0 nor 1", what_, name));
    return flag == 1;
  }
  void zeros(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      if (get<std::uint8_t>() != 0)
        throw protocol_error(fmt::format("vmm-store {}: a reserved byte is not 0", what_));
  }
  void finish() const {
    if (at_ != bytes_.size())
      throw protocol_error(
          fmt::format("vmm-store {}: {} bytes after the last field", what_, bytes_.size() - at_));
  }
  [[nodiscard]] std::span<const std::byte> rest() const { return bytes_.subspan(at_); }

 private:
  void need(std::size_t n) const {
    if (bytes_.size() - at_ < n)
      throw protocol_error(fmt::format("vmm-store {}: truncated ({} bytes, {} more needed at byte {})", what_,
                                       bytes_.size(), n, at_));
  }
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
  const char* what_;
};

bool takes_name(operation op) {
  switch (op) {
    case operation::create:
    case operation::seal:
    case operation::get:
    case operation::grow:
    case operation::grant:
    case operation::stat:
    case operation::remove:
    case operation::seal_set:
    case operation::offer:
      return true;
    default:
      return false;
  }
}

std::uint8_t access_byte(access_mode mode) {
  switch (mode) {
    case access_mode::read_only:
      return 1;
    case access_mode::read_write:
      return 2;
    case access_mode::none:
      break;
  }
  throw invalid_argument("vmm-store: a get asks for read_only or read_write access, not none");
}

// A location, with `flag` in the byte after the kind (create's and offer's; 0 otherwise).
void put_location(writer& out, const location& where, bool flag = false) {
  out.put<std::uint8_t>(static_cast<std::uint8_t>(where.kind))
      .put<std::uint8_t>(flag ? 1 : 0)
      .put<std::uint16_t>(0);
  out.put<std::int32_t>(where.id);
}

// A location; `flag` takes the byte after the kind (create's and offer's flag, named
// `flag_name`), which is otherwise 0.
location get_location(reader& in, const char* what, bool* flag = nullptr,
                      const char* flag_name = "one chunk") {
  const std::uint8_t kind = in.get<std::uint8_t>();
  if (flag != nullptr) {
    *flag = in.get_flag(flag_name);
    in.zeros(2);
  } else {
    in.zeros(3);
  }
  const std::int32_t id = in.get<std::int32_t>();
  if (kind > static_cast<std::uint8_t>(memory_kind::os_host))
    throw protocol_error(fmt::format("vmm-store {}: unknown location kind {}", what, kind));
  if (id < 0) throw protocol_error(fmt::format("vmm-store {}: negative location id {}", what, id));
  return location{static_cast<memory_kind>(kind), id};
}

// seal's and seal_set's flags (bit 0: de-duplicate) and 7 bytes 0.
void put_seal_flags(writer& out, bool deduplicate) {
  out.put<std::uint8_t>(deduplicate ? 1 : 0);
  for (int i = 0; i < 7; ++i) out.put<std::uint8_t>(0);
}

bool get_seal_flags(reader& in) {
  const bool deduplicate = in.get_flag("de-duplicate");
  in.zeros(7);
  return deduplicate;
}

}  // namespace

const char* to_string(status code) noexcept {
  static constexpr vmm::detail::enum_name<status> names[] = {
      {status::ok, "ok"},
      {status::bad_request, "bad request"},
      {status::unsupported_version, "unsupported protocol version"},
      {status::not_found, "not found"},
      {status::exists, "name taken"},
      {status::denied, "denied"},
      {status::cap_exceeded, "cap exceeded"},
      {status::sealed, "sealed"},
      {status::out_of_memory, "out of memory"},
      {status::invalid, "invalid"},
      {status::unavailable, "unavailable"},
      {status::internal, "internal error"},
  };
  return vmm::detail::name_of(code, names, "unknown status");
}

bool valid_name(std::string_view name, std::string* why) {
  const auto refuse = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  if (name.empty()) return refuse("a name is 1 byte at least");
  if (name.size() > max_name_bytes)
    return refuse(fmt::format("a name is {} bytes at most, not {}", max_name_bytes, name.size()));
  for (std::size_t i = 0; i < name.size();) {
    const auto lead = static_cast<unsigned char>(name[i]);
    std::size_t length = 0;
    std::uint32_t code = 0;
    if (lead < 0x80) {
      length = 1;
      code = lead;
    } else if ((lead & 0xe0) == 0xc0) {
      length = 2;
      code = lead & 0x1fu;
    } else if ((lead & 0xf0) == 0xe0) {
      length = 3;
      code = lead & 0x0fu;
    } else if ((lead & 0xf8) == 0xf0) {
      length = 4;
      code = lead & 0x07u;
    } else {
      return refuse(fmt::format("byte {} of the name ({:#04x}) does not start a UTF-8 character", i, lead));
    }
    if (name.size() - i < length)
      return refuse(fmt::format("the name ends inside a UTF-8 character at byte {}", i));
    for (std::size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(name[i + k]);
      if ((next & 0xc0) != 0x80)
        return refuse(fmt::format("byte {} of the name is not a UTF-8 continuation", i + k));
      code = (code << 6) | (next & 0x3fu);
    }
    constexpr std::uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < smallest[length]) return refuse(fmt::format("an overlong UTF-8 form at byte {}", i));
    if (code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))
      return refuse(fmt::format("code point U+{:X} at byte {} is not a character", code, i));
    if (code < 0x20 || code == 0x7f) return refuse(fmt::format("a control character at byte {}", i));
    i += length;
  }
  return true;
}

std::vector<std::byte> encode(const request& message) {
  writer out;
  out.put<std::uint32_t>(request_magic).put<std::uint16_t>(protocol_version);
  out.put<std::uint16_t>(static_cast<std::uint16_t>(message.op));
  if (std::string why; takes_name(message.op) && !valid_name(message.name, &why))
    throw invalid_argument(fmt::format("vmm-store: invalid name: {}", why));
  switch (message.op) {
    case operation::create:
      if (message.where.id < 0) throw invalid_argument("vmm-store: a negative location id");
      put_location(out, message.where, message.one_chunk);
      out.put<std::uint64_t>(message.size).put<std::uint64_t>(message.max_size);
      break;
    case operation::get:
      out.put<std::uint8_t>(access_byte(message.access));
      for (int i = 0; i < 7; ++i) out.put<std::uint8_t>(0);
      out.put<std::uint64_t>(message.entry)
          .put<std::uint64_t>(message.generation)
          .put<std::uint64_t>(message.end);
      break;
    case operation::refresh:
      out.put<std::uint64_t>(message.entry)
          .put<std::uint64_t>(message.generation)
          .put<std::uint64_t>(message.end);
      break;
    case operation::release:
    case operation::hold:
      out.put<std::uint64_t>(message.entry);
      break;
    case operation::grow:
      out.put<std::uint64_t>(message.size);
      break;
    case operation::grant:
      out.put<std::uint32_t>(message.pid);
      break;
    case operation::seal:
      put_seal_flags(out, message.deduplicate);
      break;
    case operation::seal_set:
      put_seal_flags(out, message.deduplicate);
      out.put<std::uint64_t>(message.table_offset).put<std::uint64_t>(message.table_bytes);
      break;
    case operation::tensors:
      out.put<std::uint64_t>(message.entry);
      break;
    case operation::offer:
      if (message.where.id < 0) throw invalid_argument("vmm-store: a negative location id");
      put_location(out, message.where, message.tensor_set);
      out.put<std::uint64_t>(message.size)
          .put<std::uint64_t>(message.origin)
          .put<std::uint64_t>(message.entry)
          .put<std::uint64_t>(message.generation)
          .put<std::uint64_t>(message.table_offset)
          .put<std::uint64_t>(message.table_bytes)
          .put<std::uint32_t>(message.chunk_total);
      [[fallthrough]];
    case operation::offer_more:
      if (message.chunk_sizes.size() > max_offer_chunks)
        throw invalid_argument(fmt::format("vmm-store: {} chunks in one offer frame (at most {})",
                                           message.chunk_sizes.size(), max_offer_chunks));
      out.put<std::uint32_t>(static_cast<std::uint32_t>(message.chunk_sizes.size()));
      break;
    default:
      break;
  }
  if (takes_name(message.op)) out.put_string(message.name);
  if (message.op == operation::offer || message.op == operation::offer_more)
    for (const std::uint64_t size : message.chunk_sizes) out.put<std::uint64_t>(size);
  return out.take();
}

request decode_request(std::span<const std::byte> bytes) {
  if (bytes.size() > max_request_bytes)
    throw protocol_error(
        fmt::format("vmm-store request: {} bytes (at most {})", bytes.size(), max_request_bytes));
  reader in(bytes, "request");
  if (const auto magic = in.get<std::uint32_t>(); magic != request_magic)
    throw protocol_error(
        fmt::format("vmm-store request: bad magic {:#010x} (expected {:#010x})", magic, request_magic));
  if (const auto version = in.get<std::uint16_t>(); version != protocol_version)
    throw unsupported_version_error(fmt::format(
        "vmm-store request: protocol version {}; this daemon speaks {}", version, protocol_version));
  request message;
  const auto op = in.get<std::uint16_t>();
  if (op < static_cast<std::uint16_t>(operation::hello) ||
      op > static_cast<std::uint16_t>(operation::offer_more))
    throw protocol_error(fmt::format("vmm-store request: unknown operation {}", op));
  message.op = static_cast<operation>(op);
  switch (message.op) {
    case operation::create:
      message.where = get_location(in, "create", &message.one_chunk);
      message.size = in.get<std::uint64_t>();
      message.max_size = in.get<std::uint64_t>();
      break;
    case operation::get: {
      const std::uint8_t access = in.get<std::uint8_t>();
      if (access != 1 && access != 2)
        throw protocol_error(fmt::format("vmm-store get: access {} (1 or 2)", access));
      message.access = access == 1 ? access_mode::read_only : access_mode::read_write;
      in.zeros(7);
      message.entry = in.get<std::uint64_t>();
      message.generation = in.get<std::uint64_t>();
      message.end = in.get<std::uint64_t>();
      break;
    }
    case operation::refresh:
      message.entry = in.get<std::uint64_t>();
      message.generation = in.get<std::uint64_t>();
      message.end = in.get<std::uint64_t>();
      break;
    case operation::release:
    case operation::hold:
      message.entry = in.get<std::uint64_t>();
      break;
    case operation::grow:
      message.size = in.get<std::uint64_t>();
      break;
    case operation::grant:
      message.pid = in.get<std::uint32_t>();
      break;
    case operation::seal:
      message.deduplicate = get_seal_flags(in);
      break;
    case operation::seal_set:
      message.deduplicate = get_seal_flags(in);
      message.table_offset = in.get<std::uint64_t>();
      message.table_bytes = in.get<std::uint64_t>();
      if (message.table_bytes > max_table_bytes)
        throw protocol_error(fmt::format("vmm-store seal_set: a table of {} bytes (at most {})",
                                         message.table_bytes, max_table_bytes));
      break;
    case operation::tensors:
      message.entry = in.get<std::uint64_t>();
      break;
    case operation::offer: {
      message.where = get_location(in, "offer", &message.tensor_set, "tensor set");
      message.size = in.get<std::uint64_t>();
      message.origin = in.get<std::uint64_t>();
      message.entry = in.get<std::uint64_t>();
      message.generation = in.get<std::uint64_t>();
      message.table_offset = in.get<std::uint64_t>();
      message.table_bytes = in.get<std::uint64_t>();
      message.chunk_total = in.get<std::uint32_t>();
      if (message.table_bytes > max_table_bytes)
        throw protocol_error(fmt::format("vmm-store offer: a table of {} bytes (at most {})",
                                         message.table_bytes, max_table_bytes));
      if (message.chunk_total == 0 || message.chunk_total > ipc::max_manifest_chunks)
        throw protocol_error(fmt::format("vmm-store offer: {} chunks (1 to {})", message.chunk_total,
                                         ipc::max_manifest_chunks));
    }
      [[fallthrough]];
    case operation::offer_more: {
      const std::uint32_t chunks = in.get<std::uint32_t>();  // checked before anything is allocated
      if (chunks > max_offer_chunks)
        throw protocol_error(
            fmt::format("vmm-store offer: {} chunks in one frame (at most {})", chunks, max_offer_chunks));
      message.chunk_sizes.resize(chunks);
      break;
    }
    default:
      break;
  }
  if (takes_name(message.op)) {
    message.name = in.get_string(max_name_bytes);
    if (std::string why; !valid_name(message.name, &why))
      throw protocol_error(fmt::format("vmm-store request: invalid name: {}", why));
  }
  for (std::uint64_t& size : message.chunk_sizes) size = in.get<std::uint64_t>();
  in.finish();
  return message;
}

std::vector<std::byte> encode_ok(std::span<const std::byte> body) {
  writer out;
  out.put<std::uint32_t>(reply_magic).put<std::uint16_t>(protocol_version).put<std::uint16_t>(0);
  return out.put_bytes(body).take();
}

std::vector<std::byte> encode_error(status code, std::string_view message) {
  writer out;
  out.put<std::uint32_t>(reply_magic).put<std::uint16_t>(protocol_version);
  out.put<std::uint16_t>(static_cast<std::uint16_t>(code));
  return out.put_string(message.substr(0, max_error_bytes)).take();
}

std::vector<std::byte> encode(const buffer_info& info) {
  writer out;
  out.put_string(info.name).put<std::uint64_t>(info.entry);
  put_location(out, info.where);
  out.put<std::uint64_t>(info.size).put<std::uint64_t>(info.capacity).put<std::uint64_t>(info.max_size);
  out.put<std::uint32_t>(info.holders).put<std::uint8_t>(info.sealed ? 1 : 0);
  out.put<std::uint32_t>(info.tensors).put<std::uint64_t>(info.named_bytes);
  out.put<std::uint64_t>(info.stored_bytes).put<std::uint64_t>(info.shared_bytes);
  return out.take();
}

std::vector<std::byte> encode(const std::vector<buffer_info>& infos) {
  writer out;
  out.put<std::uint32_t>(static_cast<std::uint32_t>(infos.size()));
  for (const buffer_info& info : infos) out.put_bytes(encode(info));
  return out.take();
}

std::vector<std::byte> encode(const daemon_info& info) {
  writer out;
  out.put<std::uint64_t>(info.instance).put<std::uint64_t>(info.started_ns).put<std::uint32_t>(info.pid);
  return out.put<std::uint16_t>(info.version).put<std::uint32_t>(info.version_slots).take();
}

std::vector<std::byte> encode(const hold_reply& reply) {
  writer out;
  out.put<std::uint64_t>(reply.entry).put<std::uint64_t>(reply.size);
  return out.put<std::uint8_t>(static_cast<std::uint8_t>(reply.sent))
      .put<std::uint8_t>(reply.sealed ? 1 : 0)
      .put<std::uint32_t>(reply.slot)
      .put<std::uint64_t>(reply.version)
      .take();
}

std::vector<std::byte> encode(const daemon_statistics& c) {
  writer out;
  for (const std::uint64_t value : {c.connections, c.entries, c.named_entries, c.holds, c.bytes, c.capacity,
                                    c.pool_used, c.pool_reserved, c.cached_exports, c.open_fds})
    out.put<std::uint64_t>(value);
  return out.take();
}

reply decode_reply(std::span<const std::byte> bytes) {
  reader in(bytes, "reply");
  if (const auto magic = in.get<std::uint32_t>(); magic != reply_magic)
    throw protocol_error(
        fmt::format("vmm-store reply: bad magic {:#010x} (expected {:#010x})", magic, reply_magic));
  if (const auto version = in.get<std::uint16_t>(); version != protocol_version)
    throw protocol_error(fmt::format("vmm-store reply: protocol version {}; this client speaks {}", version,
                                     protocol_version));
  const auto code = in.get<std::uint16_t>();
  if (code > static_cast<std::uint16_t>(status::internal))
    throw protocol_error(fmt::format("vmm-store reply: unknown status {}", code));
  reply result;
  result.code = static_cast<status>(code);
  if (result.code != status::ok) {
    result.message = in.get_string(max_error_bytes);
    in.finish();
  } else {
    const auto rest = in.rest();
    result.body.assign(rest.begin(), rest.end());
  }
  return result;
}

namespace {
buffer_info read_info(reader& in) {
  buffer_info info;
  info.name = in.get_string(max_name_bytes);
  if (std::string why; !valid_name(info.name, &why))
    throw protocol_error(fmt::format("vmm-store reply: invalid name: {}", why));
  info.entry = in.get<std::uint64_t>();
  info.where = get_location(in, "reply");
  info.size = in.get<std::uint64_t>();
  info.capacity = in.get<std::uint64_t>();
  info.max_size = in.get<std::uint64_t>();
  info.holders = in.get<std::uint32_t>();
  info.sealed = in.get_flag("sealed");
  info.tensors = in.get<std::uint32_t>();
  info.named_bytes = in.get<std::uint64_t>();
  info.stored_bytes = in.get<std::uint64_t>();
  info.shared_bytes = in.get<std::uint64_t>();
  return info;
}
}  // namespace

buffer_info decode_buffer_info(std::span<const std::byte> body) {
  reader in(body, "stat reply");
  buffer_info info = read_info(in);
  in.finish();
  return info;
}

std::vector<buffer_info> decode_buffer_infos(std::span<const std::byte> body) {
  reader in(body, "list reply");
  const std::uint32_t count = in.get<std::uint32_t>();
  // Each entry takes at least 76 bytes: a count past what the body can hold is a lie.
  if (count > body.size() / 76)
    throw protocol_error(fmt::format("vmm-store list reply: {} entries in {} bytes", count, body.size()));
  std::vector<buffer_info> infos;
  infos.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) infos.push_back(read_info(in));
  in.finish();
  return infos;
}

daemon_info decode_daemon_info(std::span<const std::byte> body) {
  reader in(body, "hello reply");
  daemon_info info;
  info.instance = in.get<std::uint64_t>();
  info.started_ns = in.get<std::uint64_t>();
  info.pid = in.get<std::uint32_t>();
  info.version = in.get<std::uint16_t>();
  info.version_slots = in.get<std::uint32_t>();
  in.finish();
  return info;
}

hold_reply decode_hold_reply(std::span<const std::byte> body) {
  reader in(body, "hold reply");
  hold_reply reply;
  reply.entry = in.get<std::uint64_t>();
  reply.size = in.get<std::uint64_t>();
  const auto sent = in.get<std::uint8_t>();
  if (sent > 2) throw protocol_error(fmt::format("vmm-store hold reply: unknown delivery {}", sent));
  reply.sent = static_cast<delivery>(sent);
  reply.sealed = in.get_flag("sealed");
  reply.slot = in.get<std::uint32_t>();
  reply.version = in.get<std::uint64_t>();
  in.finish();
  return reply;
}

std::vector<std::byte> encode(std::span<const tensor_info> table) {
  writer out;
  out.put<std::uint32_t>(static_cast<std::uint32_t>(table.size()));
  for (const tensor_info& t : table) {
    out.put_string(t.name).put<std::uint8_t>(static_cast<std::uint8_t>(t.type));
    out.put<std::uint8_t>(static_cast<std::uint8_t>(t.shape.size()));
    for (int i = 0; i < 6; ++i) out.put<std::uint8_t>(0);
    out.put<std::uint64_t>(t.offset).put<std::uint64_t>(t.bytes);
    for (const std::uint64_t extent : t.shape) out.put<std::uint64_t>(extent);
  }
  return out.take();
}

std::vector<tensor_info> decode_tensor_table(std::span<const std::byte> bytes, std::uint64_t extent) {
  if (bytes.size() > max_table_bytes)
    throw protocol_error(
        fmt::format("vmm-store tensor table: {} bytes (at most {})", bytes.size(), max_table_bytes));
  reader in(bytes, "tensor table");
  const std::uint32_t count = in.get<std::uint32_t>();
  // Each tensor takes at least 27 bytes: a count past what the bytes can hold is a lie.
  if (count > max_tensors || count > bytes.size() / 27)
    throw protocol_error(fmt::format("vmm-store tensor table: {} tensors in {} bytes", count, bytes.size()));
  std::vector<tensor_info> table(count);
  for (tensor_info& t : table) {
    t.name = in.get_string(max_name_bytes);
    const auto type = in.get<std::uint8_t>();
    if (element_bytes(static_cast<dtype>(type)) == 0)
      throw protocol_error(
          fmt::format("vmm-store tensor table: tensor \"{}\" has unknown dtype {}", t.name, type));
    t.type = static_cast<dtype>(type);
    const auto rank = in.get<std::uint8_t>();
    if (rank > max_rank)
      throw protocol_error(fmt::format("vmm-store tensor table: tensor \"{}\" has {} dimensions (at most {})",
                                       t.name, rank, max_rank));
    in.zeros(6);
    t.offset = in.get<std::uint64_t>();
    t.bytes = in.get<std::uint64_t>();
    t.shape.resize(rank);
    for (std::uint64_t& dimension : t.shape) dimension = in.get<std::uint64_t>();
  }
  in.finish();
  if (const auto problem = tensor_table_problem(table, extent))
    throw protocol_error(fmt::format("vmm-store tensor table: {}", *problem));
  return table;
}

daemon_statistics decode_daemon_statistics(std::span<const std::byte> body) {
  reader in(body, "statistics reply");
  daemon_statistics c;
  for (std::uint64_t* field : {&c.connections, &c.entries, &c.named_entries, &c.holds, &c.bytes, &c.capacity,
                               &c.pool_used, &c.pool_reserved, &c.cached_exports, &c.open_fds})
    *field = in.get<std::uint64_t>();
  in.finish();
  return c;
}

}  // namespace vmm::store
