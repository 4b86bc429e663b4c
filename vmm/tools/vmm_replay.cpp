// vmm-replay: replays an allocation trace (trace.hpp) through vmm::memory_resource and
// reports what the resource reserved against what was in use, and what each call cost the
// host. `vmm-replay --help` lists the options; docs/tools.md describes each, the report and
// its JSON fields.
//
// Reported: peak live bytes (the trace's own, as requested), peak reserved bytes (physical
// memory the resource held: mapped or spare), their ratio, the largest single allocation
// still possible at the end (with the trace's last live set still allocated), and the host
// time of each allocate and deallocate (median and 99th percentile) and of an
// allocate + deallocate pair (the sum of the two, so two clock readings' cost; the median of
// an empty reading is printed beside them). Calls are timed with the TSC where it is
// invariant, otherwise with steady_clock (call_clock.hpp). Also the pages created, stitched
// and released, and the resource's host waits (memory_resource_statistics::host_waits:
// allocations that blocked for a stream).
//
// --simulate: the OS provider's commit budget is BYTES and its pages come at first touch, so
// that a trace larger than this machine's memory replays (nothing is written to the memory:
// the figures are the resource's bookkeeping, the same as with every page committed). The
// provider holds a descriptor per page: a budget needing more than `ulimit -n` allows is
// refused with exit status 4.
// --lag: the memory's stream work runs on a simulated device that is EVENTS trace events
// behind the host, as a GPU is behind a program that queues kernels ahead of it: a free's
// point passes only once the host has replayed EVENTS more events, unless the resource waits
// for it (counted and printed). Without --lag, OS host memory is synchronous (every free
// passes at once) and a GPU's idle streams pass almost at once: neither shows what frees
// still queued behind running work cost.
// --after: replays FIRST before TRACE in the same resource, frees what it left live,
// synchronizes and trims the resource to nothing and resets its peaks (what
// bench/torch_allocators.py does between workloads, through vmm_torch.trim()): the figures
// are TRACE's alone, on the layout FIRST left behind.
// --series: the live and reserved bytes (reserved also by page size) after every few events
// of TRACE, as CSV for python -m vmm.plot; the resource's statistics are read between calls,
// outside the timings.

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "call_clock.hpp"
#include "cli.hpp"
#include "trace.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/provider.hpp"

namespace {

using vmm::tools::trace_event;

// Exit statuses of vmm-replay's own, beside vmm::tools' 0, 1 and 2.
constexpr int exit_past_max_ratio = 3;
constexpr int exit_too_few_descriptors = 4;

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

// The command line, checked.
struct options {
  std::string trace_path;
  std::string json_path;
  std::string series_path;
  std::string first_path;
  std::optional<vmm::location> where;
  int repeat = 1;
  std::uint64_t simulate_bytes = 0;
  double max_ratio = 0;
  std::optional<std::uint64_t> lag;
  double headroom = 0;
};

// The options, or the status to exit with (--help, --version, a bad option).
std::variant<options, int> parse_options(int argc, char** argv) {
  options o;
  CLI::App app(
      "Replays an allocation trace through vmm::memory_resource and reports the memory it "
      "reserved against the memory in use, and what each call cost the host (docs/tools.md).\n"
      "Exit status: 0 done, 1 an error (a malformed trace names its line), 2 a bad option, "
      "3 past --max-ratio, 4 --simulate needs more descriptors than ulimit -n allows.",
      "vmm-replay");
  vmm::tools::prepare(app);
  app.add_option("TRACE", o.trace_path, "Required: the trace, text, gzip-compressed or not (docs/tools.md)")
      ->default_str("none");
  std::string location;
  app.add_option("--location", location, "Where the memory lives: os_host or gpu<N>")
      ->type_name("WHERE")
      ->default_str("gpu0 when a GPU is there, else os_host")
      ->check(vmm::tools::location_check());
  vmm::tools::add_byte_size(
      app, "--simulate", o.simulate_bytes,
      "os_host only: a commit budget of SIZE (from 1 byte to 256TiB), pages at first touch, "
      "so that a trace larger than this machine's memory replays",
      1, vmm::tools::trace_size_limit, "none: every page committed");
  std::uint64_t lag = 0;
  app.add_option("--lag", lag,
                 "os_host only: the memory's stream work runs EVENTS trace events behind the host")
      ->type_name("EVENTS")
      ->default_str("none: synchronous")
      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{999999999}));
  app.add_option(
         "--after", o.first_path,
         "Replay FIRST, free its live set and trim the resource before TRACE: the figures are TRACE's")
      ->type_name("FIRST")
      ->default_str("none");
  app.add_option("--json", o.json_path, "Also write the report as JSON to FILE (docs/tools.md: its fields)")
      ->type_name("FILE")
      ->default_str("none");
  app.add_option("--series", o.series_path,
                 "Also write reserved and live bytes over the replay as CSV to FILE, at most 2000 rows "
                 "(docs/tools.md: its columns; python -m vmm.plot draws it)")
      ->type_name("FILE")
      ->default_str("none");
  app.add_option("--repeat", o.repeat, "Replay TRACE N times in one resource; the figures cover every pass")
      ->type_name("N")
      ->check(CLI::Range(1, 9999));
  app.add_option("--max-ratio", o.max_ratio, "Exit with status 3 when peak reserved / peak live passes R")
      ->type_name("R")
      ->default_str("none")
      ->check(vmm::tools::number_from(1, 1000));
  app.add_option("--headroom", o.headroom,
                 "memory_resource_properties::headroom: the idle share of its peak the resource may keep "
                 "mapped (0: the resource's default)")
      ->type_name("SHARE")
      ->check(vmm::tools::number_from(0, 1));
  if (const auto status = vmm::tools::parse(app, argc, argv)) return *status;
  if (o.trace_path.empty()) return vmm::tools::usage_error(app, "TRACE is required");
  if (!location.empty()) o.where = vmm::tools::parse_location(location);
  if (app.count("--lag") != 0) o.lag = lag;
  return o;
}

