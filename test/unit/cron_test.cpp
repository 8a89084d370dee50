#include "core/civil.hpp"
#include "core/cron.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace pg_throttle::core {
namespace {

// A zone with a fixed list of transitions (the 2026 ones of the real zones,
// read from tzdata) and constant offsets before and after them.
class FakeZone final : public Zone {
public:
    FakeZone(std::int32_t initial, std::vector<ZoneTransition> transitions)
        : initial_(initial), transitions_(std::move(transitions)) {}

    std::int32_t offset_at(UnixSeconds utc) const noexcept override {
        std::int32_t offset = initial_;
        for (const ZoneTransition& t : transitions_) {
            if (t.at <= utc) {
                offset = t.offset_after;
            }
        }
        return offset;
    }

    bool next_transition(UnixSeconds utc, ZoneTransition* out) const noexcept override {
        for (const ZoneTransition& t : transitions_) {
            if (t.at > utc) {
                *out = t;
                return true;
            }
        }
        return false;
    }

    std::vector<std::int32_t> offsets() const {
        std::vector<std::int32_t> all{initial_};
        for (const ZoneTransition& t : transitions_) {
            all.push_back(t.offset_after);
        }
        return all;
    }

private:
    std::int32_t initial_;
    std::vector<ZoneTransition> transitions_;
};

const FakeZone kUtc(0, {});
// 2026-03-08 07:00 UTC (02:00 EST -> 03:00 EDT); 2026-11-01 06:00 UTC (02:00 EDT -> 01:00 EST).
const FakeZone kNewYork(-18000, {{1772953200, -14400}, {1793512800, -18000}});
// 2026-03-29 01:00 UTC (02:00 CET -> 03:00 CEST); 2026-10-25 01:00 UTC (03:00 CEST -> 02:00 CET).
const FakeZone kBerlin(3600, {{1774746000, 7200}, {1792890000, 3600}});
// 2026-04-04 15:00 UTC (02:00 +11 -> 01:30 +10:30); 2026-10-03 15:30 UTC (02:00 -> 02:30).
const FakeZone kLordHowe(39600, {{1775314800, 37800}, {1791041400, 39600}});
// Negative DST: winter (GMT) is the "DST" of tzdata; only offsets count.
const FakeZone kDublin(0, {{1774746000, 3600}, {1792890000, 0}});
// Southern hemisphere: 2026-04-04 16:00 UTC (03:00 -> 02:00); 2026-10-03 16:00 UTC (02:00 ->
// 03:00).
const FakeZone kSydney(39600, {{1775318400, 36000}, {1791043200, 39600}});

CronSpec spec_of(const char* text) {
    const CronParse parsed = parse_cron(text);
    EXPECT_TRUE(parsed.ok) << text << ": " << parsed.error.field << " at " << parsed.error.offset
                           << ": " << parsed.error.message;
    return parsed.spec;
}

// UTC civil time as PostgreSQL microseconds.
Micros utc(std::int64_t y, int mo, int d, int h = 0, int mi = 0, int s = 0) {
    const std::int64_t unix_s = days_from_civil(y, mo, d) * kSecondsPerDay +
                                std::int64_t{h} * 3600 + std::int64_t{mi} * 60 + s;
    return (unix_s - kUnixToPostgresSeconds) * kUsPerSecond;
}

std::string show(std::optional<Micros> at) {
    if (!at) {
        return "never";
    }
    const std::int64_t unix_s = floor_div(*at, kUsPerSecond) + kUnixToPostgresSeconds;
    const std::int64_t days = floor_div(unix_s, kSecondsPerDay);
    const std::int64_t sod = unix_s - days * kSecondsPerDay;
    const CivilDate date = civil_from_days(days);
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%04lld-%02d-%02d %02lld:%02lld:%02lld",
                  static_cast<long long>(date.year), date.month, date.day,
                  static_cast<long long>(sod / 3600), static_cast<long long>(sod / 60 % 60),
                  static_cast<long long>(sod % 60));
    return buffer;
}

// The firings after `after`, as UTC text.
std::vector<std::string> firings(const char* text, const Zone& zone, Micros after, int count) {
    const CronSpec spec = spec_of(text);
    std::vector<std::string> out;
    for (int i = 0; i < count; ++i) {
        const auto next = next_firing(spec, after, zone);
        out.push_back(show(next));
        if (!next) {
            break;
        }
        after = *next;
    }
    return out;
}

