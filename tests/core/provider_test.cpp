// The provider contract and the RAII primitives, on every memory provider.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "fault_injection.hpp"  // vmm/src: test-only fault injection
#include "memory_io.hpp"
#include "process_resources.hpp"
#include "provider_kinds.hpp"
#include "vmm/address_range.hpp"
#include "vmm/error.hpp"
#include "vmm/mapping.hpp"
#include "vmm/physical_allocation.hpp"

namespace vmm::testing {
namespace {

namespace fault = vmm::detail::fault;

template <class Kind>
class primitives : public provider_test<Kind> {};
TYPED_TEST_SUITE(primitives, all_memory_kinds, memory_kind_names);

TYPED_TEST(primitives, reserve_map_write_read_unmap_round_trip) {
  const std::size_t g = this->granularity_;
  address_range range(this->provider_, 3 * g);
  ASSERT_NE(range.address(), 0u);
  ASSERT_EQ(range.address() % g, 0u);
  std::vector<physical_allocation> chunks;
  std::vector<mapping> maps;
  for (std::size_t i = 0; i < 3; ++i) {
    chunks.emplace_back(this->provider_, g);
    maps.emplace_back(chunks.back(), range.address() + i * g, access_mode::read_write);
  }
  const auto bytes = pattern(3 * g, 1);
  write_bytes(*this->provider_, range.address(), bytes);
  EXPECT_EQ(read_bytes(*this->provider_, range.address(), bytes.size()), bytes);

  // Unmap the middle chunk and map a fresh one there: the neighbours keep their bytes.
  maps[1].reset();
  physical_allocation fresh(this->provider_, g);
  maps[1] = mapping(fresh, range.address() + g, access_mode::read_write);
  const auto middle = pattern(g, 2);
  write_bytes(*this->provider_, range.address() + g, middle);
  EXPECT_EQ(read_bytes(*this->provider_, range.address() + g, g), middle);
  const auto tail = read_bytes(*this->provider_, range.address() + 2 * g, g);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), bytes.begin() + 2 * static_cast<std::ptrdiff_t>(g)));
}

TYPED_TEST(primitives, sizes_round_up_to_the_granularity) {
  const std::size_t g = this->granularity_;
  EXPECT_EQ(address_range(this->provider_, 1).size(), g);
  EXPECT_EQ(address_range(this->provider_, g + 1).size(), 2 * g);
  EXPECT_EQ(physical_allocation(this->provider_, 1).size(), g);
  EXPECT_EQ(physical_allocation(this->provider_, 2 * g).size(), 2 * g);
  EXPECT_EQ(round_up(g + 1, g), 2 * g);
  EXPECT_THROW((void)round_up(~std::size_t{0} - 1, g), invalid_argument);
}

TYPED_TEST(primitives, zero_and_unaligned_sizes_are_refused) {
  const std::size_t g = this->granularity_;
  EXPECT_THROW(address_range(this->provider_, 0), invalid_argument);
  EXPECT_THROW(physical_allocation(this->provider_, 0), invalid_argument);
  EXPECT_THROW((void)this->provider_->create(g + 1), invalid_argument);
  EXPECT_THROW((void)this->provider_->allocate_range(g / 2), invalid_argument);
  EXPECT_THROW((void)this->provider_->allocate_range(g, 3 * g), invalid_argument);  // not a power of two
  EXPECT_THROW(address_range(nullptr, g), invalid_argument);
}

TYPED_TEST(primitives, bad_map_addresses_are_refused_and_leave_nothing_mapped) {
  const std::size_t g = this->granularity_;
  address_range range(this->provider_, 2 * g);
  physical_allocation memory(this->provider_, g);
  EXPECT_THROW(mapping(memory, range.address() + 1, access_mode::read_write), invalid_argument);
  EXPECT_THROW(mapping(memory, range.address() + 2 * g, access_mode::read_write),
               invalid_argument);  // past the end
  physical_allocation big(this->provider_, 2 * g);
  EXPECT_THROW(mapping(big, range.address() + g, access_mode::read_write),
               invalid_argument);  // runs past the end
  mapping first(memory, range.address(), access_mode::read_write);
  physical_allocation other(this->provider_, g);
  EXPECT_THROW(mapping(other, range.address(), access_mode::read_write), invalid_argument);  // overlaps
  // A failed access grant unmaps again: the same place can be mapped afterwards.
  const access_grant foreign[] = {{accessor::device(1 << 20), access_mode::read_write}};
  EXPECT_ANY_THROW(mapping(other, range.address() + g, foreign));
  EXPECT_NO_THROW(mapping(other, range.address() + g, access_mode::read_write));
}

