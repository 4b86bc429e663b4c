// vmm/version.hpp: the library's version() is the version its header was generated with,
// which is project(VERSION) of the top-level CMakeLists.txt (VMM_PROJECT_VERSION, passed in
// by tests/CMakeLists.txt).

#include <gtest/gtest.h>

#include <string>

#include "vmm/version.hpp"

namespace vmm {
namespace {

TEST(version, the_library_and_its_header_give_the_project_version) {
  const library_version compiled = version();
  EXPECT_EQ(compiled.major, static_cast<std::uint32_t>(VMM_VERSION_MAJOR));
  EXPECT_EQ(compiled.minor, static_cast<std::uint32_t>(VMM_VERSION_MINOR));
  EXPECT_EQ(compiled.patch, static_cast<std::uint32_t>(VMM_VERSION_PATCH));
  EXPECT_EQ(compiled.text, VMM_VERSION_STRING);
  EXPECT_EQ(compiled.text, VMM_PROJECT_VERSION);
  EXPECT_EQ(std::string(compiled.text), std::to_string(compiled.major) + "." +
                                            std::to_string(compiled.minor) + "." +
                                            std::to_string(compiled.patch));
}

}  // namespace
}  // namespace vmm