using Strings = std::vector<std::string>;

CronError error_of(const char* text) {
    const CronParse parsed = parse_cron(text);
    EXPECT_FALSE(parsed.ok) << text;
    return parsed.error;
}

#define EXPECT_CRON_ERROR(text, field_name, at)         \
    do {                                                \
        const CronError e = error_of(text);             \
        EXPECT_STREQ(e.field, field_name) << (text);    \
        EXPECT_EQ(e.offset, std::size_t{at}) << (text); \
    } while (0)

TEST(Civil, RoundTripsAndWeekdays) {
    EXPECT_EQ(days_from_civil(1970, 1, 1), 0);
    EXPECT_EQ(weekday_from_days(0), 4);                              // Thursday
    EXPECT_EQ(weekday_from_days(days_from_civil(2026, 11, 28)), 6);  // Saturday
    EXPECT_EQ(weekday_from_days(days_from_civil(1969, 12, 28)), 0);
    for (std::int64_t d = -800'000; d < 800'000; d += 37) {
        const CivilDate c = civil_from_days(d);
        EXPECT_EQ(days_from_civil(c.year, c.month, c.day), d);
    }
    EXPECT_TRUE(is_leap_year(2028));
    EXPECT_FALSE(is_leap_year(2100));
    EXPECT_TRUE(is_leap_year(2000));
    EXPECT_EQ(days_in_month(2028, 2), 29);
    EXPECT_EQ(days_in_month(2100, 2), 28);
}

TEST(CronParse, Fields) {
    const CronSpec s = spec_of("5,10-20/5 */6 1-3 jan-MAR,dec mon-fri");
    EXPECT_EQ(s.seconds, 1U);
    EXPECT_EQ(s.minutes, (1ULL << 5) | (1ULL << 10) | (1ULL << 15) | (1ULL << 20));
    EXPECT_EQ(s.hours, (1U << 0) | (1U << 6) | (1U << 12) | (1U << 18));
    EXPECT_EQ(s.days, 0xEU);
    EXPECT_EQ(s.months, (1U << 1) | (1U << 2) | (1U << 3) | (1U << 12));
    EXPECT_EQ(s.weekdays, 0x3EU);
    EXPECT_TRUE(s.hour_star);
    EXPECT_FALSE(s.day_star);
    EXPECT_FALSE(s.weekday_star);
    EXPECT_FALSE(s.last_day);
}

TEST(CronParse, SixFieldsAndBlanks) {
    const CronSpec s = spec_of("  */20 0 12 * * *\t");
    EXPECT_EQ(s.seconds, (1ULL << 0) | (1ULL << 20) | (1ULL << 40));
    EXPECT_EQ(s.minutes, 1U);
    EXPECT_EQ(s.hours, 1U << 12);
    EXPECT_FALSE(s.hour_star);
    EXPECT_TRUE(s.day_star);
    EXPECT_TRUE(s.weekday_star);
}

TEST(CronParse, SundayIsZeroAndSeven) {
    EXPECT_EQ(spec_of("0 0 * * 7").weekdays, 1U);
    EXPECT_EQ(spec_of("0 0 * * 0").weekdays, 1U);
    EXPECT_EQ(spec_of("0 0 * * 5-7").weekdays, (1U << 5) | (1U << 6) | 1U);
    EXPECT_EQ(spec_of("0 0 * * SUN,sat").weekdays, (1U << 6) | 1U);
    EXPECT_EQ(spec_of("0 0 * * */7").weekdays, 1U);
}

TEST(CronParse, Shortcuts) {
    struct Case {
        const char* shortcut;
        const char* expression;
    };
    for (const Case& c : {Case{"@yearly", "0 0 1 1 *"}, Case{"@annually", "0 0 1 1 *"},
                          Case{"@monthly", "0 0 1 * *"}, Case{"@weekly", "0 0 * * 0"},
                          Case{"@daily", "0 0 * * *"}, Case{"@midnight", "0 0 * * *"},
                          Case{"@hourly", "0 * * * *"}, Case{" @Daily ", "0 0 * * *"}}) {
        const CronSpec a = spec_of(c.shortcut);
        const CronSpec b = spec_of(c.expression);
        EXPECT_EQ(a.minutes, b.minutes) << c.shortcut;
        EXPECT_EQ(a.hours, b.hours) << c.shortcut;
        EXPECT_EQ(a.days, b.days) << c.shortcut;
        EXPECT_EQ(a.months, b.months) << c.shortcut;
        EXPECT_EQ(a.weekdays, b.weekdays) << c.shortcut;
        EXPECT_EQ(a.hour_star, b.hour_star) << c.shortcut;
        EXPECT_EQ(a.day_star, b.day_star) << c.shortcut;
        EXPECT_EQ(a.weekday_star, b.weekday_star) << c.shortcut;
    }
}