TYPED_TEST(primitives, double_unmap_and_bad_free_are_refused) {
  const std::size_t g = this->granularity_;
  address_range range(this->provider_, 2 * g);
  physical_allocation memory(this->provider_, g);
  mapping mapped(memory, range.address(), access_mode::read_write);
  EXPECT_THROW(this->provider_->free_range(range.address(), range.size()), invalid_argument);  // still mapped
  const std::uintptr_t address = mapped.release();
  this->provider_->unmap(address, g);
  EXPECT_THROW(this->provider_->unmap(address, g), invalid_argument);
  EXPECT_THROW(this->provider_->unmap(address + g, g), invalid_argument);               // never mapped
  EXPECT_THROW(this->provider_->free_range(range.address(), g), invalid_argument);      // wrong size
  EXPECT_THROW(this->provider_->free_range(range.address() + g, g), invalid_argument);  // not a reservation
  EXPECT_THROW(this->provider_->destroy(0xdead0000), invalid_argument);
}

TYPED_TEST(primitives, one_set_access_covers_many_mappings_and_not_gaps) {
  const std::size_t g = this->granularity_;
  address_range range(this->provider_, 4 * g);
  std::vector<physical_allocation> chunks;
  std::vector<mapping> maps;
  for (std::size_t i = 0; i < 3; ++i) {
    chunks.emplace_back(this->provider_, g);
    maps.emplace_back(chunks.back(), range.address() + i * g, std::span<const access_grant>{});
  }
  this->provider_->set_access(range.address(), 3 * g,
                              this->provider_->capabilities().grants(access_mode::read_write));
  const auto bytes = pattern(3 * g, 3);
  write_bytes(*this->provider_, range.address(), bytes);
  EXPECT_EQ(read_bytes(*this->provider_, range.address(), bytes.size()), bytes);
  EXPECT_THROW(this->provider_->set_access(range.address(), 4 * g,
                                           this->provider_->capabilities().grants(access_mode::read_write)),
               invalid_argument);  // the last chunk is not mapped
}

TYPED_TEST(primitives, memory_outlives_its_released_handle_while_mapped) {
  const std::size_t g = this->granularity_;
  address_range range(this->provider_, g);
  physical_allocation memory(this->provider_, g);
  mapping mapped(memory, range.address(), access_mode::read_write);
  memory.reset();
  const auto bytes = pattern(g, 4);
  write_bytes(*this->provider_, range.address(), bytes);
  EXPECT_EQ(read_bytes(*this->provider_, range.address(), g), bytes);
}

TYPED_TEST(primitives, moved_from_objects_are_empty_and_own_nothing) {
  const std::size_t g = this->granularity_;
  address_range range(this->provider_, g);
  address_range moved = std::move(range);
  EXPECT_EQ(range.address(), 0u);  // NOLINT(bugprone-use-after-move): the contract under test
  EXPECT_NE(moved.address(), 0u);
  physical_allocation memory(this->provider_, g);
  physical_allocation taken = std::move(memory);
  EXPECT_FALSE(memory);  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(taken);
  mapping mapped(taken, moved.address(), access_mode::read_write);
  mapping other = std::move(mapped);
  EXPECT_EQ(mapped.address(), 0u);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(other.address(), moved.address());
}

// An import that keeps its fd exports a duplicate of it and never asks the provider, whose
// export is made to fail here as a GPU's driver refuses to export a handle the process
// imported; the duplicate names the same memory, and every descriptor closes with its owner.
TYPED_TEST(primitives, an_import_that_keeps_its_fd_exports_it_where_the_provider_would_refuse) {
  if (this->provider_->capabilities().export_kind != handle_kind::posix_fd)
    GTEST_SKIP() << "the memory travels as " << to_string(this->provider_->capabilities().export_kind)
                 << ", not as a posix fd";
  const std::size_t g = this->granularity_;
  const std::size_t fds_before = open_fd_count();
  {
    physical_allocation memory(this->provider_, g);
    physical_allocation imported = physical_allocation::import_fd(this->provider_, memory.export_fd(), g);
    EXPECT_TRUE(imported.keeps_descriptor());
    EXPECT_FALSE(memory.keeps_descriptor());
    fault::arm(fault::provider_export, 1, EINVAL);
    unique_fd exported;
    std::string failure;
    try {
      exported = imported.export_fd();
    } catch (const std::exception& error) {
      failure = error.what();
    }
    const std::uint64_t asked = fault::calls();
    // The control: the same fault refuses the export of memory that keeps no descriptor.
    EXPECT_THROW((void)memory.export_fd(), os_error);
    const bool fired = fault::fired();
    fault::disarm();
    EXPECT_EQ(failure, "");
    EXPECT_EQ(asked, 0u) << "the provider was asked to export";
    EXPECT_TRUE(fired);
    ASSERT_GE(exported.get(), 0);

    physical_allocation again = physical_allocation::import_fd(this->provider_, exported.get(), g);
    exported.reset();
    address_range range(this->provider_, 2 * g);
    mapping first(imported, range.address(), access_mode::read_write);
    mapping second(again, range.address() + g, access_mode::read_write);
    const auto bytes = pattern(g, 13);
    write_bytes(*this->provider_, range.address(), bytes);
    EXPECT_EQ(read_bytes(*this->provider_, range.address() + g, g), bytes);
    imported.reset();  // closes its descriptor; the mapping keeps the memory
    EXPECT_FALSE(imported.keeps_descriptor());
    EXPECT_EQ(read_bytes(*this->provider_, range.address() + g, g), bytes);
  }
  EXPECT_EQ(open_fd_count(), fds_before);
}

