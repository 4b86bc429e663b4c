#pragma once
/// @file
/// The exceptions vmm throws.
///
///     try {
///       buffer.resize(buffer.size() + batch_bytes, stream);
///     } catch (const vmm::out_of_memory& e) {   // a std::bad_alloc; the buffer is as it was
///       vmm::default_pool(vmm::location::device(0))->trim_to(0);   // then retry, or spill
///     }
///     vmm::set_cleanup_failure_handler(+[](const char* what) noexcept { log_error(what); });
///
/// Every public function reports failure with one of these:
///  - vmm::out_of_memory (a std::bad_alloc): the driver or the OS had no memory left, or a
///    pool's cap was reached;
///  - vmm::invalid_argument (a std::invalid_argument): the caller passed a bad size,
///    address, device, flag or handle; nothing was changed;
///  - vmm::driver_error: a CUDA driver call failed for another reason; carries the
///    CUresult, its name and the call;
///  - vmm::driver_unavailable (a driver_error): there is no libcuda, no GPU, or the driver
///    is too old for an entry point;
///  - vmm::os_error (a std::system_error): an OS call failed; carries errno.
/// Destructors never throw; they report failures through vmm::report_cleanup_failure.

#include <new>
#include <stdexcept>
#include <cstddef>
#include <string>
#include <string_view>
#include <system_error>

namespace vmm {

/// Out of memory: CUDA_ERROR_OUT_OF_MEMORY, ENOMEM/ENOSPC, or a pool cap reached.
class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(std::string message) : message_(std::move(message)) {}
  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

/// A bad argument (size, alignment, device, flag, handle). Nothing was changed.
class invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A CUDA driver call failed. what() names the call, its arguments and the error.
class driver_error : public std::runtime_error {
 public:
  driver_error(int result, std::string message) : std::runtime_error(std::move(message)), result_(result) {}
  /// The CUresult the driver returned (0 when the failure happened before any call).
  [[nodiscard]] int result() const noexcept { return result_; }

 private:
  int result_;
};

/// No libcuda.so.1, no GPU, or a driver too old for an entry point.
class driver_unavailable : public driver_error {
 public:
  using driver_error::driver_error;
};

/// An OS call failed; code() holds errno.
class os_error : public std::system_error {
 public:
  os_error(int errno_value, const std::string& message)
      : std::system_error(errno_value, std::generic_category(), message) {}
};

/// Reports a failure that a destructor or other noexcept cleanup path cannot throw.
/// Writes one line to stderr unless a handler was installed.
void report_cleanup_failure(const char* what) noexcept;

/// Installs a handler for cleanup failures (nullptr restores the stderr default).
/// Returns the previous handler. Tests use it to count failures.
using cleanup_failure_handler = void (*)(const char* what) noexcept;
cleanup_failure_handler set_cleanup_failure_handler(cleanup_failure_handler handler) noexcept;

/// Outside input (a file's line, an option, an environment variable) as an error message
/// shows it: its first `limit` bytes, each byte outside printable ASCII and each `"` and `\`
/// as \xNN, and "..." after a cut.
/// @throws std::bad_alloc no memory for the text.
[[nodiscard]] std::string printable(std::string_view text, std::size_t limit);

}  // namespace vmm
