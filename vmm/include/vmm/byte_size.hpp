#pragma once
/// @file
/// Byte sizes as people write them on a command line: "4096", "64M", "64MiB", "1.5G", "2T".
/// One parser for every tool and benchmark of vmm, so that each accepts the same spellings.
///
/// The grammar, in full:
///
///     size   = digits [ "." digits ] [ unit ]
///     unit   = letter [ "iB" ]            letter: K, M, G or T, in either case
///
/// - Every multiple is binary: K = KiB = 2^10, M = MiB = 2^20, G = GiB = 2^30, T = TiB = 2^40.
///   Without a unit the number is bytes.
/// - The unit's letter may be upper or lower case ("64m" is 64 MiB); the "iB" after it is
///   written exactly so ("64mib", "64MIB" and "64Mib", which reads as mebibits, are refused).
/// - "KB", "MB", "GB" and "TB" are refused: they mean powers of 1000 to some readers and of
///   1024 to others; write "K" or "KiB".
/// - A decimal fraction (at most 18 decimals) needs a unit ("1.5G", "0.5K"; "1.5" is
///   refused), and is cut to whole bytes: "0.1K" is 102 bytes, not 102.4.
/// - Nothing else: no sign, no whitespace anywhere, no exponent, no thousands separator, no
///   "B" suffix alone, no leading or trailing "." ("1.", ".5"). Leading zeros are allowed.
/// - The result fits std::uint64_t: 2^64 bytes and more ("16777216T") are refused.
/// - Zero ("0", "0K") is a size: whether a caller accepts it is the caller's rule.

#include <cstdint>
#include <string>
#include <string_view>

namespace vmm {

/// The bytes `text` spells, by the grammar above.
/// @throws vmm::invalid_argument `text` is empty or breaks the grammar, or the size reaches
///         2^64; what() quotes the text (bytes outside printable ASCII as \\xNN) and says why.
[[nodiscard]] std::uint64_t parse_byte_size(std::string_view text);

/// `bytes` in the largest binary unit it reaches, as parse_byte_size reads it back: below
/// 1 KiB the plain number ("1000"), otherwise the value in KiB, MiB, GiB or TiB cut to at
/// most three decimals, without trailing zeros ("64MiB", "1.5GiB", "4.003KiB" for 4100, "16384TiB").
/// parse_byte_size(format_byte_size(n)) is n whenever n in that unit has at most three
/// decimals that make whole bytes (every multiple of the unit, 1.5GiB, ...), and otherwise
/// at most a thousandth of the unit less than n (both cut, never rounded up).
/// @throws std::bad_alloc only (the string's memory).
[[nodiscard]] std::string format_byte_size(std::uint64_t bytes);

}  // namespace vmm
