// vmm-store: the daemon that keeps named buffers for many processes, and its command-line
// client (docs/store.md; docs/tools.md lists every command, option, exit status and JSON
// field). One subcommand per job: `serve` runs the daemon; ls, stat, rm, stats and load
// ask a running one. A new command is one more add_* function below and a line in main().

#include <vmm/store/client.hpp>
#include <vmm/store/safetensors.hpp>
#include <vmm/store/server.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"

namespace {

using json = nlohmann::ordered_json;

// What a parsed command runs: it returns the exit status.
using action = std::function<int()>;
// A subcommand and what runs it once it is the one parsed.
struct command {
  CLI::App* app = nullptr;
  action run;
};

vmm::store::server* running = nullptr;

void on_signal(int) {
  if (running != nullptr) running->stop();
}

void print_json(const json& value) {
  std::cout << value.dump(2, ' ', false, json::error_handler_t::replace) << '\n';
}

// ---- serve ---------------------------------------------------------------------------------

// Raises the soft limit of open descriptors to the hard one, and returns the soft limit in
// force. Every connection holds one, and so does every chunk an offer brings back after a
// restart (docs/store.md): the usual soft limit of 1024 is below the daemon's own default
// max_connections (4096). The daemon waits with poll(), so descriptors past 1024 are safe.
// An unlimited hard limit is as far as the kernel goes, fs.nr_open.
rlim_t raise_descriptor_limit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return 0;
  rlim_t wanted = files.rlim_max;
  if (wanted == RLIM_INFINITY) {
    std::ifstream nr_open("/proc/sys/fs/nr_open");
    if (!(nr_open >> wanted)) return files.rlim_cur;
  }
  if (files.rlim_cur >= wanted) return files.rlim_cur;
  rlimit raised = files;
  raised.rlim_cur = wanted;
  return ::setrlimit(RLIMIT_NOFILE, &raised) == 0 ? wanted : files.rlim_cur;
}

