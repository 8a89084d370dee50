// The next firing of a cron schedule in a time zone (core/cron.hpp).
//
// The search walks UTC in segments of constant offset, between the zone's
// transitions. In a segment, local time is UTC plus one offset, so the first
// matching local time of the segment gives the first firing in it. At a
// transition that skips local times, a schedule that names its hours fires
// at the transition when a skipped time matches; after one that repeats
// local times, such a schedule skips the repeated ones.
#include "core/cron.hpp"
#include "core/civil.hpp"

#include <algorithm>
#include <limits>

namespace pg_throttle::core {
namespace {

// The lowest set bit of `bits` at or above `from`, or -1.
int next_bit(std::uint64_t bits, int from) noexcept {
    if (from >= 64) {
        return -1;
    }
    const std::uint64_t above = bits & (~std::uint64_t{0} << from);
    return above == 0 ? -1 : __builtin_ctzll(above);
}

// The first local time (seconds since 1970-01-01, local) at or after
// `from` and before `until` that the spec matches.
std::optional<std::int64_t> next_match(const CronSpec& spec, std::int64_t from,
                                       std::int64_t until) noexcept {
    std::int64_t days = floor_div(from, kSecondsPerDay);
    std::int64_t second_of_day = from - days * kSecondsPerDay;
    while (days * kSecondsPerDay < until) {
        const CivilDate date = civil_from_days(days);
        if ((spec.months & (1U << date.month)) == 0) {
            days += days_in_month(date.year, date.month) - date.day + 1;
            second_of_day = 0;
            continue;
        }
        if (cron_day_matches(spec, date.year, date.month, date.day, weekday_from_days(days))) {
            // The first (hour, minute, second) of the spec at or after the
            // time of day; a later hour or minute starts from its beginning.
            const int from_hour = static_cast<int>(second_of_day / 3600);
            for (int hour = next_bit(spec.hours, from_hour); hour >= 0;
                 hour = next_bit(spec.hours, hour + 1)) {
                const bool same_hour = hour == from_hour;
                const int from_minute = same_hour ? static_cast<int>(second_of_day / 60 % 60) : 0;
                for (int minute = next_bit(spec.minutes, from_minute); minute >= 0;
                     minute = next_bit(spec.minutes, minute + 1)) {
                    const bool same_minute = same_hour && minute == from_minute;
                    const int second = next_bit(
                        spec.seconds, same_minute ? static_cast<int>(second_of_day % 60) : 0);
                    if (second >= 0) {
                        const std::int64_t found = days * kSecondsPerDay +
                                                   std::int64_t{hour} * 3600 +
                                                   std::int64_t{minute} * 60 + second;
                        if (found >= until) {
                            return std::nullopt;
                        }
                        return found;
                    }
                }
            }
        }
        ++days;
        second_of_day = 0;
    }
    return std::nullopt;
}

// Empty past the end of the int64 microsecond range.
std::optional<Micros> to_postgres_micros(UnixSeconds utc) noexcept {
    Micros micros = 0;
    if (__builtin_mul_overflow(utc - kUnixToPostgresSeconds, kUsPerSecond, &micros)) {
        return std::nullopt;
    }
    return micros;
}

}  // namespace

std::optional<Micros> next_firing(const CronSpec& spec, Micros after, const Zone& zone) noexcept {
    // Firings are whole seconds: the first candidate is the next one.
    const UnixSeconds earliest = floor_div(after, kUsPerSecond) + 1 + kUnixToPostgresSeconds;
    const UnixSeconds limit = earliest + kCronSearchDays * kSecondsPerDay;
    // Start early enough that a repeated time just before `after` is known to
    // be one: a shift moves the clock by at most twice the largest offset a
    // zone may have (a POSIX zone string's 167 hours), under 15 days.
    UnixSeconds start = earliest - kCronLookBackDays * kSecondsPerDay;
    std::int64_t repeated_until = std::numeric_limits<std::int64_t>::min();
    while (start < limit) {
        const std::int32_t offset = zone.offset_at(start);
        ZoneTransition transition{};
        const bool has_transition = zone.next_transition(start, &transition) &&
                                    transition.at > start && transition.at < limit;
        const UnixSeconds end = has_transition ? transition.at : limit;
        std::int64_t from = std::max(start, earliest) + offset;
        if (!spec.hour_star) {
            from = std::max(from, repeated_until);
        }
        if (const auto local = next_match(spec, from, end + offset)) {
            return to_postgres_micros(*local - offset);
        }
        if (!has_transition) {
            return std::nullopt;
        }
        const std::int32_t after_offset = zone.offset_at(transition.at);
        if (after_offset > offset && !spec.hour_star && transition.at >= earliest &&
            next_match(spec, transition.at + offset, transition.at + after_offset)) {
            return to_postgres_micros(transition.at);  // the first instant after the gap
        }
        repeated_until = after_offset < offset ? transition.at + offset
                                               : std::numeric_limits<std::int64_t>::min();
        start = transition.at;
    }
    return std::nullopt;
}

}  // namespace pg_throttle::core
