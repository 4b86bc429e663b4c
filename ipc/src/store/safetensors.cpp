#include <vmm/store/safetensors.hpp>

#include <vmm/error.hpp>
#include <vmm/growable_buffer.hpp>
#include <vmm/provider.hpp>
#include <vmm/stream_executor.hpp>
#include <vmm/unique_fd.hpp>
#include <vmm/store/protocol.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>
#include <set>

namespace vmm::store {
namespace {

using json = nlohmann::json;

[[noreturn]] void refuse(const std::string& why) {
  throw invalid_argument(fmt::format("safetensors header: {}", why));
}

// The kinds of JSON value, as a message says them.
const char* kind_of(const json& value) {
  return value.type_name();
}

std::uint64_t unsigned_of(const json& value, const std::string& tensor, const char* what) {
  if (!value.is_number_unsigned())
    refuse(fmt::format("tensor \"{}\": {} holds {} {}, not a non-negative integer", tensor, what,
                       kind_of(value), value.dump()));
  return value.get<std::uint64_t>();
}

tensor_info parse_tensor(const std::string& name, const json& entry, std::uint64_t data_bytes,
                         std::uint64_t& begin) {
  if (std::string why; !valid_name(name, &why)) refuse(fmt::format("a tensor's name is invalid: {}", why));
  if (!entry.is_object())
    refuse(fmt::format("tensor \"{}\" is a JSON {}, not an object", name, kind_of(entry)));
  for (const auto& [key, value] : entry.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      refuse(fmt::format("tensor \"{}\" has an unknown key \"{}\" (dtype, shape, data_offsets)", name, key));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key)) refuse(fmt::format("tensor \"{}\" has no \"{}\"", name, key));
  tensor_info t;
  t.name = name;
  const json& type = entry["dtype"];
  if (!type.is_string())
    refuse(fmt::format("tensor \"{}\": dtype is a JSON {}, not a string", name, kind_of(type)));
  const auto found = dtype_from_name(type.get_ref<const std::string&>());
  if (!found) refuse(fmt::format("tensor \"{}\" has unknown dtype {}", name, type.dump()));
  t.type = *found;
  const json& shape = entry["shape"];
  if (!shape.is_array())
    refuse(fmt::format("tensor \"{}\": shape is a JSON {}, not an array", name, kind_of(shape)));
  if (shape.size() > max_rank)
    refuse(fmt::format("tensor \"{}\" has {} dimensions (at most {})", name, shape.size(), max_rank));
  for (const json& extent : shape) t.shape.push_back(unsigned_of(extent, name, "shape"));
  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    refuse(fmt::format("tensor \"{}\": data_offsets is {}, not [begin, end]", name, offsets.dump()));
  begin = unsigned_of(offsets[0], name, "data_offsets");
  const std::uint64_t end = unsigned_of(offsets[1], name, "data_offsets");
  if (begin > end)
    refuse(fmt::format("tensor \"{}\": data_offsets [{}, {}] end before they begin", name, begin, end));
  if (end > data_bytes)
    refuse(fmt::format("tensor \"{}\": data_offsets [{}, {}] are outside the data ({} bytes)", name, begin,
                       end, data_bytes));
  const auto bytes = tensor_bytes(t.type, t.shape);
  if (!bytes || *bytes != end - begin)
    refuse(fmt::format("tensor \"{}\": data_offsets [{}, {}] hold {} bytes; dtype {} and shape [{}] make {}",
                       name, begin, end, end - begin, to_string(t.type), fmt::join(t.shape, ", "),
                       bytes ? fmt::to_string(*bytes) : std::string("more than 2^64")));
  t.offset = begin;
  t.bytes = *bytes;
  return t;
}

// Duplicate keys, which nlohmann-json would merge silently, and nesting deeper than a header
// has: refused while parsing.
class strict_keys {
 public:
  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    if (depth > 3) refuse("the JSON nests deeper than a header does");
    switch (event) {
      case json::parse_event_t::object_start:
        open_.emplace_back();
        break;
      case json::parse_event_t::object_end:
        open_.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_.back().insert(parsed.get<std::string>()).second)
          refuse(fmt::format("the key {} appears twice in one object", parsed.dump()));
        break;
      default:
        break;
    }
    return true;
  }

 private:
  std::vector<std::set<std::string>> open_;
};

// pread of exactly `n` bytes at `offset`.
void read_exactly(int fd, void* into, std::size_t n, std::uint64_t offset, const std::string& path) {
  auto* bytes = static_cast<char*>(into);
  while (n != 0) {
    const ssize_t got = ::pread(fd, bytes, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw os_error(errno, fmt::format("safetensors {}: read at byte {}", path, offset));
    if (got == 0)
      throw os_error(
          EIO, fmt::format("safetensors {}: the file ends at byte {}, before its data do", path, offset));
    bytes += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<std::uint64_t>(got);
  }
}

struct open_file {
  unique_fd fd;
  std::uint64_t size = 0;
};

open_file open_for_reading(const std::string& path) {
  open_file file{unique_fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), 0};
  if (!file.fd) throw os_error(errno, fmt::format("safetensors {}: open", path));
  struct stat status {};
  if (::fstat(file.fd.get(), &status) != 0) throw os_error(errno, fmt::format("safetensors {}: fstat", path));
  if (!S_ISREG(status.st_mode))
    throw invalid_argument(fmt::format("safetensors {}: not a regular file", path));
  file.size = static_cast<std::uint64_t>(status.st_size);
  return file;
}

