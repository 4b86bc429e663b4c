#pragma once
// Fault sweeps: every OS or driver call an operation makes is made to fail in turn, and
// each failure is checked for what it leaves behind.
//
//     const sweep_report report = sweep<grow_path>("grow", provider, fault::all_os,
//                                                  {ENOMEM, EINVAL, EINTR});
//
// For each site of `sites` on its own (so that a failure names the call that failed), the
// sweep runs the operation once only counting that site's calls: N injection points. Then
// for n = 1..N and each error it sets up a fresh state (a new pool, and the path's own
// objects), takes a baseline (open fds, the address space's usage, /proc/self/maps lines),
// makes the nth call fail with the error, runs the operation and asserts:
//  - it succeeded, or threw an exception that the header documents for the call that was
//    running (a path names the call and its documented exceptions as it goes, during());
//    an os_error carries the injected errno, a driver_error the injected CUresult;
//  - EINTR at a call the code must retry (fallocate, recvmsg, sendmsg, poll) changes
//    nothing: the operation succeeds;
//  - the path's own check (its strong guarantee, or its results on success);
//  - after the path's objects are destroyed, vmm::collect_retired(true) and a trim of the
//    pool to 0: the pool holds and lends nothing, and the fds, the usage and the maps lines
//    are the baseline's: nothing leaked.
// A failing run is reported with its path, site, n and error: a minimal reproduction.
// Under ThreadSanitizer each call fails with the first error only (tests/sanitizers.hpp).
//
// A path is a class with a constructor taking the sweep_context (the setup, with no fault
// armed), operator() (the operation), check(const outcome&) (after the fault is disarmed,
// before teardown) and static pool_options(granularity). It derives from sweep_path.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <typeinfo>
#include <vector>

#include "fault_injection.hpp"  // vmm/src: test-only fault injection
#include "process_resources.hpp"
#include "sanitizers.hpp"
#include "vmm/address_space.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/error.hpp"
#include "vmm/ipc/fd_channel.hpp"
#include "vmm/ipc/protocol_error.hpp"
#include "vmm/provider.hpp"
#include "vmm/retirement.hpp"

namespace vmm::testing {

namespace fault = vmm::detail::fault;

// The exceptions an operation may end in, as a mask.
enum failure_kind : unsigned {
  fails_out_of_memory = 1u << 0,
  fails_os_error = 1u << 1,
  fails_invalid_argument = 1u << 2,
  fails_driver_error = 1u << 3,
  fails_protocol_error = 1u << 4,
  fails_timeout = 1u << 5,
  fails_peer_closed = 1u << 6,
  fails_other = 1u << 7,  // anything else: never documented
};

inline std::string failure_names(unsigned kinds) {
  static constexpr const char* names[] = {"out_of_memory", "os_error",       "invalid_argument",
                                          "driver_error",  "protocol_error", "timeout_error",
                                          "peer_closed",   "other exception"};
  std::string result;
  for (unsigned bit = 0; bit < 8; ++bit)
    if ((kinds & (1u << bit)) != 0) result += fmt::format("{}{}", result.empty() ? "" : " | ", names[bit]);
  return result.empty() ? "nothing" : result;
}

inline const char* site_name(std::uint32_t site) {
  switch (site) {
    case fault::memfd_create:
      return "memfd_create";
    case fault::fallocate:
      return "fallocate";
    case fault::mmap:
      return "mmap";
    case fault::munmap:
      return "munmap";
    case fault::mprotect:
      return "mprotect";
    case fault::fcntl:
      return "fcntl";
    case fault::fstat:
      return "fstat";
    case fault::sendmsg:
      return "sendmsg";
    case fault::recvmsg:
      return "recvmsg";
    case fault::poll:
      return "poll";
    case fault::driver:
      return "driver";
    case fault::provider_export:
      return "provider export";
    default:
      return "?";
  }
}

inline std::string error_name(std::uint32_t site, int error) {
  if (site == fault::driver) {
    if (error == 2) return "CUDA_ERROR_OUT_OF_MEMORY";
    if (error == 999) return "CUDA_ERROR_UNKNOWN";
    return fmt::format("CUresult {}", error);
  }
  const char* name = ::strerrorname_np(error);
  return name != nullptr ? name : fmt::format("errno {}", error);
}

// The calls that a signal may interrupt, which vmm must call again after EINTR.
inline constexpr std::uint32_t interruptible_sites =
    fault::fallocate | fault::sendmsg | fault::recvmsg | fault::poll;

// How an operation ended.
struct outcome {
  unsigned kind = 0;  // a failure_kind; 0: it succeeded
  std::string what;
  int code = 0;  // errno of an os_error, CUresult of a driver_error
  [[nodiscard]] bool succeeded() const noexcept { return kind == 0; }
};

// The exception being handled, classified (most derived first).
inline outcome current_outcome() {
  try {
    throw;
  } catch (const ipc::peer_closed& error) {
    return {fails_peer_closed, error.what(), error.code().value()};
  } catch (const ipc::timeout_error& error) {
    return {fails_timeout, error.what(), error.code().value()};
  } catch (const os_error& error) {
    return {fails_os_error, error.what(), error.code().value()};
  } catch (const out_of_memory& error) {
    return {fails_out_of_memory, error.what(), 0};
  } catch (const invalid_argument& error) {
    return {fails_invalid_argument, error.what(), 0};
  } catch (const driver_error& error) {
    return {fails_driver_error, error.what(), error.result()};
  } catch (const ipc::protocol_error& error) {
    return {fails_protocol_error, error.what(), 0};
  } catch (const std::exception& error) {
    return {fails_other, fmt::format("{}: {}", typeid(error).name(), error.what()), 0};
  } catch (...) {
    return {fails_other, "an exception that is no std::exception", 0};
  }
}

// The failure armed for one run. Pausing it (without_faults) lets calls through uncounted,
// so that a path can read memory through the driver for its checks in the middle of an
// operation without spending injection points.
class armed_fault {
 public:
  armed_fault(std::uint32_t site, std::uint64_t nth, int error) noexcept
      : site_(site), nth_(nth), error_(error) {
    current_ = this;
    resume();
  }
  armed_fault(const armed_fault&) = delete;
  armed_fault& operator=(const armed_fault&) = delete;
  ~armed_fault() {
    pause();
    current_ = nullptr;
  }

