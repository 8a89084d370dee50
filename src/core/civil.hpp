// Civil (proleptic Gregorian) calendar arithmetic on whole days and seconds,
// for the cron core: days since 1970-01-01, weekdays, month lengths.
//
// Days from civil and back are Howard Hinnant's algorithms
// (http://howardhinnant.github.io/date_algorithms.html), exact over the
// whole int64 range that PostgreSQL's timestamps can reach.
#pragma once
#include "core/cpp_only.hpp"

#include <cstdint>

namespace pg_throttle::core {

struct CivilDate {
    std::int64_t year;
    int month;  // 1..12
    int day;    // 1..31
};

inline constexpr std::int64_t kSecondsPerDay = 86'400;

// a / b rounded toward minus infinity (b > 0).
constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
    return a / b - ((a % b != 0) && (a < 0) ? 1 : 0);
}

constexpr bool is_leap_year(std::int64_t year) noexcept {
    return year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
}

constexpr int days_in_month(std::int64_t year, int month) noexcept {
    constexpr int kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return month == 2 && is_leap_year(year) ? 29 : kDays[month - 1];
}

// Days since 1970-01-01 of a civil date.
constexpr std::int64_t days_from_civil(std::int64_t year, int month, int day) noexcept {
    const std::int64_t y = year - (month <= 2 ? 1 : 0);
    const std::int64_t era = floor_div(y, 400);
    const std::int64_t yoe = y - era * 400;                                             // [0, 399]
    const std::int64_t doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;  // [0, 365]
    const std::int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;  // [0, 146096]
    return era * 146'097 + doe - 719'468;
}

// The civil date of a day counted from 1970-01-01.
constexpr CivilDate civil_from_days(std::int64_t days) noexcept {
    const std::int64_t z = days + 719'468;
    const std::int64_t era = floor_div(z, 146'097);
    const std::int64_t doe = z - era * 146'097;  // [0, 146096]
    const std::int64_t yoe = (doe - doe / 1'460 + doe / 36'524 - doe / 146'096) / 365;  // [0, 399]
    const std::int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);                   // [0, 365]
    const std::int64_t mp = (5 * doy + 2) / 153;                                        // [0, 11]
    const int day = static_cast<int>(doy - (153 * mp + 2) / 5 + 1);
    const int month = static_cast<int>(mp < 10 ? mp + 3 : mp - 9);
    return CivilDate{yoe + era * 400 + (month <= 2 ? 1 : 0), month, day};
}

// 0 = Sunday .. 6 = Saturday; 1970-01-01 was a Thursday.
constexpr int weekday_from_days(std::int64_t days) noexcept {
    return static_cast<int>(days - floor_div(days + 4, 7) * 7 + 4);
}

}  // namespace pg_throttle::core
