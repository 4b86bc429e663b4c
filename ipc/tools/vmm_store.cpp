// vmm-store: the daemon that keeps named buffers for many processes, and its command-line
// client (docs/store.md).
//
//   vmm-store serve [--socket P] [--cap BYTES] [--client-cap BYTES] [--allow-uid U,...]
//                   [--request-timeout MS] [--reply-timeout MS] [--version-slots N] [--ready-fd N]
//   vmm-store ls [--socket P]
//   vmm-store stat NAME [--socket P]
//   vmm-store rm NAME [--socket P]
//
// BYTES takes a suffix K, M, G or T (powers of 1024). --request-timeout and --reply-timeout
// bound how long a request may take to arrive once begun and a reply to be read, in
// milliseconds (server_options, docs/store.md; 1000 and 5000 by default). --version-slots N:
// words of the version table that lets clients get unchanged buffers locally (65536 by
// default; 0: none, every get asks the daemon). --ready-fd N: once listening, write
// one byte to descriptor N and close it (for supervisors and tests that wait for the
// daemon without polling). SIGINT and SIGTERM stop the daemon and remove its socket.
// Exit status: 0 done, 1 an error (printed), 2 bad usage.

#include <vmm/store/client.hpp>
#include <vmm/store/server.hpp>

#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct usage_error {
  std::string message;
};

vmm::store::server* running = nullptr;

void on_signal(int) {
  if (running != nullptr) running->stop();
}

std::uint64_t parse_number(const std::string& text, const char* what) {
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || at == text.data())
    throw usage_error{fmt::format("{}: not a number: {}", what, text)};
  std::uint64_t scale = 1;
  if (at != end) {
    // K, M, G or T, either case: 2^10, 2^20, 2^30, 2^40.
    constexpr std::string_view suffixes = "kmgt";
    const std::size_t power =
        at + 1 == end ? suffixes.find(static_cast<char>(std::tolower(static_cast<unsigned char>(*at))))
                      : std::string_view::npos;
    if (power == std::string_view::npos) throw usage_error{fmt::format("{}: bad suffix in {}", what, text)};
    scale = std::uint64_t{1} << (10 * (power + 1));
  }
  if (value > UINT64_MAX / scale) throw usage_error{fmt::format("{}: too large: {}", what, text)};
  return value * scale;
}

std::chrono::milliseconds milliseconds(const std::string& text, const char* what) {
  const std::uint64_t value = parse_number(text, what);
  if (value > static_cast<std::uint64_t>(std::chrono::milliseconds::max().count()))
    throw usage_error{fmt::format("{}: too large: {}", what, text)};
  return std::chrono::milliseconds(value);
}

std::string human(std::uint64_t bytes) {
  if (bytes >= (1ull << 30) && bytes % (1ull << 20) == 0)
    return fmt::format("{:.2f} GiB", double(bytes) / (1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.2f} MiB", double(bytes) / (1ull << 20));
  return fmt::format("{} B", bytes);
}

int serve(const std::vector<std::string>& args) {
  vmm::store::server_options options;
  options.socket_path = vmm::store::default_socket_path();
  bool default_path = true;
  std::optional<int> ready_fd;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw usage_error{fmt::format("{} needs a value", args[i])};
      return args[++i];
    };
    if (args[i] == "--socket") {
      options.socket_path = value();
      default_path = false;
    } else if (args[i] == "--cap") {
      options.cap = parse_number(value(), "--cap");
    } else if (args[i] == "--client-cap") {
      options.client_cap = parse_number(value(), "--client-cap");
    } else if (args[i] == "--allow-uid") {
      const std::string& list = value();
      for (std::size_t start = 0; start <= list.size();) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        options.allowed_uids.push_back(
            static_cast<uid_t>(parse_number(list.substr(start, comma - start), "--allow-uid")));
        start = comma + 1;
      }
    } else if (args[i] == "--request-timeout") {
      options.request_timeout = milliseconds(value(), "--request-timeout");
    } else if (args[i] == "--reply-timeout") {
      options.reply_timeout = milliseconds(value(), "--reply-timeout");
    } else if (args[i] == "--version-slots") {
      options.version_slots = parse_number(value(), "--version-slots");
    } else if (args[i] == "--ready-fd") {
      ready_fd = static_cast<int>(parse_number(value(), "--ready-fd"));
    } else {
      throw usage_error{fmt::format("serve: unknown option {}", args[i])};
    }
  }
  if (default_path) vmm::store::prepare_socket_directory(options.socket_path);
  vmm::store::server daemon(options);
  running = &daemon;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
  fmt::print(
      "vmm-store {}: serving {} (pid {}, protocol {}, instance {:#018x}); starting empty: no buffer of an "
      "earlier daemon survives\n",
      "daemon", daemon.options().socket_path, daemon.info().pid, daemon.info().version,
      daemon.info().instance);
  std::fflush(stdout);
  if (ready_fd) {
    const char byte = 'r';
    [[maybe_unused]] const auto ignored = ::write(*ready_fd, &byte, 1);
    ::close(*ready_fd);
  }
  daemon.run();
  running = nullptr;
  return 0;
}