  void pause() noexcept {
    if (!running_) return;
    counted_ += fault::calls();
    fired_ = fired_ || fault::fired();
    fault::disarm();
    running_ = false;
  }
  void resume() noexcept {
    if (running_) return;
    // Once fired (or only counting), the rest of the run only counts.
    fault::arm(site_, fired_ || nth_ == 0 ? 0 : nth_ - counted_, error_);
    running_ = true;
  }
  // Calls at the site so far, paused stretches excluded.
  [[nodiscard]] std::uint64_t calls() const noexcept { return counted_ + (running_ ? fault::calls() : 0); }
  [[nodiscard]] bool fired() const noexcept { return fired_ || (running_ && fault::fired()); }
  [[nodiscard]] static armed_fault* current() noexcept { return current_; }

 private:
  std::uint32_t site_;
  std::uint64_t nth_;
  int error_;
  std::uint64_t counted_ = 0;
  bool fired_ = false;
  bool running_ = false;
  static inline armed_fault* current_ = nullptr;
};

// Runs `fn` with the armed fault, if any, paused.
template <class Fn>
decltype(auto) without_faults(Fn&& fn) {
  struct resume_at_exit {
    armed_fault* fault;
    ~resume_at_exit() {
      if (fault != nullptr) fault->resume();
    }
  } guard{armed_fault::current()};
  if (guard.fault != nullptr) guard.fault->pause();
  return std::forward<Fn>(fn)();
}

// What a path gets to set up its state.
struct sweep_context {
  std::shared_ptr<memory_provider> provider;
  std::shared_ptr<chunk_pool> pool;  // fresh for every run
  [[nodiscard]] std::size_t granularity() const { return provider->capabilities().granularity; }
};

// The base of a path: says which call of the operation is running and what its header
// documents that it throws, so that a failure is checked against that call's contract.
class sweep_path {
 public:
  static chunk_pool_options pool_options(std::size_t /*granularity*/) { return {}; }
  [[nodiscard]] const char* call() const noexcept { return call_; }
  [[nodiscard]] unsigned documented() const noexcept { return documented_; }

 protected:
  void during(const char* call, unsigned documented) noexcept {
    call_ = call;
    documented_ = documented;
  }

