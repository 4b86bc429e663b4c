#include "last_error.hpp"

#include <mutex>
#include <string>

namespace vmm_python {
namespace {

struct kept_message {
  std::mutex mutex;
  std::string text;
};

// Never destroyed: frees that fail while the interpreter shuts down still report here.
kept_message& kept() {
  static auto* const message = new kept_message();
  return *message;
}

}  // namespace

void keep_last_error(const char* message) noexcept {
  try {
    kept_message& state = kept();
    std::lock_guard lock(state.mutex);
    state.text = message;
  } catch (...) {
    // No memory for the message: the caller's status still says that it failed.
  }
}

std::string last_error() {
  kept_message& state = kept();
  std::lock_guard lock(state.mutex);
  return state.text;
}

void clear_last_error() noexcept {
  kept_message& state = kept();
  std::lock_guard lock(state.mutex);
  state.text.clear();
}

}  // namespace vmm_python
