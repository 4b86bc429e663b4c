// vmm-replay: replays an allocation trace through vmm::memory_resource and reports what
// the resource reserved against what was in use, and what each call cost the host.
//
//   vmm-replay TRACE [--location gpu0|os_host] [--simulate BYTES] [--lag EVENTS] [--after FIRST]
//              [--json FILE] [--repeat N] [--max-ratio R] [--headroom SHARE]
//
// TRACE is a text file, gzip-compressed or not, one event a line ('#' starts a comment):
//   a <id> <bytes> <stream>   allocate <bytes> on stream number <stream> (0, 1, ...)
//   f <id>                    free allocation <id> (on the stream it was allocated on)
// Every line is checked: a malformed line, an unknown or reused id, a size past 2^48 or a
// stream number past 1023 is an error naming the line. Nothing of the trace is trusted.
//
// Reported: peak live bytes (the trace's own, as requested), peak reserved bytes (physical
// memory the resource held: mapped or spare), their ratio, the largest single allocation
// still possible at the end (with the trace's last live set still allocated), and the host
// time of each allocate and deallocate (median and 99th percentile) and of an
// allocate + deallocate pair (the sum of the two, so two clock readings' cost; the median of
// an empty reading is printed beside them). Calls are timed with the TSC where it is
// invariant, otherwise with steady_clock (call_clock.hpp). --repeat replays the trace N
// times in one resource (the steady state of a training loop); the figures cover every pass.
// Also the pages created, stitched and released, and the resource's host waits
// (memory_resource_statistics::host_waits: allocations that blocked for a stream).
//
// --simulate BYTES (OS host only; a number with an optional KiB/MiB/GiB suffix): the OS
// provider's commit budget is BYTES and its pages come at first touch, so that a trace
// larger than this machine's memory replays (nothing is written to the memory: the
// figures are the resource's bookkeeping, the same as with every page committed). The
// provider holds a descriptor per 2 MiB page: a budget needing more than `ulimit -n`
// allows is refused with exit status 4.
// --lag EVENTS (OS host only): the memory's stream work runs on a simulated device that is
// EVENTS trace events behind the host, as a GPU is behind a program that queues kernels
// ahead of it: a free's point passes only once the host has replayed EVENTS more events,
// unless the resource waits for it (counted and printed). Without --lag, OS host memory is
// synchronous (every free passes at once) and a GPU's idle streams pass within
// microseconds: neither shows what frees still queued behind running work cost.
// --after FIRST: replays the trace FIRST before TRACE in the same resource, frees what it
// left live, synchronizes and trims the resource to nothing and resets its peaks (what
// bench/torch_allocators.py does between workloads, through vmm_torch.trim()): the figures
// are TRACE's alone, on the layout FIRST left behind.
// --max-ratio R: exit status 3 when peak reserved / peak live passes R (a check for CI).
// --headroom SHARE: memory_resource_properties::headroom (the idle share of its peak the
// resource may learn to keep mapped; 0, the default, is the resource's own), as
// vmm_torch.use(headroom=...) sets it: what memory more room costs on a trace, and how many
// pages it stops moving.

#include <fmt/format.h>
#include <sys/resource.h>
#include <zlib.h>
#if defined(__x86_64__)
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vmm/capabilities.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/provider.hpp"
#include "call_clock.hpp"

namespace {

struct event {
  bool allocate;
  std::uint32_t stream;
  std::uint64_t id;
  std::uint64_t bytes;
};

struct trace_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string read_all(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw trace_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string text;
  char buffer[1 << 16];
  int read = 0;
  while ((read = gzread(file, buffer, sizeof buffer)) > 0)
    text.append(buffer, static_cast<std::size_t>(read));
  int code = 0;
  const char* message = gzerror(file, &code);
  const std::string why = message != nullptr ? message : "read error";  // gzclose frees message
  gzclose(file);
  if (read < 0 || (code != Z_OK && code != Z_STREAM_END))
    throw trace_error(fmt::format("{}: not a readable trace ({})", path, why));
  return text;
}

// At most 80 bytes of a line for a message, bytes outside printable ASCII as \xNN.
std::string printable(std::string_view line) {
  std::string text;
  for (const char c : line.substr(0, 80)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f)
      text += c;
    else
      text += fmt::format("\\x{:02x}", byte);
  }
  return text;
}