 private:
  const char* call_ = "setup";
  unsigned documented_ = 0;
};

// Cleanup failures reported (not thrown) by destructors and housekeeping during a sweep.
inline std::atomic<std::uint64_t> cleanup_reports{0};
inline void count_cleanup_report(const char* /*what*/) noexcept {
  cleanup_reports.fetch_add(1);
}

// Installs count_cleanup_report for a scope.
class counting_cleanup_reports {
 public:
  counting_cleanup_reports() noexcept : previous_(set_cleanup_failure_handler(&count_cleanup_report)) {}
  counting_cleanup_reports(const counting_cleanup_reports&) = delete;
  counting_cleanup_reports& operator=(const counting_cleanup_reports&) = delete;
  ~counting_cleanup_reports() { set_cleanup_failure_handler(previous_); }

 private:
  cleanup_failure_handler previous_;
};

// What a process holds that a run must give back.
struct held_resources {
  std::size_t fds = 0;
  address_space_usage usage;
  std::vector<address_interval> maps;
};

inline held_resources resources_of(const memory_provider& provider) {
  return {open_fd_count(), provider.address_space().usage(), process_mappings()};
}

inline std::string to_string(const address_space_usage& usage) {
  return fmt::format("{} ranges ({} bytes), {} handles ({} bytes), {} mappings ({} bytes)", usage.ranges,
                     usage.range_bytes, usage.handles, usage.handle_bytes, usage.mappings,
                     usage.mapped_bytes);
}

// `reservations`: look for reservations left behind too (on the OS provider: the CUDA
// driver reserves address ranges of its own as it works).
inline void expect_same_resources(const held_resources& before, const held_resources& after,
                                  bool reservations) {
  EXPECT_EQ(after.fds, before.fds) << "open file descriptors leaked (or closed twice)";
  EXPECT_TRUE(after.usage == before.usage)
      << "address space usage: before " << to_string(before.usage) << "; after " << to_string(after.usage);
  EXPECT_EQ(memfd_mappings(after.maps), memfd_mappings(before.maps)) << "memfd mappings in /proc/self/maps";
  if (reservations) {
    EXPECT_EQ(bytes_reserved_since(before.maps, after.maps), 0u) << "bytes reserved in /proc/self/maps";
  }
}

// The injection points of one path, and what the runs ended in.
struct sweep_report {
  std::string path;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> points;  // (site, calls)
  std::uint64_t runs = 0;
  std::uint64_t injected = 0;   // runs where the failure fired
  std::uint64_t succeeded = 0;  // runs that succeeded all the same (retried, or recovered)
  std::uint64_t cleanup_reports = 0;
  std::map<std::string, std::uint64_t> outcomes;  // "site error -> result": runs

