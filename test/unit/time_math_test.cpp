#include "core/time_math.hpp"

#include <gtest/gtest.h>

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