// Parses and checks every line; ids are renumbered densely.
std::vector<event> parse(const std::string& path, std::uint32_t& streams) {
  std::istringstream in(read_all(path));
  std::vector<event> events;
  std::unordered_map<std::uint64_t, std::uint64_t> live;  // trace id -> dense id
  std::uint64_t next_id = 0;
  std::string line;
  streams = 1;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    const auto fail = [&](const std::string& why) {
      throw trace_error(fmt::format("{}:{}: {}: \"{}\"", path, number, why, printable(line)));
    };
    std::string extra;
    if (kind == "a") {
      std::uint64_t id = 0;
      std::uint64_t bytes = 0;
      std::uint32_t stream = 0;
      if (!(fields >> id >> bytes >> stream)) fail("an allocation needs an id, a size and a stream number");
      if (fields >> extra) fail("extra fields");
      if (bytes > (std::uint64_t{1} << 48)) fail("a size past 2^48 bytes");
      if (stream > 1023) fail("a stream number past 1023");
      if (!live.emplace(id, next_id).second) fail(fmt::format("allocation id {} is live already", id));
      events.push_back({true, stream, next_id++, bytes});
      streams = std::max(streams, stream + 1);
    } else if (kind == "f") {
      std::uint64_t id = 0;
      if (!(fields >> id)) fail("a free needs an id");
      if (fields >> extra) fail("extra fields");
      const auto it = live.find(id);
      if (it == live.end()) fail(fmt::format("free of id {}, which is not live", id));
      events.push_back({false, 0, it->second, 0});
      live.erase(it);
    } else {
      fail("a line must start with 'a' or 'f'");
    }
  }
  if (events.empty()) throw trace_error(fmt::format("{}: no events", path));
  return events;
}

struct percentiles {
  double median = 0;
  double p99 = 0;
};

percentiles of(std::vector<double>& samples) {
  if (samples.empty()) return {};
  const auto at = [&](double q) {
    const auto k = static_cast<std::ptrdiff_t>(q * static_cast<double>(samples.size() - 1));
    std::nth_element(samples.begin(), samples.begin() + k, samples.end());
    return samples[static_cast<std::size_t>(k)];
  };
  return {at(0.5), at(0.99)};
}

// The device of --lag: one timeline for every stream (a trace's streams share a GPU). Work
// recorded while the host is at event t is done once the host has reached t + lag; a host
// wait for it brings the device there at once.
class lagging_device final : public vmm::stream_executor {
 public:
  explicit lagging_device(std::uint64_t lag) : lag_(lag) {}

  // The host has replayed one more trace event.
  void tick() {
    std::lock_guard lock(mutex_);
    ++host_;
  }
  [[nodiscard]] std::uint64_t lag() const noexcept { return lag_; }
  // Host waits for device work, and the trace events of device work they waited for.
  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> waits() const {
    std::lock_guard lock(mutex_);
    return {waits_, waited_};
  }

  void copy(void* destination, const void* source, std::size_t n, vmm::stream_ref) override {
    std::memmove(destination, source, n);
  }
  void fill(void* destination, std::uint8_t value, std::size_t n, vmm::stream_ref) override {
    std::memset(destination, value, n);
  }
  void synchronize(vmm::stream_ref) override { synchronize_device(); }
  void synchronize_device() override {
    std::lock_guard lock(mutex_);
    catch_up(host_);
  }
  vmm::event_handle create_event() override {
    std::lock_guard lock(mutex_);
    recorded_.emplace(++next_event_, 0);
    return next_event_;
  }
  void destroy_event(vmm::event_handle event) noexcept override {
    std::lock_guard lock(mutex_);
    recorded_.erase(event);
  }
  void record(vmm::event_handle event, vmm::stream_ref) override {
    std::lock_guard lock(mutex_);
    recorded_.at(event) = host_;
  }
  bool done(vmm::event_handle event) override {
    std::lock_guard lock(mutex_);
    return recorded_.at(event) <= device();
  }
  void synchronize_event(vmm::event_handle event) override {
    std::lock_guard lock(mutex_);
    catch_up(recorded_.at(event));
  }
  void enqueue_wait(vmm::stream_ref, vmm::event_handle) override {}  // one timeline
  vmm::stream_ref create_stream() override {
    std::lock_guard lock(mutex_);
    return vmm::stream_ref(reinterpret_cast<CUstream_st*>(next_stream_ += 64));
  }
  void destroy_stream(vmm::stream_ref) noexcept override {}

