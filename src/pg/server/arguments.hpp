// SQL values in and out: checked reading of arguments, and results, shared by
// the SQL function families.
#pragma once

#include "core/time_math.hpp"
#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// Raises 22004 naming `what` when argument `n` is NULL.
void require_not_null(FunctionCallInfo fcinfo, int n, const char* what);

// A positive interval as microseconds (1 month = 30 days, 1 day = 24 hours);
// raises 22023 naming `what` when it is zero or negative, 22008 when too large.
core::Micros positive_interval(const Interval* interval, const char* what);

// Raises 22023 naming `what` unless `interval` is positive and finite, as
// SQL compares intervals (a month is 30 days); unlike positive_interval it
// sets no upper bound, for intervals that SQL adds to a timestamp.
void require_positive_interval(const Interval* interval, const char* what);

// Raises 22023 naming `what` unless `now` + `interval`, as SQL adds them
// (months and days on the calendar), is later than `now`: '1 month -29 days'
// is positive as SQL compares intervals, yet ends before now in February.
void require_ends_after(TimestampTz now, const Interval* interval, const char* what);

// How long a caller may wait: argument `n` as microseconds, kNever when it is
// NULL (no limit); raises 22023 naming `what` when negative, 22008 when too large.
core::Micros optional_wait(FunctionCallInfo fcinfo, int n, const char* what);

// The text `value` clipped to at most `limit` bytes on a character boundary,
// copied NUL-terminated into `out` (which has room for limit + 1 bytes).
void clip_text(const text* value, size_t limit, char* out);

// A duration as an interval of microseconds only (no days or months).
Datum interval_datum(core::Micros micros);

}  // namespace pg_throttle::pg