command add_serve(CLI::App& app) {
  struct settings {
    // The options bind to server_options' fields, except the two timeouts (std::chrono),
    // which are read as milliseconds and converted when the command runs.
    vmm::store::server_options options;
    std::uint64_t request_timeout_ms = static_cast<std::uint64_t>(options.request_timeout.count());
    std::uint64_t reply_timeout_ms = static_cast<std::uint64_t>(options.reply_timeout.count());
    int ready_fd = -1;
  };
  auto s = std::make_shared<settings>();
  CLI::App* serve =
      app.add_subcommand("serve", "Run the daemon until SIGINT or SIGTERM (which remove its socket)");
  serve->add_option("--socket", s->options.socket_path, "The socket to listen on")
      ->type_name("PATH")
      ->default_str(vmm::store::default_socket_path() + " (its directory made with mode 0700)");
  vmm::tools::add_byte_size(*serve, "--cap", s->options.cap,
                            "The most capacity every buffer together may hold", 0, UINT64_MAX, "none");
  vmm::tools::add_byte_size(*serve, "--client-cap", s->options.client_cap,
                            "The most capacity one connection's live creations may hold", 0, UINT64_MAX,
                            "none");
  serve
      ->add_option("--allow-uid", s->options.allowed_uids,
                   "Uids besides the daemon's own that may connect (a list: 1001,1002; repeatable)")
      ->type_name("UID,...")
      ->delimiter(',')
      ->default_str("none: the daemon's uid only")
      ->check(CLI::NonNegativeNumber);
  serve
      ->add_option("--request-timeout", s->request_timeout_ms,
                   "Milliseconds a request may take to arrive once its first byte came")
      ->type_name("MS")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--reply-timeout", s->reply_timeout_ms, "Milliseconds a reply may take to be read")
      ->type_name("MS")
      ->check(CLI::NonNegativeNumber);
  serve
      ->add_option("--version-slots", s->options.version_slots,
                   "Words of the version table that lets clients get unchanged buffers locally (0: none)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  serve
      ->add_option("--max-connections", s->options.max_connections,
                   "Connections at once; one past it is refused, naming the bound")
      ->type_name("N")
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--max-offer-descriptors", s->options.max_offer_descriptors,
                   "Descriptors the offers under way may hold, every connection's together (0: half "
                   "the soft RLIMIT_NOFILE)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  serve
      ->add_option("--ready-fd", s->ready_fd,
                   "Once listening, write one byte to descriptor N and close it (for supervisors and tests)")
      ->type_name("N")
      ->default_str("none")
      ->check(CLI::NonNegativeNumber);
  return {serve, [s, serve] {
            vmm::store::server_options& options = s->options;
            const bool default_path = serve->count("--socket") == 0;
            if (default_path) options.socket_path = vmm::store::default_socket_path();
            options.request_timeout = std::chrono::milliseconds(s->request_timeout_ms);
            options.reply_timeout = std::chrono::milliseconds(s->reply_timeout_ms);
            if (default_path) vmm::store::prepare_socket_directory(options.socket_path);
            const rlim_t descriptors = raise_descriptor_limit();
            vmm::store::server daemon(options);
            running = &daemon;
            struct sigaction handler {};
            handler.sa_handler = on_signal;
            sigemptyset(&handler.sa_mask);
            sigaction(SIGINT, &handler, nullptr);
            sigaction(SIGTERM, &handler, nullptr);
            signal(SIGPIPE, SIG_IGN);
            fmt::print(
                "vmm-store daemon: serving {} (pid {}, protocol {}, instance {:#018x}, up to {} open "
                "descriptors); starting empty: an earlier daemon's sealed buffers come back only as clients "
                "that map them reconnect\n",
                daemon.options().socket_path, daemon.info().pid, daemon.info().version,
                daemon.info().instance, descriptors);
            std::fflush(stdout);
            if (s->ready_fd >= 0) {
              const char byte = 'r';
              [[maybe_unused]] const auto ignored = ::write(s->ready_fd, &byte, 1);
              ::close(s->ready_fd);
            }
            daemon.run();
            running = nullptr;
            return vmm::tools::exit_done;
          }};
}

// ---- the client's commands ------------------------------------------------------------------

// A client command: --socket, and --json where `json_flag` is given.
CLI::App* add_client_command(CLI::App& app, const std::string& name, const std::string& description,
                             vmm::store::client_options& options, bool* json_flag) {
  CLI::App* sub = app.add_subcommand(name, description);
  sub->add_option("--socket", options.socket_path, "The daemon's socket")->type_name("PATH");
  if (json_flag != nullptr)
    sub->add_flag("--json", *json_flag,
                  "Print JSON instead of text (default: text; docs/tools.md lists the fields)");
  return sub;
}

json as_json(const vmm::store::buffer_info& info) {
  return {{"name", info.name},
          {"entry", info.entry},
          {"location", vmm::to_string(info.where)},
          {"size", info.size},
          {"capacity", info.capacity},
          {"max_size", info.max_size},
          {"holders", info.holders},
          {"sealed", info.sealed},
          {"tensors", info.tensors},
          {"named_bytes", info.named_bytes},
          {"stored_bytes", info.stored_bytes},
          {"shared_bytes", info.shared_bytes}};
}

command add_ls(CLI::App& app) {
  struct settings {
    vmm::store::client_options options;
    bool json = false;
  };
  auto s = std::make_shared<settings>();
  CLI::App* sub = add_client_command(app, "ls", "List the named buffers", s->options, &s->json);
  return {sub, [s] {
            vmm::store::client store(s->options);
            const auto infos = store.list();
            if (s->json) {
              json buffers = json::array();
              for (const auto& info : infos) buffers.push_back(as_json(info));
              print_json({{"buffers", std::move(buffers)}});
              return vmm::tools::exit_done;
            }
            fmt::print("{:<32} {:>12} {:>12} {:>12} {:<12} {:>7} {:>7} {}\n", "NAME", "SIZE", "CAPACITY",
                       "STORED", "LOCATION", "TENSORS", "HOLDERS", "STATE");
            std::uint64_t named = 0;
            std::uint64_t stored = 0;
            for (const auto& info : infos) {
              fmt::print("{:<32} {:>12} {:>12} {:>12} {:<12} {:>7} {:>7} {}\n", info.name,
                         vmm::format_byte_size(info.size), vmm::format_byte_size(info.capacity),
                         vmm::format_byte_size(info.stored_bytes), vmm::to_string(info.where),
                         info.tensors == 0 ? "-" : std::to_string(info.tensors), info.holders,
                         info.sealed ? "sealed" : "open");
              named += info.capacity;
              stored += info.stored_bytes;
            }
            fmt::print("{} buffer{}, {} named, {} stored\n", infos.size(), infos.size() == 1 ? "" : "s",
                       vmm::format_byte_size(named), vmm::format_byte_size(stored));
            return vmm::tools::exit_done;
          }};
}

command add_stat(CLI::App& app) {
  struct settings {
    vmm::store::client_options options;
    std::string name;
    bool json = false;
  };
  auto s = std::make_shared<settings>();
  CLI::App* sub = add_client_command(app, "stat", "Describe one named buffer", s->options, &s->json);
  sub->add_option("NAME", s->name, "Required: the buffer's name")->default_str("none");
  return {
      sub, [s, sub] {
        if (sub->count("NAME") == 0) return vmm::tools::usage_error(*sub, "stat: NAME is required");
        vmm::store::client store(s->options);
        const auto info = store.stat(s->name);
        if (s->json) {
          print_json(as_json(info));
          return vmm::tools::exit_done;
        }
        fmt::print(
            "name      {}\nentry     {}\nlocation  {}\nsize      {} ({} bytes)\ncapacity  {}\nmax size  {}\n"
            "holders   {}\nstate     {}\ntensors   {} ({} named)\nstored    {} ({} shared with other "
            "buffers)\n",
            info.name, info.entry, vmm::to_string(info.where), vmm::format_byte_size(info.size), info.size,
            vmm::format_byte_size(info.capacity), vmm::format_byte_size(info.max_size), info.holders,
            info.sealed ? "sealed" : "open", info.tensors, vmm::format_byte_size(info.named_bytes),
            vmm::format_byte_size(info.stored_bytes), vmm::format_byte_size(info.shared_bytes));
        return vmm::tools::exit_done;
      }};
}

command add_rm(CLI::App& app) {
  struct settings {
    vmm::store::client_options options;
    std::string name;
  };
  auto s = std::make_shared<settings>();
  CLI::App* sub = add_client_command(app, "rm", "Remove a name (its buffer lives on while a client holds it)",
                                     s->options, nullptr);
  sub->add_option("NAME", s->name, "Required: the buffer's name")->default_str("none");
  return {sub, [s, sub] {
            if (sub->count("NAME") == 0) return vmm::tools::usage_error(*sub, "rm: NAME is required");
            vmm::store::client store(s->options);
            store.remove(s->name);
            fmt::print("removed {}\n", s->name);
            return vmm::tools::exit_done;
          }};
}

command add_stats(CLI::App& app) {
  struct settings {
    vmm::store::client_options options;
    bool json = false;
  };
  auto s = std::make_shared<settings>();
  CLI::App* sub = add_client_command(app, "stats", "Print the daemon's counters", s->options, &s->json);
  return {sub, [s] {
            vmm::store::client store(s->options);
            const vmm::store::daemon_statistics counters = store.statistics();
            // The fields of vmm::store::daemon_statistics, under their names.
            const json fields = {{"connections", counters.connections},
                                 {"entries", counters.entries},
                                 {"named_entries", counters.named_entries},
                                 {"holds", counters.holds},
                                 {"bytes", counters.bytes},
                                 {"capacity", counters.capacity},
                                 {"pool_used", counters.pool_used},
                                 {"pool_reserved", counters.pool_reserved},
                                 {"cached_exports", counters.cached_exports},
                                 {"open_fds", counters.open_fds}};
            if (s->json) {
              print_json(fields);
              return vmm::tools::exit_done;
            }
            for (const auto& [name, value] : fields.items())
              fmt::print("{:<15} {}\n", name, value.get<std::uint64_t>());
            return vmm::tools::exit_done;
          }};
}

// A bar on stderr that one line redraws: "[#####     ]  50%  1.2 GiB of 2.4 GiB".
void draw_progress(std::uint64_t done, std::uint64_t total) {
  constexpr int width = 40;
  const double share = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
  const int filled = static_cast<int>(share * width);
  fmt::print(stderr, "\r[{:#<{}}{: <{}}] {:3.0f}%  {} of {}", "", filled, "", width - filled, share * 100,
             vmm::format_byte_size(done), vmm::format_byte_size(total));
  if (done == total) fmt::print(stderr, "\n");
}

command add_load(CLI::App& app) {
  struct settings {
    vmm::store::client_options options;
    std::string file;
    std::string name;
    std::string where = "host";
    std::uint64_t chunk = vmm::store::load_options{}.chunk_bytes;
    std::size_t readers = 0;
    bool dedup = false;
  };
  auto s = std::make_shared<settings>();
  CLI::App* sub = add_client_command(
      app, "load", "Load a safetensors file as a sealed tensor set (its header checked strictly)", s->options,
      nullptr);
  sub->add_option("FILE", s->file, "Required: the .safetensors file")->default_str("none");
  sub->add_option("--name", s->name, "Required: the set's name in the store")->default_str("none");
  sub->add_option("--location", s->where, "Where the set lives: host (os_host) or gpu<N>")
      ->type_name("WHERE")
      ->check(vmm::tools::location_check());
  vmm::tools::add_byte_size(*sub, "--chunk", s->chunk,
                            "The most bytes one read moves (two such staging buffers per reader)", 1,
                            UINT64_MAX, "");
  sub->add_option("--readers", s->readers, "Threads reading the file at once (0: half the cores, 1 to 8)")
      ->check(CLI::Range(std::size_t{0}, vmm::store::max_safetensors_readers));
  sub->add_flag(
      "--dedup", s->dedup,
      "Lay the set out per tensor and share each tensor whose bytes another set loaded with --dedup "
      "holds (the daemon reads every byte once)");
  return {sub, [s, sub] {
            if (sub->count("FILE") == 0) return vmm::tools::usage_error(*sub, "load: FILE is required");
            if (sub->count("--name") == 0) return vmm::tools::usage_error(*sub, "load: --name is required");
            vmm::store::client store(s->options);
            vmm::store::load_options options{.where = vmm::tools::parse_location(s->where),
                                             .chunk_bytes = static_cast<std::size_t>(s->chunk),
                                             .readers = s->readers};
            if (s->dedup) options.set = {.layout = vmm::store::set_layout::per_tensor, .deduplicate = true};
            if (::isatty(STDERR_FILENO) == 1) options.progress = draw_progress;
            const vmm::store::tensor_set set = vmm::store::load_safetensors(store, s->file, s->name, options);
            const vmm::store::buffer_info info = store.stat(s->name);
            fmt::print("loaded {}: {} tensors, {} named, capacity {} ({} stored, {} shared) at {}\n", s->name,
                       info.tensors, vmm::format_byte_size(info.named_bytes),
                       vmm::format_byte_size(info.capacity), vmm::format_byte_size(info.stored_bytes),
                       vmm::format_byte_size(info.shared_bytes), vmm::to_string(info.where));
            return vmm::tools::exit_done;
          }};
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app(
      "The daemon that keeps named buffers for the processes of one user, and its client "
      "(docs/store.md, docs/tools.md).\n"
      "Exit status: 0 done, 1 an error (printed), 2 a bad command or option.",
      "vmm-store");
  vmm::tools::prepare(app);
  // At most one command; none is refused below rather than by CLI11, whose "a subcommand is
  // required" would come before (and hide) the name of an unknown option.
  app.require_subcommand(0, 1);
  const std::vector<command> commands = {add_serve(app), add_ls(app),    add_stat(app),
                                         add_rm(app),    add_stats(app), add_load(app)};
  if (const auto status = vmm::tools::parse(app, argc, argv)) return *status;
  for (const command& c : commands)
    if (c.app->parsed()) return c.run();
  std::string names;
  for (const command& c : commands) names += (names.empty() ? "" : ", ") + c.app->get_name();
  std::fprintf(stderr, "vmm-store: a command is needed: %s\nRun 'vmm-store --help' for the options.\n",
               names.c_str());
  return vmm::tools::exit_usage;
} catch (const std::exception& error) {
  const std::string what = error.what();
  std::fprintf(stderr, "%s%s\n", what.starts_with("vmm-store") ? "" : "vmm-store: ", what.c_str());
  return vmm::tools::exit_error;
}
