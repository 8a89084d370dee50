#include "core/interval_gate.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>

namespace pg_throttle::core {
namespace {

constexpr Micros kHour = 3'600 * kUsPerSecond;

TEST(IntervalGate, FirstCallerIsGranted) {
    const IntervalDecision d = decide_interval(nullptr, 1'000, kHour);
    EXPECT_TRUE(d.granted);
    EXPECT_EQ(d.window.granted_at, 1'000);
    EXPECT_EQ(d.window.expires_at, 1'000 + kHour);
}

TEST(IntervalGate, DeniedUntilTheExactEndOfTheWindow) {
    const IntervalWindow w{0, kHour};
    EXPECT_FALSE(decide_interval(&w, 0, kHour).granted);
    EXPECT_FALSE(decide_interval(&w, kHour - 1, kHour).granted);
    const IntervalDecision at_end = decide_interval(&w, kHour, kHour);
    EXPECT_TRUE(at_end.granted);
    EXPECT_EQ(at_end.window.granted_at, kHour);
    EXPECT_EQ(at_end.window.expires_at, 2 * kHour);
}

TEST(IntervalGate, DenialLeavesTheWindowUnchanged) {
    const IntervalWindow w{10, 20};
    const IntervalDecision d = decide_interval(&w, 15, kHour);
    EXPECT_FALSE(d.granted);
    EXPECT_EQ(d.window.granted_at, 10);
    EXPECT_EQ(d.window.expires_at, 20);
}

TEST(IntervalGate, TheGrantsIntervalDecidesNotTheCallers) {
    // A later caller asking for a shorter interval cannot cut the window short.
    const IntervalWindow w{0, kHour};
    EXPECT_FALSE(decide_interval(&w, kHour / 2, 1).granted);
}

TEST(IntervalGate, ClockSteppingBackNeverGrants) {
    const IntervalWindow w{kHour, 2 * kHour};
    EXPECT_FALSE(decide_interval(&w, 0, kHour).granted);
    EXPECT_FALSE(decide_interval(&w, -kHour, 1).granted);
}

TEST(IntervalGate, HugeIntervalsSaturate) {
    const Micros max = std::numeric_limits<Micros>::max();
    const IntervalDecision d = decide_interval(nullptr, kHour, max);
    EXPECT_TRUE(d.granted);
    EXPECT_EQ(d.window.expires_at, max);
    EXPECT_FALSE(decide_interval(&d.window, max - 1, 1).granted);
}

TEST(IntervalGate, WindowDeniesIsTheExpiryRule) {
    const IntervalWindow w{0, 100};
    EXPECT_TRUE(window_denies(w, 99));
    EXPECT_FALSE(window_denies(w, 100));
}

TEST(IntervalGate, AWindowPastTheLastMicrosecondNeverCloses) {
    const Micros max = std::numeric_limits<Micros>::max();
    const IntervalDecision d = decide_interval(nullptr, max - 1, 2);
    ASSERT_TRUE(d.granted);
    EXPECT_EQ(d.window.expires_at, kNever);
    EXPECT_FALSE(decide_interval(&d.window, max, 1).granted);
    EXPECT_TRUE(window_denies(IntervalWindow{max, kNever}, max));
    // A window that ends exactly on the last microsecond, granted at
    // kNever - e: the same, as nothing after it can be told apart.
    EXPECT_TRUE(window_denies(IntervalWindow{max - 5, kNever}, max));
}

// Near the ends of int64 and of PostgreSQL's timestamps, on a clock that
// also steps back, with intervals from 1 us to the whole range: a grant at
// g for e is never followed by another before g + e (exact, in 128 bits),
// and a call at or after g + e is always granted, unless g + e is kNever
// or later: that window never closes.
TEST(IntervalGate, NeverGrantsTwiceInsideAWindowNearTheEnds) {
    using Wide = __int128;
    const Micros max = std::numeric_limits<Micros>::max();
    const Micros min = std::numeric_limits<Micros>::min();
    constexpr Micros kPgMin = -211'813'488'000'000'000;   // MIN_TIMESTAMP
    constexpr Micros kPgEnd = 9'223'371'331'200'000'000;  // END_TIMESTAMP, excluded
    const auto clamp = [&](Wide v) { return static_cast<Micros>(std::clamp<Wide>(v, min, max)); };
    std::mt19937_64 rng(39);
    std::vector<Micros> everys = {
        1, 2, kHour, 86'400 * kUsPerSecond, max - kPgEnd, max - kPgEnd + 1, max / 2, max - 1, max};
    for (int i = 0; i < 40; i++) {
        everys.push_back(static_cast<Micros>(rng() >> (rng() % 63)) | 1);
    }
    for (const Micros every : everys) {
        const Wide starts[] = {min,
                               Wide{min} + 1,
                               kPgMin,
                               -1,
                               0,
                               kPgEnd - 1,
                               Wide{max} - every,
                               Wide{max} - every + 1,
                               max - 1,
                               max};
        for (const Wide start : starts) {
            std::optional<IntervalWindow> stored;
            std::optional<Wide> exact_end;
            Micros now = clamp(start);
            for (int call = 0; call < 60; call++) {
                // Callers ask for intervals of their own; the grant's decides.
                const Micros asked = everys[rng() % everys.size()];
                const IntervalDecision d =
                    decide_interval(stored.has_value() ? &*stored : nullptr, now, asked);
                ASSERT_EQ(d.granted, !exact_end.has_value() ||
                                         (Wide{now} >= *exact_end && *exact_end < kNever))
                    << "now " << now << " every " << asked;
                if (d.granted) {
                    EXPECT_EQ(d.window.granted_at, now);
                    EXPECT_EQ(d.window.expires_at, clamp(Wide{now} + asked));
                    exact_end = Wide{now} + asked;
                    stored = d.window;
                } else {
                    EXPECT_EQ(d.window.expires_at, stored->expires_at);
                }
                const Wide steps[] = {0,
                                      1,
                                      -1,
                                      asked,
                                      Wide{asked} - 1,
                                      every,
                                      -static_cast<Wide>(rng() % (Wide{every} + 1)),
                                      static_cast<Wide>(rng() % (Wide{every} + 1)),
                                      exact_end.value_or(now) - now};
                now = clamp(Wide{now} + steps[rng() % 9]);
            }
        }
    }
}

}  // namespace
}  // namespace pg_throttle::core