safetensors_header read_header(const open_file& file, const std::string& path) {
  try {
    if (file.size < 8)
      refuse(fmt::format("the file has {} bytes; it starts with an 8-byte header length", file.size));
    std::array<std::byte, 8> length_bytes{};
    read_exactly(file.fd.get(), length_bytes.data(), 8, 0, path);
    std::uint64_t length = 0;
    for (std::size_t i = 0; i < 8; ++i)
      length |= std::uint64_t{std::to_integer<std::uint8_t>(length_bytes[i])} << (8 * i);
    if (length > max_safetensors_header_bytes)
      refuse(fmt::format("header length {} is past the limit of {} bytes", length,
                         max_safetensors_header_bytes));
    if (length > file.size - 8)
      refuse(fmt::format("header length {} is past the file's end ({} bytes)", length, file.size));
    std::vector<std::byte> header(length);
    read_exactly(file.fd.get(), header.data(), header.size(), 8, path);
    return parse_safetensors_header(header, file.size - 8 - length);
  } catch (const invalid_argument& error) {
    throw invalid_argument(fmt::format("{}: {}", path, error.what()));
  }
}

// `n` bytes of tensor `tensor`, from its byte `at`: what one read moves.
struct piece {
  std::size_t tensor = 0;
  std::uint64_t at = 0;
  std::size_t n = 0;
};

std::vector<piece> pieces_of(const safetensors_header& header, std::size_t chunk) {
  std::vector<piece> pieces;
  for (std::size_t i = 0; i < header.tensors.size(); ++i)
    for (std::uint64_t at = 0; at < header.tensors[i].bytes; at += chunk)
      pieces.push_back(
          {i, at, static_cast<std::size_t>(std::min<std::uint64_t>(chunk, header.tensors[i].bytes - at))});
  return pieces;
}

// What one reading thread of a load owns: for a set off the host, its stream and two pinned
// staging buffers, each reused once the copy out of it is done.
class reader_lane {
 public:
  reader_lane(stream_executor& executor, std::size_t staging_bytes)
      : executor_(&executor), staged_(staging_bytes != 0) {
    if (!staged_) return;
    stream_ = owned_stream(executor);
    for (std::size_t k = 0; k < copied_.size(); ++k) {
      staging_.emplace_back(location::pinned_host(0), growable_buffer_options{.max_size = staging_bytes});
      staging_.back().resize(staging_bytes);
      copied_[k] = stream_event(executor, stream_.get());
    }
  }
  reader_lane(const reader_lane&) = delete;
  reader_lane& operator=(const reader_lane&) = delete;
  ~reader_lane() { drain(); }

  // Reads `n` bytes at `offset` into the next staging buffer and queues their copy.
  void read_and_copy(int fd, std::byte* destination, std::size_t n, std::uint64_t offset,
                     const std::string& path) {
    copied_[turn_].synchronize();
    read_exactly(fd, staging_[turn_].data(), n, offset, path);
    executor_->copy(destination, staging_[turn_].data(), n, stream_.get());
    copied_[turn_].record_again(stream_.get());
    turn_ ^= 1;
  }
  // Waits for the copies queued. @throws vmm::driver_error a copy failed.
  void finish() {
    if (staged_) executor_->synchronize(stream_.get());
  }
  // finish(), for the paths that fail anyway. Never throws.
  void drain() noexcept {
    try {
      finish();
    } catch (const std::exception&) {
      // The copies failed as well: nothing is in flight.
    }
  }

 private:
  stream_executor* executor_;
  bool staged_;
  owned_stream stream_;
  std::vector<growable_buffer> staging_;  // two, or none for a set in host memory
  std::array<stream_event, 2> copied_;
  std::size_t turn_ = 0;
};

}  // namespace