TEST(CronParse, Errors) {
    EXPECT_CRON_ERROR("", "expression", 0);
    EXPECT_CRON_ERROR("* * * *", "expression", 7);
    EXPECT_CRON_ERROR("* * * * * * *", "expression", 12);
    EXPECT_CRON_ERROR("60 * * * *", "minute", 0);
    EXPECT_CRON_ERROR("0 24 * * *", "hour", 2);
    EXPECT_CRON_ERROR("0 0 0 * *", "day of month", 4);
    EXPECT_CRON_ERROR("0 0 32 * *", "day of month", 4);
    EXPECT_CRON_ERROR("0 0 1 13 *", "month", 6);
    EXPECT_CRON_ERROR("0 0 1 0 *", "month", 6);
    EXPECT_CRON_ERROR("0 0 * * 8", "day of week", 8);
    EXPECT_CRON_ERROR("60 0 0 * * *", "second", 0);
    EXPECT_CRON_ERROR("0 5/10 * * *", "hour", 3);  // a step without a range
    EXPECT_CRON_ERROR("0 */0 * * *", "hour", 4);
    EXPECT_CRON_ERROR("0 */ * * *", "hour", 4);
    EXPECT_CRON_ERROR("0 */24 * * *", "hour", 4);
    EXPECT_CRON_ERROR("0 5-3 * * *", "hour", 2);
    EXPECT_CRON_ERROR("0 1,,2 * * *", "hour", 4);
    EXPECT_CRON_ERROR("0 1, * * *", "hour", 4);
    EXPECT_CRON_ERROR("0 1-x * * *", "hour", 4);
    EXPECT_CRON_ERROR("0 x * * *", "hour", 2);
    EXPECT_CRON_ERROR("0 0 * * monday", "day of week", 8);
    EXPECT_CRON_ERROR("0 0 * january *", "month", 6);
    EXPECT_CRON_ERROR("0 0 * jan-foo *", "month", 10);
    EXPECT_CRON_ERROR("0 0 * * mon/2", "day of week", 11);
    EXPECT_CRON_ERROR("0 0 * 1x *", "month", 7);
    EXPECT_CRON_ERROR("0 0 $,1 * *", "day of month", 4);
    EXPECT_CRON_ERROR("0 0 1,$ * *", "day of month", 6);
    EXPECT_STREQ(error_of("0 0 1,$ * *").message, "'$' stands alone in its field");
    EXPECT_CRON_ERROR("0 $ * * *", "hour", 2);
    EXPECT_CRON_ERROR("0 0 * * $", "day of week", 8);
    EXPECT_CRON_ERROR("0 0 99999999999 * *", "day of month", 4);
    EXPECT_CRON_ERROR("@reboot", "expression", 0);
    EXPECT_CRON_ERROR("  @often", "expression", 2);
    EXPECT_CRON_ERROR("@daily 0", "expression", 7);
    EXPECT_CRON_ERROR("0 0 * * *\n", "expression", 9);
    EXPECT_CRON_ERROR("0 0\x7f * * *", "expression", 3);
    EXPECT_CRON_ERROR("30 seconds", "expression", 0);  // pg_cron's interval jobs
    EXPECT_STREQ(error_of(" 5 Second").message,
                 "interval schedules ('N seconds') are not supported");
    EXPECT_CRON_ERROR("0 0 * * * é", "day of week", 10);
    const std::string long_text = "0 0 * * *" + std::string(247, ' ');
    EXPECT_TRUE(parse_cron(long_text).ok);  // 257 bytes would be one too many
    EXPECT_CRON_ERROR((long_text + " ").c_str(), "expression", 256);
}