// "TRACE:LINE: what failed: "the line"": for an event the resource refused.
std::string at_event(const std::string& path, const trace_event& e, const std::exception& error) {
  const std::string call = e.allocate ? fmt::format("allocating {} bytes on stream {}", e.bytes, e.stream)
                                      : std::string("deallocating");
  return fmt::format("{}:{}: {} failed: {}: \"{}\"", path, e.line, call, error.what(),
                     vmm::tools::trace_line(path, e.line));
}

}  // namespace

int main(int argc, char** argv) try {
  const auto parsed = parse_options(argc, argv);
  if (const int* status = std::get_if<int>(&parsed)) return *status;
  const options& o = std::get<options>(parsed);
  std::optional<vmm::location> where = o.where;
  const int repeat = o.repeat;
  const std::uint64_t simulate_bytes = o.simulate_bytes;
  const std::optional<std::uint64_t> lag = o.lag;
  vmm::memory_resource_properties properties;
  properties.headroom = o.headroom;
  if (!where) where = vmm::gpu_available() ? vmm::location::device(0) : vmm::location::os_host();
  if (simulate_bytes != 0 && where->kind != vmm::memory_kind::os_host)
    throw vmm::invalid_argument("--simulate is for --location os_host only");
  if (lag && where->kind != vmm::memory_kind::os_host)
    throw vmm::invalid_argument("--lag is for --location os_host only (a GPU has its own timeline)");

  // On the OS provider the descriptors bound the pages: a --simulate budget that needs more
  // is refused (exit status 4); otherwise the resource's max_size stays within them.
  const std::size_t os_pages = where->kind == vmm::memory_kind::os_host ? page_descriptors() : SIZE_MAX;
  const std::size_t os_granularity = vmm::os_host_options{}.granularity;
  if (simulate_bytes != 0 && simulate_bytes / os_granularity > os_pages) {
    std::fprintf(stderr,
                 "vmm-replay: --simulate needs %zu descriptors (one per page), and this process may open "
                 "%zu for pages (ulimit -n): give a smaller budget or raise the limit\n",
                 static_cast<std::size_t>(simulate_bytes / os_granularity), os_pages);
    return exit_too_few_descriptors;
  }

  // Opened before the replay, so that a path that cannot be written fails at once; a replay
  // that fails leaves no series behind.
  struct series_file {
    std::string path;
    std::ofstream out;
    bool written = false;
    explicit operator bool() const noexcept { return !path.empty(); }
    ~series_file() {
      if (path.empty() || written) return;
      out.close();
      (void)std::remove(path.c_str());
    }
  } series{o.series_path, {}};
  if (series) {
    series.out.open(series.path);
    if (!series.out)
      throw std::runtime_error(
          fmt::format("--series {}: cannot write: {}", series.path, std::strerror(errno)));
  }

  const vmm::tools::trace replayed = vmm::tools::read_trace(o.trace_path);
  const std::vector<trace_event>& events = replayed.events;
  const vmm::tools::trace first =
      o.first_path.empty() ? vmm::tools::trace{} : vmm::tools::read_trace(o.first_path);
  const std::uint32_t stream_count = std::max(replayed.streams, first.streams);

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
  std::vector<live_allocation> live(std::max(replayed.allocations, first.allocations));  // by dense id
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
  if (!first.events.empty()) {
    for (const trace_event& e : first.events) {
      if (device) device->tick();
      live_allocation& slot = live[e.id];
      try {
        if (e.allocate)
          slot = {resource.allocate(streams[e.stream], e.bytes), e.bytes, e.stream};
        else
          resource.deallocate(streams[slot.stream], std::exchange(slot.pointer, nullptr), slot.bytes);
      } catch (const std::exception& error) {
        throw std::runtime_error(at_event(o.first_path, e, error));
      }
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
  // --series: a row after every `stride` events and after the last, so at most series_rows.
  constexpr std::uint64_t series_rows = 2000;
  const std::uint64_t total_events = events.size() * static_cast<std::uint64_t>(repeat);
  const std::uint64_t stride = std::max<std::uint64_t>(1, (total_events + series_rows - 1) / series_rows);
  std::uint64_t replayed_events = 0;
  std::uint64_t live_high_since_row = 0;  // the most live bytes since the last row
  if (series)
    series.out << "event,live_bytes,live_high_bytes,reserved_bytes,reserved_small_page_bytes,"
                  "reserved_large_page_bytes\n";
  const auto started = std::chrono::steady_clock::now();
  vmm::tools::call_clock timer;
  for (int pass = 0; pass < repeat; ++pass) {
    const bool last_pass = pass + 1 == repeat;
    for (const trace_event& e : events) {
      if (device) device->tick();
      live_allocation& slot = live[e.id];
      if (e.allocate) {
        const std::uint64_t t0 = timer.now();
        try {
          slot.pointer = resource.allocate(streams[e.stream], e.bytes);
        } catch (const std::exception& error) {
          // What the resource or the OS refused, and the line of the trace that asked for it.
          throw std::runtime_error(at_event(o.trace_path, e, error));
        }
        const std::uint64_t t1 = timer.now();
        slot.bytes = e.bytes;
        slot.stream = e.stream;
        slot.allocate_ns = static_cast<double>(t1 - t0);
        allocate_ns.push_back(slot.allocate_ns);
        live_bytes += e.bytes;
        peak_live = std::max(peak_live, live_bytes);
        live_high_since_row = std::max(live_high_since_row, live_bytes);
      } else {
        const std::uint64_t t0 = timer.now();
        try {
          resource.deallocate(streams[slot.stream], slot.pointer, slot.bytes);
        } catch (const std::exception& error) {
          throw std::runtime_error(at_event(o.trace_path, e, error));
        }
        const std::uint64_t t1 = timer.now();
        const auto ns = static_cast<double>(t1 - t0);
        deallocate_ns.push_back(ns);
        pair_ns.push_back(slot.allocate_ns + ns);
        live_bytes -= slot.bytes;
        slot.pointer = nullptr;
      }
      ++replayed_events;
      if (series && (replayed_events % stride == 0 || replayed_events == total_events)) {
        const vmm::memory_resource_statistics now = resource.statistics();
        series.out << fmt::format("{},{},{},{},{},{}\n", replayed_events, live_bytes, live_high_since_row,
                                  now.reserved_current, now.reserved_small_pages, now.reserved_large_pages);
        live_high_since_row = live_bytes;
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
      "trace        {} ({} events, {} stream(s), {} pass(es)) on {}{}\n", o.trace_path, events.size(),
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
  if (!o.json_path.empty()) {
    // Field names are stable (docs/tools.md lists them); a new field may be added, none renamed.
    const auto summary = [](const percentiles& x) {
      return nlohmann::ordered_json{{"median", x.median}, {"p99", x.p99}};
    };
    const nlohmann::ordered_json report = {
        {"trace", o.trace_path},
        {"location", vmm::to_string(*where)},
        {"simulated", simulate_bytes != 0},
        {"events", events.size()},
        {"passes", repeat},
        {"peak_live_bytes", peak_live},
        {"peak_reserved_bytes", after.reserved_high},
        {"reserved_small_pages_bytes", after.reserved_small_pages},
        {"reserved_large_pages_bytes", after.reserved_large_pages},
        {"reserved_over_live", ratio},
        {"headroom", resource.properties().headroom},
        {"largest_possible_bytes", largest_after},
        {"allocate_ns", summary(a)},
        {"deallocate_ns", summary(d)},
        {"pair_ns", summary(p)},
        {"clock_ns", clock_ns},
        {"clock", timer.name()},
        {"pages_created", after.pages_created},
        {"pages_stitched", after.pages_stitched},
        {"pages_released", after.pages_released},
        {"segments", after.segments},
        {"host_waits", after.host_waits},
        {"slow_path_ms", ms(after.slow_path_time)},
        {"host_wait_ms", ms(after.host_wait_time)},
        {"lag_events", device ? device->lag() : 0},
        {"device_waits", waits},
        {"events_waited", waited},
        {"vmm_version", vmm::version().text},
    };
    std::ofstream out(o.json_path);
    out << report.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
    if (!out) throw std::runtime_error(fmt::format("--json {}: cannot write", o.json_path));
  }
  if (series) {
    series.out.close();
    if (!series.out) throw std::runtime_error(fmt::format("--series {}: cannot write", series.path));
    series.written = true;
  }
  if (o.max_ratio != 0 && ratio > o.max_ratio) {
    std::fprintf(stderr, "vmm-replay: reserved/live %.4f is past --max-ratio %.4f\n", ratio, o.max_ratio);
    return exit_past_max_ratio;
  }
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "vmm-replay: %s\n", error.what());
  return vmm::tools::exit_error;
}
