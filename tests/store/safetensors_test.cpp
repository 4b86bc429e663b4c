// safetensors files (vmm/store/safetensors.hpp): the header parser's refusals, each naming
// its problem, and loads into a vmm-store daemon (the tool, spawned per test) that leave
// exactly the set, or nothing, in the store. Typed over the kinds of memory that can be
// exported (the OS provider always; a GPU kind skips without a GPU).

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "helpers/store_peer_protocol.hpp"
#include "memory_io.hpp"
#include "provider_kinds.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/safetensors.hpp"

namespace vmm::testing {
namespace {

using store::dtype;

// A safetensors file of `header` (the JSON, as given) and `data`.
std::string write_safetensors(const std::string& path, const std::string& header,
                              const std::vector<std::uint8_t>& data,
                              std::optional<std::uint64_t> length = std::nullopt) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) throw os_error(errno, "fopen " + path);
  const std::uint64_t n = length.value_or(header.size());
  std::uint8_t bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::uint8_t>(n >> (8 * i));
  std::fwrite(bytes, 1, 8, file);
  std::fwrite(header.data(), 1, header.size(), file);
  std::fwrite(data.data(), 1, data.size(), file);
  std::fclose(file);
  return path;
}

// Two tensors: "a" F32 [2, 3] at [0, 24) and "b.bias" BF16 [5] at [24, 34), and metadata.
const std::string good_header =
    R"({"__metadata__": {"format": "pt"}, "b.bias": {"dtype": "BF16", "shape": [5], "data_offsets": [24, 34]},)"
    R"( "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})";

std::string refusal_of(const std::string& header, std::size_t data_bytes = 34) {
  try {
    (void)store::parse_safetensors_header(std::as_bytes(std::span(header.data(), header.size())), data_bytes);
  } catch (const invalid_argument& error) {
    return error.what();
  }
  return "(taken)";
}

TEST(safetensors_header, parses_tensors_in_data_order_with_metadata) {
  const store::safetensors_header h =
      store::parse_safetensors_header(std::as_bytes(std::span(good_header.data(), good_header.size())), 34);
  EXPECT_EQ(h.data_start, 8 + good_header.size());
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[0].type, dtype::f32);
  EXPECT_EQ(h.tensors[0].shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(h.tensors[1].name, "b.bias");
  EXPECT_EQ(h.tensors[1].offset, 24u);
  EXPECT_EQ(h.tensors[1].bytes, 10u);
  ASSERT_EQ(h.metadata.size(), 1u);
  EXPECT_EQ(h.metadata[0], (std::pair<std::string, std::string>{"format", "pt"}));
}

TEST(safetensors_header, refuses_hostile_headers_naming_the_problem) {
  const auto tensor = [](const std::string& body) { return R"({"t": )" + body + "}"; };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "a JSON array, not an object"},
      {"{\"t\": ", "not JSON"},
      {"{\"t\xff\": {}}", "UTF-8"},
      {R"({"t\u0001": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})", "control character"},
      {tensor(R"({"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]})"), "unknown dtype \"Q7\""},
      {tensor(R"({"dtype": "U8", "shape": [1], "data_offsets": [0, 40]})"), "outside the data"},
      {tensor(R"({"dtype": "U8", "shape": [2], "data_offsets": [3, 1]})"), "end before they begin"},
      {tensor(R"({"dtype": "U8", "shape": [2], "data_offsets": [0, 3]})"), "hold 3 bytes"},
      {tensor(R"({"dtype": "U8", "shape": [-2], "data_offsets": [0, 2]})"), "not a non-negative integer"},
      {tensor(R"({"dtype": "U8", "shape": [1, 1, 1, 1, 1, 1, 1, 1, 1], "data_offsets": [0, 1]})"),
       "9 dimensions"},
      {tensor(R"({"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "extra": 1})"),
       "unknown key \"extra\""},
      {tensor(R"({"dtype": "U8", "shape": [1]})"), "no \"data_offsets\""},
      {tensor(R"([1])"), "not an object"},
      {R"({"x": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, )"
       R"("y": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})",
       "overlap"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, )"
       R"("x": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
       "appears twice"},
      {R"({"a": {"dtype": "U8", "shape": [10], "data_offsets": [0, 10]}, )"
       R"("e": {"dtype": "U8", "shape": [0], "data_offsets": [5, 5]}, )"
       R"("b": {"dtype": "U8", "shape": [6], "data_offsets": [6, 12]}})",
       "tensors \"a\" and \"b\" overlap"},
      {R"({"__metadata__": {"n": 3}})", "not a string"},
      {R"({"__metadata__": [1]})", "__metadata__ is a JSON array"},
  };
  for (const auto& [header, expected] : cases) {
    const std::string message = refusal_of(header);
    EXPECT_NE(message.find(expected), std::string::npos) << header << " -> " << message;
    EXPECT_EQ(message.rfind("safetensors header: ", 0), 0u) << message;
  }
}

