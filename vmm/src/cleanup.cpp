// The report of a failed cleanup (vmm/detail/cleanup.hpp).

#include "vmm/detail/cleanup.hpp"

#include <exception>
#include <string>

#include "vmm/error.hpp"

namespace vmm::detail {

void report_current_exception(const char* context) noexcept {
  constexpr int cuda_error_deinitialized = 4;
  try {
    throw;
  } catch (const driver_error& error) {
    if (error.result() == cuda_error_deinitialized) return;
    report_cleanup_failure((std::string(context) + ": " + error.what()).c_str());
  } catch (const std::exception& error) {
    report_cleanup_failure((std::string(context) + ": " + error.what()).c_str());
  } catch (...) {
    report_cleanup_failure(context);
  }
}

}  // namespace vmm::detail
