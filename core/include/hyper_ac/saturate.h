// Saturating arithmetic for byte counts and float totals (docs/graph-format.md,
// the tensor fact; docs/config.md, `memory_budget`). Byte counts are non-negative int64s: a sum that
// would pass INT64_MAX stays at INT64_MAX (about 8 EiB, more than any real
// device) instead of wrapping negative. Float totals (FLOPs, seconds) stay at
// the largest finite double instead of becoming infinite.
#pragma once

#include <cstdint>
#include <limits>

namespace hyper_ac {

constexpr std::int64_t kMaxBytes = std::numeric_limits<std::int64_t>::max();

// a + b for byte counts, saturated to [0, kMaxBytes] (negative inputs count as 0).
inline std::int64_t add_bytes(std::int64_t a, std::int64_t b) {
  if (a < 0) a = 0;
  if (b < 0) b = 0;
  return a > kMaxBytes - b ? kMaxBytes : a + b;
}

// A 128-bit byte sum (no int64 sum of int64 byte counts overflows it) back to
// int64, saturated to [0, kMaxBytes].
inline std::int64_t clamp_bytes(__int128 bytes) {
  if (bytes < 0) return 0;
  return bytes > static_cast<__int128>(kMaxBytes) ? kMaxBytes : static_cast<std::int64_t>(bytes);
}

// A non-negative double as a byte count: NaN and negatives give 0, values at
// or past 2^63 give kMaxBytes (no undefined float-to-int conversion).
inline std::int64_t bytes_from_double(double bytes) {
  if (!(bytes > 0.0)) return 0;
  if (bytes >= 9223372036854775808.0) return kMaxBytes;  // 2^63
  return static_cast<std::int64_t>(bytes);
}

// a + b for non-negative float totals, never past the largest finite double.
inline double add_finite(double a, double b) {
  const double sum = a + b;
  return sum <= std::numeric_limits<double>::max() ? sum : std::numeric_limits<double>::max();
}

}  // namespace hyper_ac