template <class Kind>
class safetensors_load_test : public provider_test<Kind> {
 protected:
  void SetUp() override {
    provider_test<Kind>::SetUp();
    if (this->IsSkipped()) return;
    daemon_ = std::make_unique<daemon_process>(directory_.path() + "/socket");
  }
  store::client connect() { return store::client({.socket_path = daemon_->socket()}); }
  std::string file(const std::string& name) const { return directory_.path() + "/" + name; }

  temporary_directory directory_;
  std::unique_ptr<daemon_process> daemon_;
};

using store_kinds = ::testing::Types<os_host_memory, device_memory>;
TYPED_TEST_SUITE(safetensors_load_test, store_kinds, memory_kind_names);

TYPED_TEST(safetensors_load_test, loads_every_tensor_in_small_chunks) {
  const std::vector<std::uint8_t> data = pattern(34, 5);
  const std::string path = write_safetensors(this->file("m.safetensors"), good_header, data);
  store::client store = this->connect();
  std::vector<std::uint64_t> progress;
  const store::tensor_set set =
      store::load_safetensors(store, path, "m",
                              {.where = TypeParam::where(),
                               .chunk_bytes = 7,
                               .progress = [&](std::uint64_t done, std::uint64_t total) {
                                 EXPECT_EQ(total, 34u);
                                 progress.push_back(done);
                               }});
  ASSERT_EQ(set.size(), 2u);
  const store::tensor_view a = set.at("a");
  const store::tensor_view b = set.at("b.bias");
  EXPECT_EQ(read_bytes(*set.memory().provider(), reinterpret_cast<std::uintptr_t>(a.data), 24),
            std::vector<std::uint8_t>(data.begin(), data.begin() + 24));
  EXPECT_EQ(read_bytes(*set.memory().provider(), reinterpret_cast<std::uintptr_t>(b.data), 10),
            std::vector<std::uint8_t>(data.begin() + 24, data.end()));
  EXPECT_EQ(b.info->type, dtype::bf16);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), 34u);
  EXPECT_EQ(progress.size(), 6u);  // 24 bytes in chunks of 7 (4), 10 bytes (2)
  EXPECT_EQ(store.stat("m").tensors, 2u);
}

TYPED_TEST(safetensors_load_test, several_readers_load_every_byte_and_report_each_piece_once) {
  // Six tensors of 1000 bytes in pieces of 64: 16 pieces each, read by five threads at once.
  std::string header = "{";
  for (int i = 0; i < 6; ++i)
    header += fmt::format(R"({}"t{}": {{"dtype": "U8", "shape": [1000], "data_offsets": [{}, {}]}})",
                          i == 0 ? "" : ", ", i, 1000 * i, 1000 * (i + 1));
  header += "}";
  const std::vector<std::uint8_t> data = pattern(6000, 21);
  const std::string path = write_safetensors(this->file("six.safetensors"), header, data);
  store::client store = this->connect();
  std::vector<std::uint64_t> progress;
  const store::tensor_set set =
      store::load_safetensors(store, path, "six",
                              {.where = TypeParam::where(),
                               .chunk_bytes = 64,
                               .readers = 5,
                               .progress = [&](std::uint64_t done, std::uint64_t total) {
                                 EXPECT_EQ(total, 6000u);
                                 progress.push_back(done);
                               }});
  ASSERT_EQ(set.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    const store::tensor_view t = set.at(fmt::format("t{}", i));
    EXPECT_EQ(read_bytes(*set.memory().provider(), reinterpret_cast<std::uintptr_t>(t.data), 1000),
              std::vector<std::uint8_t>(data.begin() + 1000 * i, data.begin() + 1000 * (i + 1)))
        << "t" << i;
  }
  ASSERT_EQ(progress.size(), 6u * 16u);  // 15 pieces of 64 bytes and one of 40, per tensor
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  EXPECT_EQ(progress.back(), 6000u);

  try {
    (void)store::load_safetensors(store, path, "many", {.where = TypeParam::where(), .readers = 65});
    ADD_FAILURE() << "65 readers were taken";
  } catch (const invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("65 readers"), std::string::npos) << error.what();
  }
  EXPECT_EQ(store.list().size(), 1u);  // "six" alone
}

