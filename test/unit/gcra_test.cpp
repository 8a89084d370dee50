#include "core/gcra.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace pg_throttle::core {
namespace {

constexpr Micros kSecond = kUsPerSecond;
constexpr Micros kMinute = 60 * kSecond;

BucketShape shape(std::int64_t rate, Micros per, std::int64_t burst) {
    const BucketShapeResult r = make_bucket_shape(rate, per, burst);
    EXPECT_EQ(r.error, BucketShapeError::kNone);
    return r.shape;
}

TEST(BucketShape, ExactRate) {
    const BucketShape s = shape(100, kMinute, 20);
    EXPECT_EQ(s.emission, 600'000);
    EXPECT_EQ(s.tolerance, 20 * 600'000);
    EXPECT_EQ(s.burst, 20);
}

TEST(BucketShape, InexactRateRoundsTheEmissionIntervalUp) {
    EXPECT_EQ(shape(3, kSecond, 3).emission, 333'334);
    EXPECT_EQ(shape(7, 10, 1).emission, 2);
    EXPECT_EQ(shape(1'000'000, kSecond, 1).emission, 1);
}

TEST(BucketShape, RejectsRatesAboveOnePerMicrosecond) {
    EXPECT_EQ(make_bucket_shape(1'000'001, kSecond, 1).error, BucketShapeError::kRateTooHigh);
    EXPECT_EQ(make_bucket_shape(2, 1, 1).error, BucketShapeError::kRateTooHigh);
}

TEST(BucketShape, RejectsToleranceBeyondInt64) {
    const Micros huge = std::numeric_limits<Micros>::max() / 2;
    EXPECT_EQ(make_bucket_shape(1, huge, 3).error, BucketShapeError::kTooLarge);
    EXPECT_EQ(make_bucket_shape(1, huge, 2).error, BucketShapeError::kNone);
}

TEST(Gcra, AbsentBucketIsFull) {
    const BucketShape s = shape(10, kSecond, 5);  // T = 100 ms, tau = 500 ms
    const GcraDecision d = gcra_decide(std::nullopt, 0, s, 1);
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.tat, 100'000);
    EXPECT_EQ(d.remaining, 4);
    EXPECT_EQ(d.retry_after, 0);
    EXPECT_EQ(d.reset_after, 100'000);
}

TEST(Gcra, BurstThenDenialWithExactRetryAfter) {
    const BucketShape s = shape(10, kSecond, 5);
    std::optional<Micros> tat;
    for (int i = 0; i < 5; i++) {
        const GcraDecision d = gcra_decide(tat, 0, s, 1);
        ASSERT_TRUE(d.allowed) << i;
        EXPECT_EQ(d.remaining, 4 - i);
        tat = d.tat;
    }
    const GcraDecision denied = gcra_decide(tat, 0, s, 1);
    EXPECT_FALSE(denied.allowed);
    EXPECT_EQ(denied.tat, *tat);  // unchanged
    EXPECT_EQ(denied.remaining, 0);
    EXPECT_EQ(denied.retry_after, 100'000);
    EXPECT_EQ(denied.reset_after, 500'000);
    // One microsecond early: still denied; exactly at new - tau = now: allowed.
    EXPECT_FALSE(gcra_decide(tat, 99'999, s, 1).allowed);
    EXPECT_EQ(gcra_decide(tat, 99'999, s, 1).retry_after, 1);
    EXPECT_TRUE(gcra_decide(tat, 100'000, s, 1).allowed);
}

TEST(Gcra, CostEqualToBurstEmptiesAFullBucket) {
    const BucketShape s = shape(10, kSecond, 5);
    const GcraDecision d = gcra_decide(std::nullopt, 0, s, 5);
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 0);
    EXPECT_EQ(d.reset_after, 500'000);
    // and needs the whole bucket back before it passes again
    EXPECT_FALSE(gcra_decide(d.tat, 499'999, s, 5).allowed);
    EXPECT_TRUE(gcra_decide(d.tat, 500'000, s, 5).allowed);
}

TEST(Gcra, CostZeroPeeksWithoutConsuming) {
    const BucketShape s = shape(10, kSecond, 5);
    const GcraDecision empty = gcra_decide(std::nullopt, 0, s, 5);
    // An empty bucket: a peek is not allowed, and says when one unit is back.
    const GcraDecision peek = gcra_decide(empty.tat, 0, s, 0);
    EXPECT_FALSE(peek.allowed);
    EXPECT_EQ(peek.tat, empty.tat);
    EXPECT_EQ(peek.remaining, 0);
    EXPECT_EQ(peek.retry_after, 100'000);
    EXPECT_EQ(peek.reset_after, 500'000);
    // One unit back: allowed, and still nothing taken.
    const GcraDecision later = gcra_decide(empty.tat, 100'000, s, 0);
    EXPECT_TRUE(later.allowed);
    EXPECT_EQ(later.tat, empty.tat);
    EXPECT_EQ(later.remaining, 1);
    EXPECT_EQ(later.retry_after, 0);
    EXPECT_TRUE(gcra_decide(empty.tat, 100'000, s, 1).allowed);
    EXPECT_FALSE(gcra_decide(empty.tat, 99'999, s, 0).allowed);
    // An absent bucket is full.
    const GcraDecision absent = gcra_decide(std::nullopt, 0, s, 0);
    EXPECT_TRUE(absent.allowed);
    EXPECT_EQ(absent.remaining, 5);
    EXPECT_EQ(absent.reset_after, 0);
    EXPECT_EQ(absent.tat, 0);
}

TEST(Gcra, PeekGivesNothingBack) {
    const BucketShape s = shape(10, kSecond, 5);
    const GcraDecision peek = gcra_reserve(Micros{1'000'000}, 0, s, 0, kSecond);
    EXPECT_FALSE(gcra_give_back(peek.tat, peek.tat, s, 0).has_value());
    const GcraDecision one = gcra_reserve(Micros{1'000'000}, 0, s, 1, kSecond);
    EXPECT_EQ(gcra_give_back(one.tat, one.tat, s, 1), std::optional<Micros>{1'000'000});
}

TEST(Gcra, PeekAgreesWithARequestOfOneAndNeverReserves) {
    const BucketShape s = shape(3, kSecond, 4);
    Micros tat = 0;
    for (Micros now = 0; now < 3 * kSecond; now += 77'777) {
        const GcraDecision one = gcra_decide(tat, now, s, 1);
        const GcraDecision peek = gcra_reserve(tat, now, s, 0, 150'000);
        EXPECT_EQ(peek.tat, tat);
        EXPECT_EQ(peek.allowed, one.retry_after <= 150'000);
        EXPECT_EQ(peek.retry_after, one.retry_after);
        EXPECT_EQ(peek.remaining, gcra_remaining(tat, now, s));
        // Spend two units whenever they pass, to keep the bucket near empty.
        const GcraDecision two = gcra_decide(tat, now, s, 2);
        tat = two.tat;
    }
}

TEST(Gcra, WeightedCostRetryAfterIsTheExactWait) {
    const BucketShape s = shape(100, kMinute, 20);  // T = 600 ms
    const GcraDecision first = gcra_decide(std::nullopt, 0, s, 18);
    ASSERT_TRUE(first.allowed);
    EXPECT_EQ(first.remaining, 2);
    const GcraDecision denied = gcra_decide(first.tat, 0, s, 5);
    EXPECT_FALSE(denied.allowed);
    EXPECT_EQ(denied.retry_after, 3 * 600'000);
    EXPECT_TRUE(gcra_decide(first.tat, denied.retry_after, s, 5).allowed);
}

TEST(Gcra, RefillsAtTheRate) {
    const BucketShape s = shape(10, kSecond, 5);
    const GcraDecision empty = gcra_decide(std::nullopt, 0, s, 5);
    EXPECT_EQ(gcra_remaining(empty.tat, 99'999, s), 0);
    EXPECT_EQ(gcra_remaining(empty.tat, 100'000, s), 1);
    EXPECT_EQ(gcra_remaining(empty.tat, 250'000, s), 2);
    EXPECT_EQ(gcra_remaining(empty.tat, 500'000, s), 5);
    EXPECT_EQ(gcra_remaining(empty.tat, 10 * kSecond, s), 5);
}

TEST(Gcra, ClockSteppingBackNeverGrantsMore) {
    const BucketShape s = shape(10, kSecond, 5);
    const GcraDecision empty = gcra_decide(std::nullopt, kSecond, s, 5);
    EXPECT_FALSE(gcra_decide(empty.tat, 0, s, 1).allowed);
    EXPECT_EQ(gcra_remaining(empty.tat, 0, s), 0);
}

// Calls at fine, irregular steps for a long time never exceed the exact
// bound burst + floor(elapsed * rate / per), for rates whose emission
// interval is not a whole number of microseconds.
TEST(Gcra, RoundingNeverOverGrants) {
    struct Case {
        std::int64_t rate;
        Micros per;
        std::int64_t burst;
        std::int64_t cost;
    };
    const Case cases[] = {{3, kSecond, 3, 1},
                          {7, 1'000, 2, 1},
                          {999'999, kSecond, 10, 1},
                          {100, kMinute, 20, 3},
                          {13, 17, 4, 2}};
    for (const Case& c : cases) {
        const BucketShape s = shape(c.rate, c.per, c.burst);
        std::optional<Micros> tat;
        std::int64_t units = 0;
        Micros now = 0;
        for (int i = 0; i < 200'000; i++) {
            now += 1 + (i * 7919) % 13;  // irregular steps of 1..13 us
            const GcraDecision d = gcra_decide(tat, now, s, c.cost);
            if (d.allowed) {
                units += c.cost;
                tat = d.tat;
            }
            const __int128 exact_bound =
                c.burst + static_cast<__int128>(now) * c.rate / c.per;  // elapsed from 0
            ASSERT_LE(units, exact_bound) << "rate " << c.rate << " per " << c.per << " at " << now;
        }
        EXPECT_GT(units, 0);
    }
}

}  // namespace
}  // namespace pg_throttle::core

namespace pg_throttle::core {
namespace {

TEST(GcraReserve, ReservesWithinMaxWaitInArrivalOrder) {
    const BucketShape s = make_bucket_shape(10, kUsPerSecond, 1).shape;  // T = tau = 100 ms
    const GcraDecision first = gcra_reserve(std::nullopt, 0, s, 1, 0);
    ASSERT_TRUE(first.allowed);
    EXPECT_EQ(first.retry_after, 0);
    const GcraDecision second = gcra_reserve(first.tat, 0, s, 1, 1'000'000);
    ASSERT_TRUE(second.allowed);
    EXPECT_EQ(second.retry_after, 100'000);
    EXPECT_EQ(second.allowed_at, 100'000);
    const GcraDecision third = gcra_reserve(second.tat, 0, s, 1, 1'000'000);
    ASSERT_TRUE(third.allowed);
    EXPECT_EQ(third.allowed_at, 200'000);
    EXPECT_GT(third.allowed_at, second.allowed_at);
}

TEST(GcraReserve, RefusesBeyondMaxWaitWithoutReserving) {
    const BucketShape s = make_bucket_shape(10, kUsPerSecond, 1).shape;
    const GcraDecision first = gcra_reserve(std::nullopt, 0, s, 1, 0);
    const GcraDecision refused = gcra_reserve(first.tat, 0, s, 1, 99'999);
    EXPECT_FALSE(refused.allowed);
    EXPECT_EQ(refused.tat, first.tat);
    EXPECT_EQ(refused.retry_after, 100'000);
    EXPECT_TRUE(gcra_reserve(first.tat, 0, s, 1, 100'000).allowed);
}

TEST(GcraReserve, MaxWaitZeroIsDecide) {
    const BucketShape s = make_bucket_shape(3, kUsPerSecond, 2).shape;
    std::optional<Micros> tat;
    for (Micros now = 0; now < 3 * kUsPerSecond; now += 12'345) {
        const GcraDecision a = gcra_decide(tat, now, s, 1);
        const GcraDecision b = gcra_reserve(tat, now, s, 1, 0);
        ASSERT_EQ(a.allowed, b.allowed);
        ASSERT_EQ(a.tat, b.tat);
        ASSERT_EQ(a.retry_after, b.retry_after);
        tat = a.tat;
    }
}

TEST(GcraGiveBack, OnlyTheLatestReservation) {
    const BucketShape s = make_bucket_shape(10, kUsPerSecond, 1).shape;
    const GcraDecision first = gcra_reserve(std::nullopt, 0, s, 1, 0);
    const GcraDecision second = gcra_reserve(first.tat, 0, s, 1, kUsPerSecond);
    const GcraDecision third = gcra_reserve(second.tat, 0, s, 1, kUsPerSecond);
    // second cannot give back while third is queued behind it
    EXPECT_FALSE(gcra_give_back(third.tat, second.tat, s, 1).has_value());
    // third can: the bucket is as it was before third
    const auto after_third = gcra_give_back(third.tat, third.tat, s, 1);
    ASSERT_TRUE(after_third.has_value());
    EXPECT_EQ(*after_third, second.tat);
}

}  // namespace
}  // namespace pg_throttle::core
