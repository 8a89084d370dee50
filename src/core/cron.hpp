// Cron expressions for recurring schedules (docs/recurring.md): the parser and
// the search for the next firing, the instant a schedule enqueues.
//
// The grammar is pg_cron's (Vixie cron's): five fields `minute hour
// day-of-month month day-of-week`, or six with a leading seconds field; lists,
// ranges, steps, three-letter names, `$` for the last day of the month, and
// the @ shortcuts. A day matches when day-of-month and day-of-week both match
// if either field's text starts with '*', and when either matches otherwise.
//
// Time zones and DST, the documented rule: a matching local time that exists
// once fires at that instant. One skipped by a forward shift fires once, at the
// first instant after the gap, when the schedule names its hours (its hour
// field does not start with '*'), and not at all otherwise. One that occurs
// twice fires at its first occurrence when the schedule names its hours, at
// both otherwise. Offsets decide, never a DST flag, so 30-minute and negative
// shifts follow the same rule.
//
// Plain data, no exceptions, no allocation: the server calls this between
// PostgreSQL calls that may raise, and raises the errors it returns itself.
#pragma once
#include "core/cpp_only.hpp"
#include "core/time_math.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace pg_throttle::core {

// A parsed expression: one bit per allowed value of each field.
struct CronSpec {
    std::uint64_t seconds;  // bits 0..59; {0} for five fields
    std::uint64_t minutes;  // bits 0..59
    std::uint32_t hours;    // bits 0..23
    std::uint32_t days;     // bits 1..31
    std::uint16_t months;   // bits 1..12
    std::uint8_t weekdays;  // bits 0..6, Sunday = 0 (7 is folded into 0)
    bool last_day;          // `$`: the last day of the month
    bool day_star;          // the day-of-month field starts with '*'
    bool weekday_star;      // the day-of-week field starts with '*'
    bool hour_star;         // the hour field starts with '*': it follows real time
};

inline constexpr std::size_t kCronMaxBytes = 256;

// Why an expression is refused: the field ("minute", ..., or "expression"
// for the whole), the byte offset in the text, and what is wrong. Static
// strings only.
struct CronError {
    const char* field;
    std::size_t offset;
    const char* message;
};

struct CronParse {
    bool ok;
    CronSpec spec;    // when ok
    CronError error;  // when not
};

// Parses an expression; refuses one that can never fire (`0 0 30 2 *`).
CronParse parse_cron(std::string_view text) noexcept;

// Whether a day (Sunday = 0) matches the day-of-month and day-of-week rule.
bool cron_day_matches(const CronSpec& spec, std::int64_t year, int month, int day,
                      int weekday) noexcept;

// Seconds since 1970-01-01 00:00 UTC, as a time zone's transitions are given.
using UnixSeconds = std::int64_t;

struct ZoneTransition {
    UnixSeconds at;             // the first instant of the new offset
    std::int32_t offset_after;  // seconds east of UTC from `at` on
};

// A time zone as the search needs it. Implementations neither raise nor
// allocate. Offsets are seconds east of UTC (local = UTC + offset).
class Zone {
public:
    // The offset in effect at `utc`.
    virtual std::int32_t offset_at(UnixSeconds utc) const noexcept = 0;
    // The first transition strictly after `utc`, if the zone has one.
    virtual bool next_transition(UnixSeconds utc, ZoneTransition* out) const noexcept = 0;

protected:
    ~Zone() = default;
};

// How far the search looks: the Gregorian calendar repeats every 400 years,
// so any day the spec can match comes within that span.
inline constexpr std::int64_t kCronSearchDays = 146'097;

// How far before `after` the search starts, to know whether a local time
// just before it was a repeat: more than the longest shift of a zone (twice
// the 167 hours a POSIX zone string's offset may reach).
inline constexpr std::int64_t kCronLookBackDays = 15;

// Seconds from 1970-01-01 to 2000-01-01, PostgreSQL's epoch.
inline constexpr std::int64_t kUnixToPostgresSeconds = 946'684'800;

// The first firing strictly after `after` (PostgreSQL's microseconds since
// 2000-01-01 UTC), by the rule above; empty when none comes within
// kCronSearchDays.
std::optional<Micros> next_firing(const CronSpec& spec, Micros after, const Zone& zone) noexcept;

}  // namespace pg_throttle::core
