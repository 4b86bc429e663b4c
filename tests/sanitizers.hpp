#pragma once
// What the ThreadSanitizer build (VMM_TSAN) leaves out of the longest tests. Under it every
// mapping and every byte copied costs 10-20 times as much (its shadow memory is set up,
// checked and cleared along with the memory), and tests that repeat a path thousands of
// times ran close to their ctest timeouts on CI's two cores. ThreadSanitizer looks for
// races, which do not need every repetition: there these tests do a tenth of their cycles
// and fail each call of a fault sweep with one error only. The normal and the ASan builds
// run them in full.

namespace vmm::testing {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool under_thread_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool under_thread_sanitizer = true;
#else
inline constexpr bool under_thread_sanitizer = false;
#endif
#else
inline constexpr bool under_thread_sanitizer = false;
#endif

// AddressSanitizer keeps freed memory in a quarantine (256 MiB by default) and maps shadow
// memory for what a process touches, so a process's resident memory under it says nothing
// about leaks: tests that bound resident memory leave that check out there (LeakSanitizer
// checks leaks instead).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool under_address_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool under_address_sanitizer = true;
#else
inline constexpr bool under_address_sanitizer = false;
#endif
#else
inline constexpr bool under_address_sanitizer = false;
#endif

}  // namespace vmm::testing
