#pragma once
// The name of an enumerator, looked up in a table of (value, name) rows: every to_string
// over a small enum is its table and this one loop.
//
// Internal (vmm/detail/): installed for vmm::ipc and vmm::store, which build on it, and
// not part of vmm's interface: it may change in any release without notice.

#include <cstddef>

namespace vmm::detail {

template <class Enum>
struct enum_name {
  Enum value;
  const char* name;
};

// The name of `value` in `names`; `unknown` for a value the table lacks (a peer's byte
// cast to the enum, or an enumerator added without a row).
template <class Enum, std::size_t N>
constexpr const char* name_of(Enum value, const enum_name<Enum> (&names)[N], const char* unknown) noexcept {
  for (const enum_name<Enum>& row : names)
    if (row.value == value) return row.name;
  return unknown;
}

}  // namespace vmm::detail