TEST(CronParse, RefusesSchedulesThatNeverFire) {
    EXPECT_CRON_ERROR("0 0 30 2 *", "day of month", 4);
    EXPECT_CRON_ERROR("0 0 31 4,6,9,11 *", "day of month", 4);
    EXPECT_CRON_ERROR("0 0 30-31 feb */2", "day of month", 4);
    EXPECT_TRUE(parse_cron("0 0 29 2 *").ok);
    EXPECT_TRUE(parse_cron("0 0 30 2 mon").ok);  // OR: every Monday of February
    EXPECT_TRUE(parse_cron("0 0 $ 2 *").ok);
    EXPECT_TRUE(parse_cron("0 0 */31 2 mon").ok);  // AND: a February 1 that is a Monday
}

TEST(CronNext, Utc) {
    EXPECT_EQ(firings("*/15 * * * *", kUtc, utc(2026, 1, 1, 0, 7), 3),
              (Strings{"2026-01-01 00:15:00", "2026-01-01 00:30:00", "2026-01-01 00:45:00"}));
    // Strictly after: a firing at `after` itself is not the next one.
    EXPECT_EQ(firings("0 12 * * *", kUtc, utc(2026, 1, 1, 12), 1),
              (Strings{"2026-01-02 12:00:00"}));
    EXPECT_EQ(firings("0 12 * * *", kUtc, utc(2026, 1, 1, 12) - 1, 1),
              (Strings{"2026-01-01 12:00:00"}));
    EXPECT_EQ(firings("@yearly", kUtc, utc(2026, 6, 1), 2),
              (Strings{"2027-01-01 00:00:00", "2028-01-01 00:00:00"}));
    EXPECT_EQ(firings("@weekly", kUtc, utc(2026, 11, 28), 1), (Strings{"2026-11-29 00:00:00"}));
}

TEST(CronNext, Seconds) {
    EXPECT_EQ(firings("*/20 * * * * *", kUtc, utc(2026, 1, 1, 0, 0, 30), 3),
              (Strings{"2026-01-01 00:00:40", "2026-01-01 00:01:00", "2026-01-01 00:01:20"}));
    EXPECT_EQ(firings("30 59 23 31 12 *", kUtc, utc(2026, 1, 1), 1),
              (Strings{"2026-12-31 23:59:30"}));
}

TEST(CronNext, DayOfMonthAndDayOfWeek) {
    // Neither starts with '*': either matches (the 13th, or any Friday).
    EXPECT_EQ(firings("0 0 13 * fri", kUtc, utc(2026, 2, 1), 4),
              (Strings{"2026-02-06 00:00:00", "2026-02-13 00:00:00", "2026-02-20 00:00:00",
                       "2026-02-27 00:00:00"}));
    EXPECT_EQ(firings("0 0 13 * fri", kUtc, utc(2026, 3, 1), 3),
              (Strings{"2026-03-06 00:00:00", "2026-03-13 00:00:00", "2026-03-20 00:00:00"}));
    // Day of month starts with '*': both must match (an odd day that is a Friday).
    EXPECT_EQ(firings("0 0 */2 * fri", kUtc, utc(2026, 2, 1), 3),
              (Strings{"2026-02-13 00:00:00", "2026-02-27 00:00:00", "2026-03-13 00:00:00"}));
    // Day of week starts with '*': both must match.
    EXPECT_EQ(firings("0 0 13 * */1", kUtc, utc(2026, 2, 1), 2),
              (Strings{"2026-02-13 00:00:00", "2026-03-13 00:00:00"}));
    // A February 1 that is a Monday: eleven years apart at worst.
    EXPECT_EQ(firings("0 0 */31 2 mon", kUtc, utc(2026, 1, 1), 2),
              (Strings{"2027-02-01 00:00:00", "2038-02-01 00:00:00"}));
}

