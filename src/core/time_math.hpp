// Microsecond time arithmetic shared by every primitive.
//
// A time point is microseconds on PostgreSQL's TimestampTz scale (since
// 2000-01-01 00:00 UTC); a duration is microseconds. Arithmetic saturates
// instead of overflowing, so "far in the future" stays far in the future.
//
// The rule for the ends of the range: no clock the extension reads reaches
// kNever (PostgreSQL's timestamps end at 294277-01-01, END_TIMESTAMP, eight
// days before 294277-01-09 04:00:54.775807, the last int64 microsecond), so
// an end clamped to kNever never comes. Clamping is therefore kept to ends
// that only deny until they come: a window of throttle.acquire, a lease, a
// sleep's deadline. A time that a comparison could use to let a caller
// through is never clamped: a bucket's TAT that would not fit refuses the
// request instead (gcra.hpp).
#pragma once
#include "core/cpp_only.hpp"

#include <cstdint>
#include <limits>
#include <optional>

namespace pg_throttle::core {

using Micros = std::int64_t;

inline constexpr Micros kNever = std::numeric_limits<Micros>::max();
inline constexpr Micros kUsPerSecond = 1'000'000;
inline constexpr Micros kUsPerDay = 86'400 * kUsPerSecond;
// PostgreSQL compares intervals with 1 month = 30 days, 1 day = 24 hours.
inline constexpr Micros kUsPerMonth = 30 * kUsPerDay;

// a + b, clamped to the int64 range.
Micros saturating_add(Micros a, Micros b) noexcept;

// a - b, clamped to the int64 range.
Micros saturating_sub(Micros a, Micros b) noexcept;

// A PostgreSQL interval (months, days, microseconds) as one duration, with the
// conventions PostgreSQL uses to compare intervals. Empty when it does not fit.
std::optional<Micros> interval_to_micros(std::int32_t months, std::int32_t days,
                                         std::int64_t micros) noexcept;

// A sleep of `sleep_us` as the timeout WaitLatch takes: whole milliseconds,
// rounded up, at least 1 and at most INT32_MAX (about 24.8 days; the poll
// underneath takes an int, and a longer value would be truncated into any
// timeout at all). A caller that sleeps longer loops.
std::int32_t sleep_timeout_ms(Micros sleep_us) noexcept;

}  // namespace pg_throttle::core
