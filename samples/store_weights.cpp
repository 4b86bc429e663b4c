// store_weights: one copy of a model's weights shared by two serving processes through a
// vmm-store daemon. The sample writes a small safetensors file (a synthetic model of a
// transformer's tensor names and shapes in BF16), loads it into the store once as a tensor
// set, and starts itself twice as "server" processes: each gets the set read-only (one
// mapping, no copy), checks every tensor against the file and reports where it mapped it.
//
// The daemon runs on a thread of this process (vmm::store::server, as `vmm-store serve`
// does); `vmm-store load model.safetensors --name NAME` is the same load from the command
// line. On a GPU the set lives on GPU 0; without one, on the OS host-memory provider.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/error.hpp"
#include "vmm/provider.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/safetensors.hpp"
#include "vmm/store/server.hpp"
#include "vmm/store/tensor_set.hpp"
#include "vmm/stream_executor.hpp"

extern char** environ;

namespace {

constexpr const char* set_name = "store_weights/tiny-llama";

struct tensor_spec {
  std::string name;
  std::vector<std::uint64_t> shape;
};

// Two layers of a transformer of width 64, vocabulary 256, in BF16.
std::vector<tensor_spec> model() {
  std::vector<tensor_spec> specs = {{"model.embed_tokens.weight", {256, 64}}};
  for (int layer = 0; layer < 2; ++layer)
    for (const char* part : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"})
      specs.push_back({fmt::format("model.layers.{}.{}.weight", layer, part), {64, 64}});
  specs.push_back({"model.norm.weight", {64}});
  specs.push_back({"lm_head.weight", {256, 64}});
  return specs;
}

// The BF16 bits of element i of tensor t: anything that differs by tensor and position.
std::uint16_t element(std::size_t t, std::size_t i) {
  return static_cast<std::uint16_t>((i * 40503u + t * 977u) >> 3);
}

std::size_t elements(const std::vector<std::uint64_t>& shape) {
  std::size_t n = 1;
  for (const std::uint64_t extent : shape) n *= extent;
  return n;
}

void write_model(const std::string& path) {
  const std::vector<tensor_spec> specs = model();
  std::string header = "{\"__metadata__\": {\"format\": \"pt\"}";
  std::uint64_t at = 0;
  for (const tensor_spec& t : specs) {
    const std::uint64_t bytes = elements(t.shape) * 2;
    header += fmt::format(", \"{}\": {{\"dtype\": \"BF16\", \"shape\": [{}], \"data_offsets\": [{}, {}]}}",
                          t.name, fmt::join(t.shape, ", "), at, at + bytes);
    at += bytes;
  }
  header += "}";
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) throw vmm::os_error(errno, "fopen " + path);
  std::uint8_t length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  std::fwrite(length, 1, 8, file);
  std::fwrite(header.data(), 1, header.size(), file);
  for (std::size_t t = 0; t < specs.size(); ++t)
    for (std::size_t i = 0; i < elements(specs[t].shape); ++i) {
      const std::uint16_t bits = element(t, i);
      std::fwrite(&bits, 2, 1, file);  // little-endian hosts only, as safetensors is
    }
  std::fclose(file);
}

int server(const std::string& socket, int index) {
  vmm::store::client store({.socket_path = socket});
  const vmm::store::tensor_set weights = vmm::store::tensor_set::get(store, set_name);
  vmm::stream_executor& executor = weights.memory().provider()->executor();
  std::size_t wrong = 0;
  for (std::size_t t = 0; t < weights.size(); ++t) {
    const vmm::store::tensor_view tensor = weights[t];
    std::vector<std::uint16_t> host(tensor.info->bytes / 2);  // a copy only to check it here
    executor.copy(host.data(), tensor.data, tensor.info->bytes, {});
    executor.synchronize({});
    for (std::size_t i = 0; i < host.size(); ++i) wrong += host[i] != element(t, i) ? 1 : 0;
  }
  const vmm::store::tensor_view embed = weights.at("model.embed_tokens.weight");
  fmt::print("server {} (pid {}): {} tensors read-only on {}, embed_tokens [{}] at {}; {} wrong elements\n",
             index, ::getpid(), weights.size(), vmm::to_string(weights.memory().where()),
             fmt::join(embed.info->shape, ", "), embed.data, wrong);
  return wrong == 0 && weights.memory().access() == vmm::access_mode::read_only ? 0 : 1;
}

int spawn_and_wait(std::vector<std::string> argv) {
  std::vector<char*> pointers;
  for (std::string& word : argv) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, pointers.data(), environ) != 0) return 1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::vector<std::string> args(argv, argv + argc);
  if (args.size() >= 4 && args[1] == "server") return server(args[2], std::stoi(args[3]));

  std::string why;
  const bool gpu = vmm::gpu_available(&why);
  if (!gpu) fmt::print("no GPU ({}): using the OS host-memory provider\n", why);
  char directory[] = "/tmp/vmm-store-weights-XXXXXX";
  if (::mkdtemp(directory) == nullptr) throw vmm::os_error(errno, "mkdtemp");
  const std::string socket = std::string(directory) + "/socket";
  const std::string file = std::string(directory) + "/model.safetensors";
  write_model(file);
  int status = 1;
  {
    vmm::store::server daemon({.socket_path = socket});
    std::thread loop([&] { daemon.run(); });
    {
      vmm::store::client store({.socket_path = socket});
      const vmm::location where = gpu ? vmm::location::device(0) : vmm::location::os_host();
      (void)vmm::store::load_safetensors(store, file, set_name, {.where = where});
      const vmm::store::buffer_info info = store.stat(set_name);
      fmt::print("loaded {}: {} tensors, {} bytes named, on {}\n", file, info.tensors, info.named_bytes,
                 vmm::to_string(info.where));
    }
    std::fflush(stdout);  // before the children print
    int second_status = 1;
    std::thread second([&] { second_status = spawn_and_wait({args[0], "server", socket, "1"}); });
    status = spawn_and_wait({args[0], "server", socket, "0"});
    second.join();
    status |= second_status;
    vmm::store::client({.socket_path = socket}).remove(set_name);
    daemon.stop();
    loop.join();
  }
  std::remove(file.c_str());
  ::rmdir(directory);
  fmt::print("{}\n", status == 0 ? "both servers read the one copy of the weights" : "FAILED");
  return status;
} catch (const std::exception& error) {
  fmt::print(stderr, "store_weights: {}\n", error.what());
  return 1;
}