TEST(CronNext, MonthEndsAndLeapDays) {
    EXPECT_EQ(firings("0 0 $ * *", kUtc, utc(2027, 12, 15), 4),
              (Strings{"2027-12-31 00:00:00", "2028-01-31 00:00:00", "2028-02-29 00:00:00",
                       "2028-03-31 00:00:00"}));
    EXPECT_EQ(firings("0 0 $ 2 *", kUtc, utc(2099, 12, 1), 2),
              (Strings{"2100-02-28 00:00:00", "2101-02-28 00:00:00"}));
    EXPECT_EQ(firings("0 0 31 * *", kUtc, utc(2026, 1, 31), 3),
              (Strings{"2026-03-31 00:00:00", "2026-05-31 00:00:00", "2026-07-31 00:00:00"}));
    EXPECT_EQ(firings("0 0 29 2 *", kUtc, utc(2026, 1, 1), 2),
              (Strings{"2028-02-29 00:00:00", "2032-02-29 00:00:00"}));
    // 2100 is not a leap year: eight years from 2096 to 2104.
    EXPECT_EQ(firings("0 0 29 2 *", kUtc, utc(2096, 3, 1), 1), (Strings{"2104-02-29 00:00:00"}));
    // Day of week '*'-led with February 29: a leap day on a Sunday, 2032 then 2060.
    EXPECT_EQ(firings("0 0 29 2 */7", kUtc, utc(2026, 1, 1), 2),
              (Strings{"2032-02-29 00:00:00", "2060-02-29 00:00:00"}));
}

TEST(CronNext, NewYorkSpringForward) {
    const Micros before = utc(2026, 3, 7, 12);
    // 02:30 does not exist on 2026-03-08: fires at 03:00 EDT (07:00 UTC).
    EXPECT_EQ(firings("30 2 * * *", kNewYork, before, 3),
              (Strings{"2026-03-08 07:00:00", "2026-03-09 06:30:00", "2026-03-10 06:30:00"}));
    // Several skipped times give one firing.
    EXPECT_EQ(firings("*/10 2 * * *", kNewYork, utc(2026, 3, 8, 6), 2),
              (Strings{"2026-03-08 07:00:00", "2026-03-09 06:00:00"}));
    // A firing at 03:00 as well is the same instant.
    EXPECT_EQ(firings("0 2,3 * * *", kNewYork, utc(2026, 3, 8, 6), 2),
              (Strings{"2026-03-08 07:00:00", "2026-03-09 06:00:00"}));
    // Every hour follows real time: 01:30 EST, then 03:30 EDT.
    EXPECT_EQ(firings("30 * * * *", kNewYork, utc(2026, 3, 8, 6), 2),
              (Strings{"2026-03-08 06:30:00", "2026-03-08 07:30:00"}));
}

TEST(CronNext, NewYorkFallBack) {
    // 01:30 occurs twice on 2026-11-01: once at the first (EDT, 05:30 UTC).
    EXPECT_EQ(firings("30 1 * * *", kNewYork, utc(2026, 10, 31, 12), 2),
              (Strings{"2026-11-01 05:30:00", "2026-11-02 06:30:00"}));
    // Even when asked from inside the repeated hour.
    EXPECT_EQ(firings("45 1 * * *", kNewYork, utc(2026, 11, 1, 6, 10), 1),
              (Strings{"2026-11-02 06:45:00"}));
    // Every hour: both, an hour apart.
    EXPECT_EQ(firings("30 * * * *", kNewYork, utc(2026, 11, 1, 4), 3),
              (Strings{"2026-11-01 04:30:00", "2026-11-01 05:30:00", "2026-11-01 06:30:00"}));
    EXPECT_EQ(firings("0 */1 * * *", kNewYork, utc(2026, 11, 1, 4, 30), 3),
              (Strings{"2026-11-01 05:00:00", "2026-11-01 06:00:00", "2026-11-01 07:00:00"}));
}

TEST(CronNext, ShiftLongerThanDays) {
    // A zone string may set offsets of up to 167 hours: this one moves the
    // clock back 200 hours at 2026-03-08 00:00 UTC, so that the local times
    // from 2026-03-03 20:00 to 03-12 04:00 occur twice. 12:00 fires at each
    // day's first occurrence only, also when asked days after the shift.
    const UnixSeconds shift = days_from_civil(2026, 3, 8) * kSecondsPerDay;
    const FakeZone zone(360'000, {{shift, -360'000}});
    EXPECT_EQ(firings("0 12 * * *", zone, utc(2026, 3, 8), 1), (Strings{"2026-03-16 16:00:00"}));
    EXPECT_EQ(firings("0 12 * * *", zone, utc(2026, 3, 11), 1), (Strings{"2026-03-16 16:00:00"}));
}