// A duplicate that fails names the call and, at the descriptor limit, says so; an import
// that fails closes the fd it was given. Nothing leaks either way.
TYPED_TEST(primitives, a_kept_fd_that_cannot_be_duplicated_or_imported_is_an_error_and_leaks_nothing) {
  if (this->provider_->capabilities().export_kind != handle_kind::posix_fd)
    GTEST_SKIP() << "the memory travels as " << to_string(this->provider_->capabilities().export_kind)
                 << ", not as a posix fd";
  const std::size_t g = this->granularity_;
  const std::size_t fds_before = open_fd_count();
  {
    physical_allocation memory(this->provider_, g);
    const physical_allocation imported =
        physical_allocation::import_fd(this->provider_, memory.export_fd(), g);
    fault::arm(fault::fcntl, 1, EMFILE);
    std::string message;
    int code = 0;
    try {
      (void)imported.export_fd();
    } catch (const os_error& error) {
      message = error.what();
      code = error.code().value();
    }
    const bool fired = fault::fired();
    fault::disarm();
    EXPECT_TRUE(fired);
    EXPECT_EQ(code, EMFILE);
    EXPECT_NE(message.find("F_DUPFD_CLOEXEC"), std::string::npos) << message;
    EXPECT_NE(message.find("RLIMIT_NOFILE"), std::string::npos) << message;
    EXPECT_TRUE(imported.keeps_descriptor());
    EXPECT_GE(imported.export_fd().get(), 0);  // the failure passed: the descriptor is still kept

    // No memory at all (a pipe): refused, the fd given closed with the refusal.
    int ends[2] = {-1, -1};
    ASSERT_EQ(::pipe(ends), 0);
    const unique_fd write_end(ends[1]);
    EXPECT_ANY_THROW((void)physical_allocation::import_fd(this->provider_, unique_fd(ends[0]), g));
  }
  EXPECT_EQ(open_fd_count(), fds_before);
}

// A write through a read-only mapping must fail: a fault on the host, an error on the GPU.
// It runs in a child (a death test re-executes this binary), because a GPU fault poisons
// the context. The read-write control proves the child can succeed.
template <class Kind>
int write_in_child(access_mode mode) {
  std::string reason;
  auto provider = provider_or_skip_reason<Kind>(&reason);
  if (provider == nullptr) return 4;
  const std::size_t g = provider->capabilities().granularity;
  address_range range(provider, g);
  physical_allocation memory(provider, g);
  mapping mapped(memory, range.address(), access_mode::read_write);
  const auto bytes = pattern(g, 5);
  write_bytes(*provider, range.address(), bytes);
  mapped.set_access(mode);
  if (read_bytes(*provider, range.address(), g) != bytes) return 5;  // reads still work
  try {
    provider->executor().fill(mapped.data(), 0xab, g, {});
    provider->executor().synchronize({});
  } catch (const std::exception&) {
    return 3;
  }
  return 0;
}

TYPED_TEST(primitives, a_write_through_a_read_only_mapping_fails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto failed = [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); };
  EXPECT_EXIT(std::_Exit(write_in_child<TypeParam>(access_mode::read_write)), ::testing::ExitedWithCode(0),
              "");
  EXPECT_EXIT(std::_Exit(write_in_child<TypeParam>(access_mode::read_only)), failed, "");
}

}  // namespace
}  // namespace vmm::testing