  [[nodiscard]] std::uint64_t total_points() const {
    std::uint64_t total = 0;
    for (const auto& [site, calls] : points) total += calls;
    return total;
  }
};

namespace detail {

template <class Path>
void run_once(const std::shared_ptr<memory_provider>& provider, std::uint32_t site, std::uint64_t nth,
              int error, sweep_report& report) {
  SCOPED_TRACE(fmt::format("path {}, site {}, call {}, error {}", report.path, site_name(site), nth,
                           error_name(site, error)));
  const std::uint64_t reports_before = cleanup_reports.load();
  const auto pool = chunk_pool::create(provider, Path::pool_options(provider->capabilities().granularity));
  const held_resources before = resources_of(*provider);
  {
    Path path(sweep_context{provider, pool});
    outcome result;
    bool fired = false;
    {
      armed_fault armed(site, nth, error);
      try {
        path();
      } catch (...) {
        result = current_outcome();
      }
      armed.pause();
      fired = armed.fired();
    }
    ++report.runs;
    report.injected += fired ? 1 : 0;
    report.succeeded += result.succeeded() ? 1 : 0;
    const std::string ended =
        result.succeeded() ? "succeeded" : failure_names(result.kind) + " from " + path.call();
    ++report.outcomes[fmt::format("{} {} -> {}", site_name(site), error_name(site, error), ended)];
    if (!fired) {
      EXPECT_TRUE(result.succeeded()) << "no failure was injected, yet " << ended << ": " << result.what;
    } else if (error == EINTR && (site & interruptible_sites) != 0) {
      EXPECT_TRUE(result.succeeded())
          << "EINTR from " << site_name(site) << " must be retried, yet " << ended << ": " << result.what;
    } else if (!result.succeeded()) {
      EXPECT_NE(result.kind & path.documented(), 0u)
          << path.call() << " threw " << failure_names(result.kind) << ", but its header documents "
          << failure_names(path.documented()) << ": " << result.what;
      if (result.kind == fails_os_error || result.kind == fails_driver_error) {
        EXPECT_EQ(result.code, error)
            << "the error carries another code than the one injected: " << result.what;
      }
    }
    path.check(result);
  }
  collect_retired(true);
  const pool_statistics idle = pool->statistics();
  EXPECT_EQ(idle.used_current, 0u) << "the pool still lends chunks after everything was destroyed";
  pool->trim_to(0);
  const pool_statistics trimmed = pool->statistics();
  EXPECT_EQ(trimmed.reserved_current, 0u) << "the pool holds memory it cannot trim";
  EXPECT_EQ(trimmed.chunks_created, trimmed.chunks_released);
  expect_same_resources(before, resources_of(*provider),
                        provider->capabilities().where.kind == memory_kind::os_host);
  report.cleanup_reports += cleanup_reports.load() - reports_before;
}

}  // namespace detail

// See the file comment. Stops a path after a few failing runs (the first is the minimal
// reproduction); prints and records the number of injection points.
template <class Path>
sweep_report sweep(const std::string& name, const std::shared_ptr<memory_provider>& provider,
                   std::uint32_t sites, std::vector<int> errors) {
  const counting_cleanup_reports counting;
  sweep_report report;
  report.path = name;
  // Failed assertions of the running test so far.
  const auto failed_parts = [] {
    const ::testing::TestResult& result = *::testing::UnitTest::GetInstance()->current_test_info()->result();
    int failed = 0;
    for (int i = 0; i < result.total_part_count(); ++i)
      failed += result.GetTestPartResult(i).failed() ? 1 : 0;
    return failed;
  };
  int failing_runs = 0;
  for (std::uint32_t site = 1; site != 0 && site <= sites; site <<= 1) {
    if ((sites & site) == 0) continue;
    std::uint64_t points = 0;
    {
      const auto pool =
          chunk_pool::create(provider, Path::pool_options(provider->capabilities().granularity));
      Path path(sweep_context{provider, pool});
      armed_fault counting_only(site, 0, 0);
      path();  // without a failure the operation must succeed
      counting_only.pause();
      points = counting_only.calls();
    }
    collect_retired(true);
    report.points.emplace_back(site, points);
    for (std::uint64_t nth = 1; nth <= points; ++nth) {
      for (const int error : errors) {
        if (under_thread_sanitizer && error != errors.front()) break;  // see sanitizers.hpp
        const int failed_before = failed_parts();
        detail::run_once<Path>(provider, site, nth, error, report);
        if (failed_parts() > failed_before) ++failing_runs;
        if (failing_runs >= 3) {
          ADD_FAILURE() << "path " << name << ": stopped after 3 failing runs";
          return report;
        }
      }
    }
  }
  std::string per_site;
  for (const auto& [site, calls] : report.points)
    per_site += fmt::format("{}{} {}", per_site.empty() ? "" : ", ", site_name(site), calls);
  std::printf(
      "fault sweep %s: %llu injection points (%s); %llu runs, %llu failures injected, %llu succeeded "
      "anyway, %llu cleanup failures reported\n",
      name.c_str(), static_cast<unsigned long long>(report.total_points()), per_site.c_str(),
      static_cast<unsigned long long>(report.runs), static_cast<unsigned long long>(report.injected),
      static_cast<unsigned long long>(report.succeeded),
      static_cast<unsigned long long>(report.cleanup_reports));
  for (const auto& [what, runs] : report.outcomes)
    std::printf("  %s: %llu\n", what.c_str(), static_cast<unsigned long long>(runs));
  std::fflush(stdout);
  ::testing::Test::RecordProperty("injection_points", std::to_string(report.total_points()));
  for (const auto& [site, calls] : report.points)
    ::testing::Test::RecordProperty(std::string("injection_points_") + site_name(site),
                                    std::to_string(calls));
  return report;
}

}  // namespace vmm::testing