 private:
  [[nodiscard]] std::uint64_t device() const noexcept {
    return std::max(caught_up_, host_ > lag_ ? host_ - lag_ : 0);
  }
  void catch_up(std::uint64_t position) noexcept {
    if (position <= device()) return;
    ++waits_;
    waited_ += position - device();
    caught_up_ = position;
  }

  const std::uint64_t lag_;
  mutable std::mutex mutex_;
  std::uint64_t host_ = 0;
  std::uint64_t caught_up_ = 0;
  std::uint64_t waits_ = 0;
  std::uint64_t waited_ = 0;
  vmm::event_handle next_event_ = 0;
  std::uintptr_t next_stream_ = 0;
  std::unordered_map<vmm::event_handle, std::uint64_t> recorded_;
};

vmm::location parse_location(const std::string& text) {
  if (text == "os_host") return vmm::location::os_host();
  if (text.rfind("gpu", 0) == 0) {
    const std::string number = text.substr(3);
    if (!number.empty() && number.find_first_not_of("0123456789") == std::string::npos && number.size() < 4)
      return vmm::location::device(std::stoi(number));
  }
  throw std::invalid_argument(fmt::format("--location {}: expected os_host or gpu<N>", text));
}

// "80GiB", "512MiB", "4096": bytes, at most 2^48.
std::size_t parse_bytes(const std::string& text) {
  static constexpr std::pair<std::string_view, std::size_t> suffixes[] = {
      {"GiB", std::size_t{1} << 30}, {"MiB", std::size_t{1} << 20}, {"KiB", std::size_t{1} << 10}, {"", 1}};
  for (const auto& [suffix, unit] : suffixes) {
    if (text.size() <= suffix.size() || !text.ends_with(suffix)) continue;
    const std::string number = text.substr(0, text.size() - suffix.size());
    if (number.size() > 15 || number.find_first_not_of("0123456789") != std::string::npos) break;
    const std::size_t value = std::stoull(number);
    if (value == 0 || value > (std::size_t{1} << 48) / unit) break;
    return value * unit;
  }
  throw std::invalid_argument(
      fmt::format("--simulate {}: expected bytes from 1 to 2^48, as 4096, 512MiB or 80GiB", text));
}

// A number from low to high (NaN and trailing characters refused), for FLAG.
double parse_number(const std::string& flag, const std::string& text, double low, double high,
                    const char* expected) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(value >= low && value <= high))
    throw std::invalid_argument(fmt::format("{} {}: expected {}", flag, text, expected));
  return value;
}

// The OS provider holds a descriptor per page: the pages this process may hold, once its
// soft descriptor limit is raised to the hard one (a few hundred kept for the program).
std::size_t page_descriptors() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &limit);
    (void)::getrlimit(RLIMIT_NOFILE, &limit);
  }
  constexpr std::size_t spare = 256;  // the program's own descriptors
  if (limit.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  return limit.rlim_cur > spare ? static_cast<std::size_t>(limit.rlim_cur) - spare : 0;
}