int client_command(const std::string& command, const std::vector<std::string>& args) {
  vmm::store::client_options options;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--socket") {
      if (i + 1 >= args.size()) throw usage_error{"--socket needs a value"};
      options.socket_path = args[++i];
    } else {
      names.push_back(args[i]);
    }
  }
  const std::size_t wanted = command == "ls" ? 0 : 1;
  if (names.size() != wanted)
    throw usage_error{fmt::format("{} takes {} name{}", command, wanted, wanted == 1 ? "" : "s")};
  vmm::store::client store(options);
  if (command == "ls") {
    const auto infos = store.list();
    fmt::print("{:<32} {:>12} {:>12} {:<12} {:>7} {}\n", "NAME", "SIZE", "CAPACITY", "LOCATION", "HOLDERS",
               "STATE");
    for (const auto& info : infos)
      fmt::print("{:<32} {:>12} {:>12} {:<12} {:>7} {}\n", info.name, human(info.size), human(info.capacity),
                 vmm::to_string(info.where), info.holders, info.sealed ? "sealed" : "open");
    fmt::print("{} buffer{}\n", infos.size(), infos.size() == 1 ? "" : "s");
  } else if (command == "stat") {
    const auto info = store.stat(names[0]);
    fmt::print(
        "name      {}\nentry     {}\nlocation  {}\nsize      {} ({} bytes)\ncapacity  {}\nmax size  {}\n"
        "holders   {}\nstate     {}\n",
        info.name, info.entry, vmm::to_string(info.where), human(info.size), info.size, human(info.capacity),
        human(info.max_size), info.holders, info.sealed ? "sealed" : "open");
  } else {
    store.remove(names[0]);
    fmt::print("removed {}\n", names[0]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> words(argv + 1, argv + argc);
  try {
    if (words.empty()) throw usage_error{"a command is needed: serve, ls, stat or rm"};
    const std::vector<std::string> args(words.begin() + 1, words.end());
    if (words[0] == "serve") return serve(args);
    if (words[0] == "ls" || words[0] == "stat" || words[0] == "rm") return client_command(words[0], args);
    throw usage_error{fmt::format("unknown command {}", words[0])};
  } catch (const usage_error& error) {
    fmt::print(stderr,
               "vmm-store: {}\nusage: vmm-store serve [--socket P] [--cap BYTES] [--client-cap BYTES] "
               "[--allow-uid U,...] [--request-timeout MS] [--reply-timeout MS] [--version-slots N] "
               "[--ready-fd N]\n       "
               "vmm-store ls|stat NAME|rm NAME [--socket P]\n",
               error.message);
    return 2;
  } catch (const std::exception& error) {
    const std::string what = error.what();
    fmt::print(stderr, "{}{}\n", what.starts_with("vmm-store") ? "" : "vmm-store: ", what);
    return 1;
  }
}
