#pragma once
// The parts of a memory resource (vmm/src/resource) wired together as resource_state wires
// them, on OS host memory, for the tests of each part on its own.

#include <cstddef>
#include <memory>
#include <string>

#include "resource/arena_set.hpp"
#include "resource/page_supply.hpp"
#include "resource/placement.hpp"
#include "resource/registrations.hpp"
#include "resource/sleep_wake.hpp"
#include "resource/stream_clock.hpp"
#include "resource/usage.hpp"
#include "vmm/chunk_pool.hpp"
#include "vmm/provider.hpp"

namespace vmm::detail::testing {

struct resource_parts {
  // Pages of the OS provider's granularity only (large pages off), at most `max_pages`.
  explicit resource_parts(std::size_t max_pages)
      : pool(chunk_pool::create(provider_for(location::os_host()))),
        page(pool->granularity()),
        arenas(pool->provider()),
        clock(pool->provider()->executor(), pool->provider()->capabilities().synchronous),
        supply(pool, arenas, clock, used, page, page, {max_pages * page, 1.0 / 8, ~std::size_t{0}, true},
               pool->provider()->capabilities().grants(access_mode::read_write)),
        places(arenas, clock, supply, reuse_policies{}, page, page, ~std::uint64_t{0}, max_pages * page),
        sleeper(arenas, clock, supply, registrations) {}

  // A block of `bytes` on the stream-less entry, its pages mapped (the slow path).
  void* allocate(std::size_t bytes, std::uint32_t tag = 0) {
    placement::stream_entry& entry = places.add_entry({}, true);
    std::string shortage;
    void* p = places.place_slow(entry, places.kind_of(bytes), bytes, 256, true, shortage);
    if (p != nullptr) {
      arena& a = *arenas.containing(reinterpret_cast<std::uintptr_t>(p));
      a.allocated_at(reinterpret_cast<std::uintptr_t>(p) - a.base())->tag = tag;
      used.add(bytes);
    }
    return p;
  }

  std::shared_ptr<chunk_pool> pool;
  std::size_t page;
  usage used;
  registration_table registrations;
  arena_set arenas;
  stream_clock clock;
  page_supply supply;
  placement places;
  sleep_wake sleeper;
};

}  // namespace vmm::detail::testing