safetensors_header parse_safetensors_header(std::span<const std::byte> bytes, std::uint64_t data_bytes) {
  const auto* text = reinterpret_cast<const char*>(bytes.data());
  json parsed;
  try {
    parsed = json::parse(text, text + bytes.size(), strict_keys{});
  } catch (const json::exception& error) {
    refuse(fmt::format("not JSON: {}", error.what()));
  }
  if (!parsed.is_object()) refuse(fmt::format("a JSON {}, not an object", kind_of(parsed)));
  safetensors_header header;
  header.data_start = 8 + bytes.size();
  std::vector<std::pair<std::uint64_t, tensor_info>> found;
  for (const auto& [key, value] : parsed.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) refuse(fmt::format("__metadata__ is a JSON {}, not an object", kind_of(value)));
      for (const auto& [field, text_value] : value.items()) {
        if (!text_value.is_string())
          refuse(fmt::format("__metadata__ \"{}\" is a JSON {}, not a string", field, kind_of(text_value)));
        header.metadata.emplace_back(field, text_value.get<std::string>());
      }
      continue;
    }
    std::uint64_t begin = 0;
    tensor_info t = parse_tensor(key, value, data_bytes, begin);
    found.emplace_back(begin, std::move(t));
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.bytes < b.second.bytes;
  });
  // Each non-empty tensor against the non-empty one before it that ends last.
  const tensor_info* before = nullptr;
  for (const auto& [begin, after] : found) {
    if (after.bytes == 0) continue;
    if (before != nullptr && before->offset + before->bytes > after.offset)
      refuse(fmt::format("tensors \"{}\" and \"{}\" overlap (data bytes [{}, {}) and [{}, {}))", before->name,
                         after.name, before->offset, before->offset + before->bytes, after.offset,
                         after.offset + after.bytes));
    if (before == nullptr || after.offset + after.bytes > before->offset + before->bytes) before = &after;
  }
  for (auto& [begin, t] : found) header.tensors.push_back(std::move(t));
  return header;
}

// One read of the page cache moves a few GB/s, a fraction of a host-to-device copy's
// bandwidth: readers in parallel make up the difference, up to the cores there are.
std::size_t default_safetensors_readers() noexcept {
  return std::clamp<std::size_t>(std::thread::hardware_concurrency() / 2, 1, 8);
}

safetensors_header read_safetensors_header(const std::string& path) {
  return read_header(open_for_reading(path), path);
}

tensor_set load_safetensors(client& store, const std::string& path, std::string_view name,
                            const load_options& options) {
  if (options.chunk_bytes == 0) throw invalid_argument("safetensors: a chunk of 0 bytes");
  if (options.readers > max_safetensors_readers)
    throw invalid_argument(
        fmt::format("safetensors: {} readers (at most {})", options.readers, max_safetensors_readers));
  const open_file file = open_for_reading(path);
  const safetensors_header header = read_header(file, path);
  if (header.tensors.empty())
    throw invalid_argument(fmt::format("safetensors {}: the file holds no tensor", path));
  std::vector<tensor_info> table;
  std::uint64_t total = 0;
  for (const tensor_info& t : header.tensors) {
    table.push_back({.name = t.name, .type = t.type, .shape = t.shape});
    total += t.bytes;
  }
  tensor_set_builder builder(store, name, std::move(table), options.where, options.set);
  const std::size_t chunk = static_cast<std::size_t>(
      std::min<std::uint64_t>(options.chunk_bytes, std::max<std::uint64_t>(total, 1)));
  const std::vector<piece> pieces = pieces_of(header, chunk);
  const std::size_t readers =
      std::min(pieces.size(), options.readers != 0 ? options.readers : default_safetensors_readers());
  stream_executor& executor = builder.memory().provider()->executor();
  // Host memory is read straight into the set; a GPU set through each reader's staging.
  const bool staged = options.where.kind != memory_kind::os_host;
  std::vector<std::unique_ptr<reader_lane>> lanes;
  for (std::size_t r = 0; r < readers; ++r)
    lanes.push_back(std::make_unique<reader_lane>(executor, staged ? chunk : 0));

  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex progress_lock;
  std::uint64_t done = 0;
  std::exception_ptr failure;
  auto read_some = [&](reader_lane& lane) {
    try {
      for (std::size_t k = next.fetch_add(1); k < pieces.size() && !stop; k = next.fetch_add(1)) {
        const piece& p = pieces[k];
        auto* destination = static_cast<std::byte*>(builder.data(p.tensor)) + p.at;
        const std::uint64_t offset = header.data_start + header.tensors[p.tensor].offset + p.at;
        if (staged)
          lane.read_and_copy(file.fd.get(), destination, p.n, offset, path);
        else
          read_exactly(file.fd.get(), destination, p.n, offset, path);
        if (options.progress) {
          const std::lock_guard guard(progress_lock);
          done += p.n;
          options.progress(done, total);
        }
      }
      lane.finish();
    } catch (...) {
      stop = true;
      const std::lock_guard guard(progress_lock);
      if (!failure) failure = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> threads;
    threads.reserve(readers - 1);
    try {
      for (std::size_t r = 1; r < readers; ++r) threads.emplace_back(read_some, std::ref(*lanes[r]));
    } catch (...) {
      // No thread could be started: the ones that run finish the pieces between them.
    }
    read_some(*lanes[0]);
  }
  if (failure) {
    // No copy may still read the staging buffers or write the set once they go.
    for (const auto& lane : lanes) lane->drain();
    std::rethrow_exception(failure);
  }
  return builder.commit();
}

}  // namespace vmm::store