TEST(CronNext, Berlin) {
    // 2026-03-29 02:30 CET does not exist: 03:00 CEST is 01:00 UTC.
    EXPECT_EQ(firings("30 2 * * *", kBerlin, utc(2026, 3, 28, 12), 2),
              (Strings{"2026-03-29 01:00:00", "2026-03-30 00:30:00"}));
    EXPECT_EQ(firings("30 * * * *", kBerlin, utc(2026, 3, 29, 0), 2),
              (Strings{"2026-03-29 00:30:00", "2026-03-29 01:30:00"}));
    // 2026-10-25 02:30 occurs at 00:30 UTC (CEST) and 01:30 UTC (CET).
    EXPECT_EQ(firings("30 2 * * *", kBerlin, utc(2026, 10, 24, 12), 2),
              (Strings{"2026-10-25 00:30:00", "2026-10-26 01:30:00"}));
    EXPECT_EQ(firings("30 * * * *", kBerlin, utc(2026, 10, 25, 0), 2),
              (Strings{"2026-10-25 00:30:00", "2026-10-25 01:30:00"}));
    // Seconds in the gap and in the repeat.
    EXPECT_EQ(firings("15 30 2 * * *", kBerlin, utc(2026, 3, 28, 12), 1),
              (Strings{"2026-03-29 01:00:00"}));
    EXPECT_EQ(firings("15 30 2 * * *", kBerlin, utc(2026, 10, 24, 12), 1),
              (Strings{"2026-10-25 00:30:15"}));
}

TEST(CronNext, LordHoweHalfHourShift) {
    // 2026-04-05 01:30-01:59 repeats (+11 then +10:30).
    EXPECT_EQ(firings("45 1 * * *", kLordHowe, utc(2026, 4, 4, 0), 2),
              (Strings{"2026-04-04 14:45:00", "2026-04-05 15:15:00"}));
    EXPECT_EQ(firings("45 * * * *", kLordHowe, utc(2026, 4, 4, 14), 3),
              (Strings{"2026-04-04 14:45:00", "2026-04-04 15:15:00", "2026-04-04 16:15:00"}));
    // 2026-10-04 02:00-02:29 is skipped: 02:15 fires at 02:30 (+11), 15:30 UTC.
    EXPECT_EQ(firings("15 2 * * *", kLordHowe, utc(2026, 10, 3, 0), 2),
              (Strings{"2026-10-03 15:30:00", "2026-10-04 15:15:00"}));
    EXPECT_EQ(firings("45 2 * * *", kLordHowe, utc(2026, 10, 3, 0), 1),
              (Strings{"2026-10-03 15:45:00"}));
}

TEST(CronNext, DublinAndSydney) {
    EXPECT_EQ(firings("30 1 * * *", kDublin, utc(2026, 3, 28, 12), 1),
              (Strings{"2026-03-29 01:00:00"}));
    EXPECT_EQ(firings("30 1 * * *", kDublin, utc(2026, 10, 24, 12), 2),
              (Strings{"2026-10-25 00:30:00", "2026-10-26 01:30:00"}));
    // Sydney: 02:30 repeats in April, is skipped in October.
    EXPECT_EQ(firings("30 2 * * *", kSydney, utc(2026, 4, 4, 0), 1),
              (Strings{"2026-04-04 15:30:00"}));
    EXPECT_EQ(firings("30 2 * * *", kSydney, utc(2026, 10, 3, 0), 1),
              (Strings{"2026-10-03 16:00:00"}));
}