int usage() {
  std::fprintf(
      stderr,
      "usage: vmm-replay TRACE [--location gpu0|os_host] [--simulate BYTES] [--lag EVENTS] [--after FIRST] "
      "[--json FILE] [--repeat N] [--max-ratio R] [--headroom SHARE]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string trace_path;
  std::string json_path;
  std::string first_path;
  std::optional<vmm::location> where;
  int repeat = 1;
  std::size_t simulate_bytes = 0;
  double max_ratio = 0;
  std::optional<std::uint64_t> lag;
  vmm::memory_resource_properties properties;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", arg));
      return argv[++i];
    };
    if (arg == "--location")
      where = parse_location(value());
    else if (arg == "--json")
      json_path = value();
    else if (arg == "--after")
      first_path = value();
    else if (arg == "--simulate")
      simulate_bytes = parse_bytes(value());
    else if (arg == "--max-ratio")
      max_ratio = parse_number(arg, value(), 1, 1000, "a number from 1 to 1000");
    else if (arg == "--headroom")
      properties.headroom =
          parse_number(arg, value(), 0, 1, "a share from 0 to 1, as 0.0078125 (0: the resource's default)");
    else if (arg == "--lag") {
      const std::string n = value();
      if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos)
        throw std::invalid_argument(fmt::format("--lag {}: expected 0 to 999999999 trace events", n));
      lag = std::stoull(n);
    } else if (arg == "--repeat") {
      const std::string n = value();
      if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string::npos ||
          std::stoi(n) < 1)
        throw std::invalid_argument(fmt::format("--repeat {}: expected 1 to 9999", n));
      repeat = std::stoi(n);
    } else if (!arg.empty() && arg[0] == '-')
      return usage();
    else if (trace_path.empty())
      trace_path = arg;
    else
      return usage();
  }
  if (trace_path.empty()) return usage();
  if (!where) where = vmm::gpu_available() ? vmm::location::device(0) : vmm::location::os_host();
  if (simulate_bytes != 0 && where->kind != vmm::memory_kind::os_host)
    throw std::invalid_argument("--simulate is for --location os_host only");
  if (lag && where->kind != vmm::memory_kind::os_host)
    throw std::invalid_argument("--lag is for --location os_host only (a GPU has its own timeline)");

  // On the OS provider the descriptors bound the pages: a --simulate budget that needs more
  // is refused (exit status 4); otherwise the resource's max_size stays within them.
  const std::size_t os_pages = where->kind == vmm::memory_kind::os_host ? page_descriptors() : SIZE_MAX;
  const std::size_t os_granularity = vmm::os_host_options{}.granularity;
  if (simulate_bytes != 0 && simulate_bytes / os_granularity > os_pages) {
    std::fprintf(stderr,
                 "vmm-replay: --simulate needs %zu descriptors (one per page), and this process may open "
                 "%zu for pages (ulimit -n): give a smaller budget or raise the limit\n",
                 simulate_bytes / os_granularity, os_pages);
    return 4;
  }

  std::uint32_t stream_count = 0;
  const std::vector<event> events = parse(trace_path, stream_count);
  std::uint32_t first_streams = 0;
  const std::vector<event> first_events =
      first_path.empty() ? std::vector<event>{} : parse(first_path, first_streams);
  stream_count = std::max(stream_count, first_streams);

  // A pool of the resource's own, so that its figures are the resource's alone.
  std::optional<lagging_device> device;
  if (lag) device.emplace(*lag);
  auto pool = vmm::chunk_pool::create(
      simulate_bytes != 0 || device ? vmm::make_os_host_provider({.commit_budget = simulate_bytes,
                                                                  .commit_on_create = simulate_bytes == 0,
                                                                  .executor = device ? &*device : nullptr})
                                    : vmm::provider_for(*where));
  const std::size_t memory = pool->provider()->capabilities().physical_memory_size;
  const std::size_t granularity = pool->granularity();
  if (os_pages != SIZE_MAX && memory / granularity > os_pages) properties.max_size = os_pages * granularity;
  vmm::memory_resource resource(pool, properties);
  vmm::stream_executor& executor = pool->provider()->executor();
  std::vector<vmm::owned_stream> owned;
  std::vector<vmm::stream_ref> streams{vmm::stream_ref()};  // stream 0: the legacy default stream
  for (std::uint32_t s = 1; s < stream_count; ++s) {
    owned.emplace_back(executor);
    streams.push_back(owned.back().get());
  }

  struct live_allocation {
    void* pointer = nullptr;
    std::uint64_t bytes = 0;
    std::uint32_t stream = 0;
    double allocate_ns = 0;
  };
  std::vector<live_allocation> live(std::max(events.size(), first_events.size()));  // by dense id
  const auto free_live = [&] {
    for (live_allocation& slot : live)
      if (slot.pointer != nullptr) {
        resource.deallocate(streams[slot.stream], slot.pointer, slot.bytes);
        slot.pointer = nullptr;
      }
  };
  // A replay that fails (the trace needs more than the device has) gives its live set back.
  struct on_exit {
    const decltype(free_live)& run;
    ~on_exit() { run(); }
  } release_live{free_live};
  if (!first_events.empty()) {
    for (const event& e : first_events) {
      if (device) device->tick();
      live_allocation& slot = live[e.id];
      if (e.allocate)
        slot = {resource.allocate(streams[e.stream], e.bytes), e.bytes, e.stream};
      else
        resource.deallocate(streams[slot.stream], std::exchange(slot.pointer, nullptr), slot.bytes);
    }
    free_live();
    resource.synchronize();  // as vmm_torch.trim(): the device idle, every free passed
    resource.trim_to(0);
    resource.reset_high_water_marks();
  }
  // The counts of the resource's lifetime, from here on: TRACE's alone (not FIRST's, nor its trim).
  const vmm::memory_resource_statistics before = resource.statistics();
  const auto device_before = device ? device->waits() : std::pair<std::uint64_t, std::uint64_t>{};
  // Samples in the call clock's ticks until the replay ends, then in ns.
  std::vector<double> allocate_ns;
  std::vector<double> deallocate_ns;
  std::vector<double> pair_ns;
  std::uint64_t live_bytes = 0;
  std::uint64_t peak_live = 0;
  const auto started = std::chrono::steady_clock::now();
  vmm::tools::call_clock timer;
  for (int pass = 0; pass < repeat; ++pass) {
    const bool last_pass = pass + 1 == repeat;
    for (const event& e : events) {
      if (device) device->tick();
      live_allocation& slot = live[e.id];
      if (e.allocate) {
        const std::uint64_t t0 = timer.now();
        slot.pointer = resource.allocate(streams[e.stream], e.bytes);
        const std::uint64_t t1 = timer.now();
        slot.bytes = e.bytes;
        slot.stream = e.stream;
        slot.allocate_ns = static_cast<double>(t1 - t0);
        allocate_ns.push_back(slot.allocate_ns);
        live_bytes += e.bytes;
        peak_live = std::max(peak_live, live_bytes);
      } else {
        const std::uint64_t t0 = timer.now();
        resource.deallocate(streams[slot.stream], slot.pointer, slot.bytes);
        const std::uint64_t t1 = timer.now();
        const auto ns = static_cast<double>(t1 - t0);
        deallocate_ns.push_back(ns);
        pair_ns.push_back(slot.allocate_ns + ns);
        live_bytes -= slot.bytes;
        slot.pointer = nullptr;
      }
    }
    if (!last_pass) {  // the next pass starts from nothing live
      free_live();
      live_bytes = 0;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  timer.calibrate();
  for (std::vector<double>* samples : {&allocate_ns, &deallocate_ns, &pair_ns})
    for (double& ticks : *samples) ticks = timer.to_ns(ticks);
  vmm::memory_resource_statistics after = resource.statistics();
  after.pages_created -= before.pages_created;
  after.pages_stitched -= before.pages_stitched;
  after.pages_released -= before.pages_released;
  after.host_waits -= before.host_waits;
  after.slow_path_time -= before.slow_path_time;
  after.host_wait_time -= before.host_wait_time;

  // The largest single allocation still possible, the trace's last live set allocated.
  std::uint64_t low = 0;
  std::uint64_t high = resource.properties().max_size / granularity + 1;  // in pages
  while (high - low > 1) {
    const std::uint64_t mid = low + (high - low) / 2;
    try {
      void* p = resource.allocate({}, mid * granularity);
      resource.deallocate({}, p, mid * granularity);
      low = mid;
    } catch (const vmm::out_of_memory&) {
      high = mid;
    }
  }
  const std::uint64_t largest_after = low * granularity;
  free_live();

  const percentiles a = of(allocate_ns);
  const percentiles d = of(deallocate_ns);
  const percentiles p = of(pair_ns);
  // What one timing costs by itself: every sample above includes it (the pair twice).
  std::vector<double> empty_ns;
  empty_ns.reserve(4096);
  for (int i = 0; i < 4096; ++i) {
    const std::uint64_t t0 = timer.now();
    const std::uint64_t t1 = timer.now();
    empty_ns.push_back(timer.to_ns(static_cast<double>(t1 - t0)));
  }
  const double clock_ns = of(empty_ns).median;
  const double ratio = static_cast<double>(after.reserved_high) / static_cast<double>(peak_live);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  fmt::print(
      "trace        {} ({} events, {} stream(s), {} pass(es)) on {}{}\n", trace_path, events.size(),
      stream_count, repeat, vmm::to_string(*where),
      simulate_bytes != 0 ? fmt::format(" (simulated: {} bytes, pages at first touch)", simulate_bytes) : "");
  fmt::print("peak live      {:.3f} GiB ({} bytes)\n", static_cast<double>(peak_live) / gib, peak_live);
  fmt::print("peak reserved  {:.3f} GiB ({} bytes)\n", static_cast<double>(after.reserved_high) / gib,
             after.reserved_high);
  fmt::print("reserved/live  {:.4f} (headroom {:.6g})\n", ratio, resource.properties().headroom);
  fmt::print("largest allocation possible at the end: {:.3f} GiB (max_size {:.3f} GiB)\n",
             static_cast<double>(largest_after) / gib,
             static_cast<double>(resource.properties().max_size) / gib);
  fmt::print("host time (ns)   median     p99\n");
  fmt::print("  allocate     {:8.0f} {:8.0f}\n", a.median, a.p99);
  fmt::print("  deallocate   {:8.0f} {:8.0f}\n", d.median, d.p99);
  fmt::print("  pair         {:8.0f} {:8.0f}\n", p.median, p.p99);
  fmt::print("  (timed with the {}; each timing includes {:.0f} ns of clock reads, the pair twice)\n",
             timer.name(), clock_ns);
  fmt::print("pages: {} created, {} stitched, {} released; {} address ranges; ", after.pages_created,
             after.pages_stitched, after.pages_released, after.segments);
  const auto ms = [](std::chrono::nanoseconds t) {
    return std::chrono::duration<double, std::milli>(t).count();
  };
  fmt::print("{} host waits of the resource; slow path {:.1f} ms of host time ({:.1f} ms waiting); ",
             after.host_waits, ms(after.slow_path_time), ms(after.host_wait_time));
  fmt::print("replay {:.2f} s\n", seconds);
  auto [waits, waited] = device ? device->waits() : std::pair<std::uint64_t, std::uint64_t>{};
  waits -= device_before.first;
  waited -= device_before.second;
  if (device)
    fmt::print(
        "device {} events behind the host: the host waited for it {} times, {} events of work in all\n",
        device->lag(), waits, waited);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << fmt::format(
        "{{\"trace\": \"{}\", \"location\": \"{}\", \"simulated\": {}, \"events\": {}, \"passes\": {}, "
        "\"peak_live_bytes\": {}, "
        "\"peak_reserved_bytes\": {}, \"reserved_over_live\": {:.6f}, \"headroom\": {:.9g}, "
        "\"largest_possible_bytes\": {}, "
        "\"allocate_ns\": {{\"median\": {:.1f}, \"p99\": {:.1f}}}, \"deallocate_ns\": {{\"median\": {:.1f}, "
        "\"p99\": {:.1f}}}, \"pair_ns\": {{\"median\": {:.1f}, \"p99\": {:.1f}}}, \"clock_ns\": {:.1f}, "
        "\"clock\": \"{}\", \"pages_created\": {}, \"pages_stitched\": {}, \"pages_released\": {}, "
        "\"segments\": {}, "
        "\"host_waits\": {}, \"slow_path_ms\": {:.3f}, \"host_wait_ms\": {:.3f}, \"lag_events\": {}, "
        "\"device_waits\": {}, \"events_waited\": {}}}\n",
        trace_path, vmm::to_string(*where), simulate_bytes != 0, events.size(), repeat, peak_live,
        after.reserved_high, ratio, resource.properties().headroom, largest_after, a.median, a.p99, d.median,
        d.p99, p.median, p.p99, clock_ns, timer.name(), after.pages_created, after.pages_stitched,
        after.pages_released, after.segments, after.host_waits, ms(after.slow_path_time),
        ms(after.host_wait_time), device ? device->lag() : 0, waits, waited);
    if (!out) throw std::runtime_error(fmt::format("--json {}: cannot write", json_path));
  }
  if (max_ratio != 0 && ratio > max_ratio) {
    std::fprintf(stderr, "vmm-replay: reserved/live %.4f is past --max-ratio %.4f\n", ratio, max_ratio);
    return 3;
  }
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "vmm-replay: %s\n", error.what());
  return 1;
}
