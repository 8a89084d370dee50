#include "core/interval_gate.hpp"

#include <gtest/gtest.h>

#include <limits>

namespace pg_throttle::core {
namespace {

constexpr Micros kHour = 3'600 * kUsPerSecond;

TEST(IntervalGate, FirstCallerIsGranted) {
    const IntervalDecision d = decide_interval(nullptr, 1'000, kHour);
    EXPECT_TRUE(d.granted);
    EXPECT_EQ(d.window.granted_at, 1'000);
    EXPECT_EQ(d.window.closes_at, 1'000 + kHour);
}

TEST(IntervalGate, DeniedUntilTheExactEndOfTheWindow) {
    const IntervalWindow w{0, kHour};
    EXPECT_FALSE(decide_interval(&w, 0, kHour).granted);
    EXPECT_FALSE(decide_interval(&w, kHour - 1, kHour).granted);
    const IntervalDecision at_end = decide_interval(&w, kHour, kHour);
    EXPECT_TRUE(at_end.granted);
    EXPECT_EQ(at_end.window.granted_at, kHour);
    EXPECT_EQ(at_end.window.closes_at, 2 * kHour);
}

TEST(IntervalGate, DenialLeavesTheWindowUnchanged) {
    const IntervalWindow w{10, 20};
    const IntervalDecision d = decide_interval(&w, 15, kHour);
    EXPECT_FALSE(d.granted);
    EXPECT_EQ(d.window.granted_at, 10);
    EXPECT_EQ(d.window.closes_at, 20);
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
    EXPECT_EQ(d.window.closes_at, max);
    EXPECT_FALSE(decide_interval(&d.window, max - 1, 1).granted);
}

TEST(IntervalGate, WindowDeniesIsTheExpiryRule) {
    const IntervalWindow w{0, 100};
    EXPECT_TRUE(window_denies(w, 99));
    EXPECT_FALSE(window_denies(w, 100));
}

}  // namespace
}  // namespace pg_throttle::core
