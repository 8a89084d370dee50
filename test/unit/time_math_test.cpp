#include "core/time_math.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

namespace pg_throttle::core {
namespace {

constexpr Micros kMax = std::numeric_limits<Micros>::max();
constexpr Micros kMin = std::numeric_limits<Micros>::min();

TEST(SaturatingAdd, AddsInRange) {
    EXPECT_EQ(saturating_add(1, 2), 3);
    EXPECT_EQ(saturating_add(-5, 2), -3);
}

TEST(SaturatingAdd, ClampsAtTheEnds) {
    EXPECT_EQ(saturating_add(kMax, 1), kMax);
    EXPECT_EQ(saturating_add(kMax - 1, 5), kMax);
    EXPECT_EQ(saturating_add(kMin, -1), kMin);
    EXPECT_EQ(saturating_add(kMax, kMin), -1);
}

TEST(SaturatingSub, SubtractsInRange) {
    EXPECT_EQ(saturating_sub(3, 5), -2);
    EXPECT_EQ(saturating_sub(kMin, kMin), 0);
    EXPECT_EQ(saturating_sub(kMax, kMax), 0);
    EXPECT_EQ(saturating_sub(-1, kMax), kMin);
}

TEST(SaturatingSub, ClampsAtTheEnds) {
    EXPECT_EQ(saturating_sub(kMax, -1), kMax);
    EXPECT_EQ(saturating_sub(0, kMin), kMax);
    EXPECT_EQ(saturating_sub(kMin, 1), kMin);
    EXPECT_EQ(saturating_sub(-2, kMax), kMin);
    EXPECT_EQ(saturating_sub(kMax, kMin), kMax);
    EXPECT_EQ(saturating_sub(kMin, kMax), kMin);
}

// A lease, a window or a deadline that ends at saturating_add(start, length)
// is still running at every time point PostgreSQL can show before the exact
// end: clamping to kNever only ever makes it end later. Time points from
// MIN_TIMESTAMP to END_TIMESTAMP - 1 (4714-11-24 BC to 294276-12-31).
TEST(SaturatingAdd, AClampedEndIsAfterEveryPostgresTime) {
    constexpr Micros kPgMin = -211'813'488'000'000'000;
    constexpr Micros kPgEnd = 9'223'371'331'200'000'000;  // exclusive
    const Micros starts[] = {kPgMin, kPgMin + 1,         -1,         0,
                             1,      kPgEnd - kUsPerDay, kPgEnd - 2, kPgEnd - 1};
    const Micros lengths[] = {1,
                              2,
                              kUsPerDay,
                              30 * kUsPerDay,
                              kUsPerDay * 68 * 366,
                              kMax - kPgEnd,
                              kMax - kPgEnd + 1,
                              kMax / 2,
                              kMax - 1,
                              kMax};
    for (const Micros start : starts) {
        for (const Micros length : lengths) {
            const Micros end = saturating_add(start, length);
            const __int128 exact = static_cast<__int128>(start) + length;
            EXPECT_EQ(end, exact > kMax ? kMax : static_cast<Micros>(exact));
            // The last instant still inside [start, start + length), as far as
            // PostgreSQL's time points go.
            const __int128 last = std::min<__int128>(exact - 1, kPgEnd - 1);
            EXPECT_LT(static_cast<Micros>(last), end) << start << " + " << length;
            EXPECT_LT(start, end);
        }
    }
}

TEST(IntervalToMicros, UsesPostgresComparisonConventions) {
    EXPECT_EQ(interval_to_micros(0, 0, 1), 1);
    EXPECT_EQ(interval_to_micros(0, 1, 0), 86'400'000'000);
    EXPECT_EQ(interval_to_micros(1, 0, 0), 30 * 86'400'000'000);
    EXPECT_EQ(interval_to_micros(1, -30, 0), 0);
    EXPECT_EQ(interval_to_micros(0, 0, -7), -7);
}

TEST(IntervalToMicros, RejectsWhatDoesNotFit) {
    EXPECT_FALSE(interval_to_micros(std::numeric_limits<std::int32_t>::max(),
                                    std::numeric_limits<std::int32_t>::max(), kMax)
                     .has_value());
    EXPECT_FALSE(interval_to_micros(0, 1, kMax).has_value());
    EXPECT_FALSE(interval_to_micros(0, -1, kMin).has_value());
    // int64 microseconds span about 292,000 years of 360 days.
    EXPECT_TRUE(interval_to_micros(12 * 290'000, 0, 0).has_value());
    EXPECT_FALSE(interval_to_micros(12 * 300'000, 0, 0).has_value());
}

TEST(SleepTimeoutMs, RoundsUpToWholeMilliseconds) {
    EXPECT_EQ(sleep_timeout_ms(1), 1);
    EXPECT_EQ(sleep_timeout_ms(1000), 1);
    EXPECT_EQ(sleep_timeout_ms(1001), 2);
    EXPECT_EQ(sleep_timeout_ms(0), 1);
    EXPECT_EQ(sleep_timeout_ms(-5), 1);
}

TEST(SleepTimeoutMs, NeverExceedsWhatWaitLatchCanTake) {
    constexpr std::int32_t kIntMax = std::numeric_limits<std::int32_t>::max();
    // 2^32 + 1 ms: truncated to 32 bits it would be a 1 ms poll.
    EXPECT_EQ(sleep_timeout_ms(4'294'967'297'000), kIntMax);
    EXPECT_EQ(sleep_timeout_ms(30 * kUsPerDay), kIntMax);
    EXPECT_EQ(sleep_timeout_ms(kMax), kIntMax);
    EXPECT_EQ(sleep_timeout_ms(Micros{kIntMax} * 1000), kIntMax);
    EXPECT_EQ(sleep_timeout_ms(Micros{kIntMax - 1} * 1000), kIntMax - 1);
}

}  // namespace
}  // namespace pg_throttle::core