TYPED_TEST(safetensors_load_test, hostile_files_are_refused_and_leave_nothing) {
  store::client store = this->connect();
  const std::vector<std::uint8_t> data = pattern(34, 5);
  const std::vector<std::pair<std::string, std::string>> files = {
      {write_safetensors(this->file("past.safetensors"), good_header, data, 1u << 20), "past the file's end"},
      {write_safetensors(this->file("huge.safetensors"), good_header, data, std::uint64_t{1} << 40),
       "past the limit"},
      {write_safetensors(this->file("short.safetensors"), good_header,
                         std::vector<std::uint8_t>(data.begin(), data.begin() + 30)),
       "outside the data"},
      {write_safetensors(this->file("list.safetensors"), "[]", data), "not an object"},
      {write_safetensors(this->file("empty.safetensors"), R"({"__metadata__": {}})", data), "no tensor"},
  };
  for (const auto& [path, expected] : files) {
    try {
      (void)store::load_safetensors(store, path, "m", {.where = TypeParam::where()});
      ADD_FAILURE() << path << " was loaded";
    } catch (const invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
    }
  }
  std::FILE* tiny = std::fopen(this->file("tiny.safetensors").c_str(), "wb");
  std::fputs("abc", tiny);
  std::fclose(tiny);
  EXPECT_THROW((void)store::load_safetensors(store, this->file("tiny.safetensors"), "m"), invalid_argument);
  EXPECT_THROW((void)store::load_safetensors(store, this->file("absent.safetensors"), "m"), os_error);
  EXPECT_TRUE(store.list().empty());
  EXPECT_EQ(store.statistics().entries, 0u);
  EXPECT_EQ(store.statistics().bytes, 0u);
}

TYPED_TEST(safetensors_load_test, the_load_command_loads_and_ls_lists_the_set) {
  const std::string path = write_safetensors(this->file("m.safetensors"), good_header, pattern(34, 9));
  child_process load({VMM_STORE_PATH, "load", path, "--name", "m", "--socket", this->daemon_->socket(),
                      "--location", TypeParam::where().kind == memory_kind::os_host ? "host" : "gpu0"});
  const int status = load.wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  store::client store = this->connect();
  const store::buffer_info info = store.stat("m");
  EXPECT_TRUE(info.sealed);
  EXPECT_EQ(info.tensors, 2u);
  EXPECT_EQ(info.named_bytes, 34u);
  EXPECT_EQ(info.holders, 0u);  // the tool's hold went with it

  child_process refused({VMM_STORE_PATH, "load", path, "--name", "m", "--socket", this->daemon_->socket()});
  const int again = refused.wait();
  EXPECT_TRUE(WIFEXITED(again) && WEXITSTATUS(again) == 1) << again;  // the name is taken
}

TYPED_TEST(safetensors_load_test, load_with_dedup_shares_the_tensors_two_files_have_alike) {
  const std::size_t g = provider_for(TypeParam::where())->capabilities().granularity;
  // An embedding of a granule (a chunk of its own, laid out per tensor), then 16 bytes.
  const std::string header =
      fmt::format(R"({{"embed": {{"dtype": "U8", "shape": [{0}], "data_offsets": [0, {0}]}},)"
                  R"( "w": {{"dtype": "U8", "shape": [16], "data_offsets": [{0}, {1}]}}}})",
                  g, g + 16);
  std::vector<std::uint8_t> base = pattern(g + 16, 3);
  std::vector<std::uint8_t> tuned = base;
  for (std::size_t i = g; i < g + 16; ++i) tuned[i] ^= 0xff;  // only "w" differs
  const std::string where = TypeParam::where().kind == memory_kind::os_host ? "host" : "gpu0";
  const auto load = [&](const std::string& file, const std::vector<std::uint8_t>& data,
                        const std::string& name, bool dedup) {
    std::vector<std::string> argv{VMM_STORE_PATH,
                                  "load",
                                  write_safetensors(this->file(file), header, data),
                                  "--name",
                                  name,
                                  "--socket",
                                  this->daemon_->socket(),
                                  "--location",
                                  where};
    if (dedup) argv.push_back("--dedup");
    child_process tool(argv);
    const int status = tool.wait();
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << name << ": " << status;
  };
  load("base.safetensors", base, "base", true);
  load("tuned.safetensors", tuned, "tuned", true);
  load("copy.safetensors", tuned, "copy", false);
  store::client store = this->connect();
  const store::buffer_info a = store.stat("base");
  const store::buffer_info b = store.stat("tuned");
  const store::buffer_info c = store.stat("copy");
  EXPECT_GE(b.shared_bytes, g);  // the embedding's chunk at least
  EXPECT_LT(b.shared_bytes, b.capacity);
  EXPECT_EQ(b.stored_bytes, b.capacity - b.shared_bytes);
  EXPECT_EQ(c.shared_bytes, 0u);  // loaded without --dedup
  EXPECT_EQ(store.statistics().bytes, a.capacity + b.stored_bytes + c.capacity);
  const store::tensor_set got = store::tensor_set::get(store, "tuned");
  EXPECT_EQ(
      read_bytes(*got.memory().provider(), reinterpret_cast<std::uintptr_t>(got.memory().data()), g + 16),
      tuned);
}

}  // namespace
}  // namespace vmm::testing