TEST(CronNext, SubSecondAfter) {
    const CronSpec spec = spec_of("* * * * * *");
    EXPECT_EQ(show(next_firing(spec, utc(2026, 1, 1) + 999'999, kUtc)), "2026-01-01 00:00:01");
    EXPECT_EQ(show(next_firing(spec, utc(2026, 1, 1) - 1, kUtc)), "2026-01-01 00:00:00");
    EXPECT_EQ(show(next_firing(spec, utc(1969, 12, 31, 23, 59, 59) + 5, kUtc)),
              "1970-01-01 00:00:00");
}

TEST(CronNext, EndOfRange) {
    const CronSpec spec = spec_of("0 0 1 1 *");
    EXPECT_EQ(next_firing(spec, std::numeric_limits<Micros>::max() - 1, kUtc), std::nullopt);
}

// --- The property test: next_firing against a walk of every minute (or
// second) that applies the documented rule directly.

bool matches_wall(const CronSpec& spec, std::int64_t wall) {
    const std::int64_t days = floor_div(wall, kSecondsPerDay);
    const std::int64_t sod = wall - days * kSecondsPerDay;
    const CivilDate date = civil_from_days(days);
    return (spec.months >> date.month & 1U) != 0 &&
           cron_day_matches(spec, date.year, date.month, date.day, weekday_from_days(days)) &&
           (spec.hours >> (sod / 3600) & 1U) != 0 && (spec.minutes >> (sod / 60 % 60) & 1U) != 0 &&
           (spec.seconds >> (sod % 60) & 1U) != 0;
}

bool fires_at(const CronSpec& spec, const FakeZone& zone, UnixSeconds t) {
    const std::int32_t offset = zone.offset_at(t);
    const std::int64_t wall = t + offset;
    if (matches_wall(spec, wall)) {
        if (spec.hour_star) {
            return true;
        }
        bool earlier = false;  // the same wall time at an earlier instant
        for (const std::int32_t other : zone.offsets()) {
            const UnixSeconds t2 = wall - other;
            earlier = earlier || (t2 < t && zone.offset_at(t2) == other);
        }
        if (!earlier) {
            return true;
        }
    }
    const std::int32_t before = zone.offset_at(t - 1);
    if (!spec.hour_star && before < offset) {  // t ends a gap of wall times
        for (std::int64_t w = t + before; w < wall; ++w) {
            if (matches_wall(spec, w)) {
                return true;
            }
        }
    }
    return false;
}

std::string random_field(std::mt19937& rng, int low, int high) {
    auto pick = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
    std::string out;
    const int items = pick(0, 3) == 0 ? pick(2, 3) : 1;
    for (int i = 0; i < items; ++i) {
        if (i > 0) {
            out += ',';
        }
        const int a = pick(low, high);
        const int b = pick(a, high);
        switch (pick(0, 5)) {
            case 0:
                out += "*";
                break;
            case 1:
                out += "*/" + std::to_string(pick(1, std::max(1, (high - low) / 2)));
                break;
            case 2:
                out += std::to_string(a);
                break;
            case 3:
                out += std::to_string(a) + "-" + std::to_string(b);
                break;
            default:
                out +=
                    std::to_string(a) + "-" + std::to_string(b) + "/" + std::to_string(pick(1, 4));
                break;
        }
    }
    return out;
}

void check_against_walk(const std::string& text, const FakeZone& zone, UnixSeconds from,
                        UnixSeconds to, int stride) {
    const CronParse parsed = parse_cron(text);
    if (!parsed.ok) {
        return;  // a random spec that never fires
    }
    const CronSpec& spec = parsed.spec;
    std::vector<UnixSeconds> walked;
    for (UnixSeconds t = from; t < to; t += stride) {
        if (fires_at(spec, zone, t)) {
            walked.push_back(t);
        }
    }
    std::vector<UnixSeconds> searched;
    Micros after = (from - 1 - kUnixToPostgresSeconds) * kUsPerSecond;
    for (;;) {
        const auto next = next_firing(spec, after, zone);
        ASSERT_TRUE(next.has_value()) << text;
        const UnixSeconds t = *next / kUsPerSecond + kUnixToPostgresSeconds;
        if (t >= to) {
            break;
        }
        searched.push_back(t);
        // A time between firings finds the same next one.
        const Micros mid = after + (*next - after) / 2;
        ASSERT_EQ(next_firing(spec, mid, zone), next) << text;
        after = *next;
    }
    ASSERT_EQ(searched, walked) << text;
}

// Every expression the parser accepts fires, within the search's bound, in
// any zone and from any instant; no text makes the parser misbehave.
TEST(CronProperty, EveryAcceptedExpressionFires) {
    std::mt19937 rng(256);
    auto pick = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
    int accepted = 0;
    for (int i = 0; i < 20'000; ++i) {
        std::string day = pick(0, 9) == 0 ? "$" : random_field(rng, 1, 31);
        std::string text = random_field(rng, 0, 59) + " " + random_field(rng, 0, 23) + " " + day +
                           " " + random_field(rng, 1, 12) + " " + random_field(rng, 0, 7);
        if (pick(0, 3) == 0) {
            text.insert(0, random_field(rng, 0, 59) + " ");
        }
        const CronParse parsed = parse_cron(text);
        if (!parsed.ok) {
            continue;
        }
        ++accepted;
        const Micros after = utc(pick(1900, 2400), pick(1, 12), pick(1, 28), pick(0, 23));
        const FakeZone& zone = i % 2 == 0 ? kUtc : kNewYork;
        const auto next = next_firing(parsed.spec, after, zone);
        ASSERT_TRUE(next.has_value()) << text << " after " << show(after);
        ASSERT_GT(*next, after) << text;
    }
    EXPECT_GT(accepted, 10'000);
}

TEST(CronParse, ArbitraryBytes) {
    std::mt19937 rng(7);
    const std::string alphabet = "0123456789*/-,$@ \tjanFEBmonSUNxyz\x01\x7f\xc3\xa9";
    for (int i = 0; i < 50'000; ++i) {
        std::string text;
        const int length = std::uniform_int_distribution<int>(0, 40)(rng);
        for (int j = 0; j < length; ++j) {
            text +=
                alphabet[std::uniform_int_distribution<std::size_t>(0, alphabet.size() - 1)(rng)];
        }
        const CronParse parsed = parse_cron(text);
        if (parsed.ok) {
            EXPECT_TRUE(next_firing(parsed.spec, 0, kBerlin).has_value()) << text;
        } else {
            EXPECT_LE(parsed.error.offset, text.size()) << text;
            EXPECT_NE(parsed.error.field, nullptr);
            EXPECT_NE(parsed.error.message, nullptr);
        }
    }
}

struct NamedZone {
    const char* name;
    const FakeZone* zone;
};

const NamedZone kZones[] = {{"New York", &kNewYork},
                            {"Berlin", &kBerlin},
                            {"Lord Howe", &kLordHowe},
                            {"Dublin", &kDublin},
                            {"Sydney", &kSydney}};

TEST(CronProperty, FiveFieldsMinuteByMinuteOver2026) {
    std::mt19937 rng(37);
    const UnixSeconds from = days_from_civil(2026, 1, 1) * kSecondsPerDay;
    const UnixSeconds to = days_from_civil(2027, 1, 2) * kSecondsPerDay;
    for (const NamedZone& z : kZones) {
        for (int i = 0; i < 8; ++i) {
            const std::string text = random_field(rng, 0, 59) + " " + random_field(rng, 0, 23) +
                                     " " + random_field(rng, 1, 31) + " " +
                                     random_field(rng, 1, 12) + " " + random_field(rng, 0, 7);
            SCOPED_TRACE(std::string(z.name) + ": " + text);
            check_against_walk(text, *z.zone, from, to, 60);
        }
    }
}

TEST(CronProperty, DstDaysMinuteByMinute) {
    std::mt19937 rng(2026);
    for (const NamedZone& z : kZones) {
        for (const UnixSeconds around : {1772953200, 1793512800, 1774746000, 1792890000, 1775314800,
                                         1791041400, 1775318400, 1791043200}) {
            for (int i = 0; i < 12; ++i) {
                // Hours and minutes only, so that each spec fires near the shift.
                const std::string text =
                    random_field(rng, 0, 59) + " " + random_field(rng, 0, 23) + " * * *";
                SCOPED_TRACE(std::string(z.name) + ": " + text);
                check_against_walk(text, *z.zone, around - 2 * kSecondsPerDay,
                                   around + 2 * kSecondsPerDay, 60);
            }
        }
    }
}

TEST(CronProperty, SixFieldsSecondBySecondAroundShifts) {
    std::mt19937 rng(6);
    for (const NamedZone& z : kZones) {
        for (const UnixSeconds around :
             {1772953200, 1793512800, 1774746000, 1792890000, 1775314800, 1791041400}) {
            for (int i = 0; i < 3; ++i) {
                const std::string text = random_field(rng, 0, 59) + " " + random_field(rng, 0, 59) +
                                         " " + random_field(rng, 0, 23) + " * * *";
                SCOPED_TRACE(std::string(z.name) + ": " + text);
                check_against_walk(text, *z.zone, around - std::int64_t{6} * 3600,
                                   around + std::int64_t{6} * 3600, 1);
            }
        }
    }
}

}  // namespace
}  // namespace pg_throttle::core
