#pragma once
/// @file
/// What a benchmark program throws when its own setup or a baseline's call fails. Shared by
/// the C++ and the CUDA C++ translation units.

#include <stdexcept>

namespace vmm::bench {

/// A failure of a benchmark's own setup or of a baseline's call; a benchmark body turns it
/// into SkipWithError with this message, a program's main into its exit status.
class bench_failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace vmm::bench
