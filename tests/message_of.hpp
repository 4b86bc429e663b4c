#pragma once
// What a call throws, as a string, for tests that check an error's message.

#include <string>

namespace vmm::testing {

// What `run` throws, as a string; empty when it throws nothing of type E.
template <class E, class F>
std::string message_of(F&& run) {
  try {
    run();
  } catch (const E& error) {
    return error.what();
  }
  return {};
}

}  // namespace vmm::testing
