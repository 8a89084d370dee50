// GCRA near the ends of the range: shapes up to the largest tolerance, and
// `now` near the ends of PostgreSQL's timestamps and of int64. Every decision
// is checked against the documented formulas in exact 128-bit arithmetic;
// sequences of calls are checked against the bound burst + floor(elapsed / T).
// A fixed-seed PRNG keeps the tests deterministic.
#include "core/gcra.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

namespace pg_throttle::core {
namespace {

using Wide = __int128;

constexpr Micros kMax = std::numeric_limits<Micros>::max();
constexpr Micros kMin = std::numeric_limits<Micros>::min();
constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
// PostgreSQL's timestamps: MIN_TIMESTAMP (4714-11-24 BC) up to END_TIMESTAMP
// (294277-01-01), which is excluded.
constexpr Micros kPgMin = -211'813'488'000'000'000;
constexpr Micros kPgEnd = 9'223'371'331'200'000'000;
constexpr Micros kHour = 3'600 * kUsPerSecond;
constexpr Micros k2025 = 9'132 * kUsPerDay;  // 2025-01-01 00:00 UTC
// The per: '2561944444 hours', inside the int64 range.
constexpr Micros kReportedPer = 2'561'944'444 * kHour;

Micros clamp_to_int64(Wide value) {
    return static_cast<Micros>(std::clamp<Wide>(value, kMin, kMax));
}

Wide ceil_div(Wide a, Wide b) {
    return a / b + (a % b != 0 ? 1 : 0);
}

// The documented formulas, with a TAT of any size.
struct Model {
    Wide next;        // base + cost * T
    Wide allowed_at;  // next - tau
    Wide wait;        // max(0, allowed_at - now)
    bool passes;      // wait within max_wait
};

Model model(std::optional<Micros> tat, Micros now, const BucketShape& s, std::int64_t cost,
            Micros max_wait) {
    const Wide base = std::max<Wide>(tat.value_or(now), now);
    Model m{};
    m.next = base + static_cast<Wide>(std::max<std::int64_t>(cost, 1)) * s.emission;
    m.allowed_at = m.next - s.tolerance;
    m.wait = std::max<Wide>(m.allowed_at - now, 0);
    m.passes = max_wait == kNever || m.wait <= max_wait;  // kNever: no limit
    return m;
}

std::int64_t model_remaining(Micros tat, Micros now, const BucketShape& s) {
    const Wide owed = std::max<Wide>(tat, now) - now;
    if (owed >= s.tolerance) {
        return 0;
    }
    return static_cast<std::int64_t>(std::min<Wide>((s.tolerance - owed) / s.emission, s.burst));
}

// Checks one decision of a TAT below kNever against the model: exact where
// it passes or is denied, out_of_range exactly where the new TAT it would
// leave is not below kNever.
::testing::AssertionResult matches_model(const GcraDecision& d, std::optional<Micros> tat,
                                         Micros now, const BucketShape& s, std::int64_t cost,
                                         Micros max_wait) {
    const Model m = model(tat, now, s, cost, max_wait);
    const bool peek = cost == 0;
    const bool out_of_range = m.passes && !peek && m.next >= kMax;
    const Micros unchanged = tat.value_or(now);
    const Micros tat_after =
        (m.passes && !peek && !out_of_range) ? static_cast<Micros>(m.next) : unchanged;
    auto fail = [&](const char* what) {
        return ::testing::AssertionFailure()
               << what << ": T " << s.emission << " tau " << s.tolerance << " burst " << s.burst
               << " tat " << (tat.has_value() ? *tat : kMin) << " now " << now << " cost " << cost
               << " max_wait " << max_wait;
    };
    if (d.out_of_range != out_of_range) {
        return fail("out_of_range");
    }
    if (d.allowed != (m.passes && !out_of_range)) {
        return fail("allowed");
    }
    if (d.tat != tat_after) {
        return fail("tat");
    }
    if (d.remaining != model_remaining(tat_after, now, s)) {
        return fail("remaining");
    }
    if (d.retry_after != clamp_to_int64(m.wait)) {
        return fail("retry_after");
    }
    if (d.reset_after != clamp_to_int64(std::max<Wide>(tat_after, now) - now)) {
        return fail("reset_after");
    }
    if (d.allowed_at != clamp_to_int64(m.allowed_at)) {
        return fail("allowed_at");
    }
    return ::testing::AssertionSuccess();
}

struct ShapeArgs {
    std::int64_t rate;
    Micros per;
    std::int64_t burst;
};

// Shapes at the edges: T of 1 us and of nearly the whole range, tau of
// 8 days (what is left of int64 after END_TIMESTAMP) and of nearly the
// whole range, the shape at several rates, the largest burst.
std::vector<ShapeArgs> edge_shapes() {
    return {{1, kReportedPer, 1},
            {2, kReportedPer, 1},
            {3, kReportedPer, 1},
            {7, kReportedPer, 1},
            {1'000, kReportedPer, 1},
            {1, kReportedPer / 2, 2},
            {kInt32Max, kReportedPer, kInt32Max},
            {1, kMax, 1},
            {2, kMax, 1},
            {1, kMax / 3, 3},
            {1, kMax - kPgEnd, 1},
            {1, kMax - kPgEnd + 1, 1},
            {1, 1, 1},
            {1, 1, kInt32Max},
            {kInt32Max, kInt32Max, kInt32Max},
            {1, kUsPerDay, 10},
            {100, 60 * kUsPerSecond, 20},
            {3, kUsPerSecond, 3},
            {7, 10, 1}};
}

// Log-uniform in [lo, hi], so every magnitude is drawn.
std::int64_t log_uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
    std::uniform_int_distribution<int> bits(0, 63);
    for (;;) {
        const int b = bits(rng);
        const std::uint64_t top = b == 63 ? static_cast<std::uint64_t>(kMax) : (1ULL << b) * 2 - 1;
        const auto candidate =
            static_cast<std::int64_t>(std::uniform_int_distribution<std::uint64_t>(0, top)(rng));
        if (candidate >= lo && candidate <= hi) {
            return candidate;
        }
    }
}

std::vector<ShapeArgs> random_shapes(std::mt19937_64& rng, int count) {
    std::vector<ShapeArgs> shapes;
    while (static_cast<int>(shapes.size()) < count) {
        const std::int64_t rate = log_uniform(rng, 1, kInt32Max);
        const Micros per = log_uniform(rng, rate, kMax);
        const std::int64_t burst = log_uniform(rng, 1, kInt32Max);
        shapes.push_back({rate, per, burst});
    }
    return shapes;
}

// Starting points: the ends of PostgreSQL's timestamps and of int64, and
// just inside them by T and by tau.
std::vector<Micros> anchors(const BucketShape& s, std::mt19937_64& rng) {
    const Wide candidates[] = {kMin,
                               Wide{kMin} + 1,
                               kPgMin,
                               Wide{kPgMin} + 1,
                               Wide{kPgMin} + s.tolerance,
                               -1,
                               0,
                               k2025,
                               Wide{kPgEnd} - 1,
                               Wide{kPgEnd} - s.emission,
                               Wide{kPgEnd} - s.tolerance,
                               Wide{kMax} - s.tolerance - 1,
                               Wide{kMax} - s.tolerance,
                               Wide{kMax} - s.tolerance + 1,
                               Wide{kMax} - s.emission,
                               kMax - 1,
                               kMax,
                               std::uniform_int_distribution<Micros>(kPgMin, kPgEnd - 1)(rng)};
    std::vector<Micros> out;
    for (const Wide c : candidates) {
        out.push_back(clamp_to_int64(c));
    }
    return out;
}

struct Passed {
    Wide at;  // when the units pass: now, or allowed_at for a reservation
    std::int64_t units;
};

// Drives `calls` calls from `start` on a clock that only moves forward, in
// steps around T and tau, with costs 0 .. burst and (when `reserve`) waits
// and give-backs; checks every decision against the model, retry_after by
// calling again at now + retry_after, and at the end the bound on units.
void drive(const BucketShape& s, Micros start, bool reserve, int calls, std::mt19937_64& rng) {
    std::optional<Micros> tat;
    Micros now = start;
    std::vector<Passed> passed;
    std::uniform_int_distribution<int> pick(0, 7);
    for (int i = 0; i < calls; i++) {
        Wide step = 0;
        switch (pick(rng)) {
            case 0:
                step = 0;
                break;
            case 1:
                step = 1;
                break;
            case 2:
                step = s.emission - 1;
                break;
            case 3:
                step = s.emission;
                break;
            case 4:
                step = std::uniform_int_distribution<Micros>(0, s.emission)(rng) * Wide{3};
                break;
            case 5:
                step = std::uniform_int_distribution<Micros>(0, s.tolerance)(rng);
                break;
            default:
                step = i % 2;
                break;
        }
        now = clamp_to_int64(Wide{now} + step);
        std::int64_t cost = 1;
        switch (pick(rng)) {
            case 0:
                cost = 0;
                break;
            case 1:
                cost = s.burst;
                break;
            case 2:
                cost = std::uniform_int_distribution<std::int64_t>(0, s.burst)(rng);
                break;
            default:
                cost = 1;
                break;
        }
        Micros max_wait = 0;
        if (reserve) {
            const Micros waits[] = {0, s.emission, s.tolerance, kNever,
                                    std::uniform_int_distribution<Micros>(0, kMax)(rng)};
            max_wait = waits[std::uniform_int_distribution<int>(0, 4)(rng)];
        }
        const GcraDecision d = gcra_reserve(tat, now, s, cost, max_wait);
        ASSERT_TRUE(matches_model(d, tat, now, s, cost, max_wait));
        if (!d.allowed && !d.out_of_range && d.retry_after < kNever && cost > 0) {
            // retry_after is the exact wait: the same request passes then
            // (or needs a TAT past kNever), not a microsecond before.
            const Wide then = Wide{now} + d.retry_after;
            if (then <= kMax) {
                const GcraDecision later = gcra_decide(tat, static_cast<Micros>(then), s, cost);
                ASSERT_TRUE(later.allowed || later.out_of_range) << "at now + retry_after";
            }
            const GcraDecision before = gcra_decide(tat, now + d.retry_after - 1, s, cost);
            ASSERT_FALSE(before.allowed || before.out_of_range) << "1 us before retry_after";
        }
        if (!d.allowed || cost == 0) {
            continue;
        }
        const std::optional<Micros> before = tat;
        tat = d.tat;
        passed.push_back({std::max<Wide>(now, d.allowed_at), cost});
        if (reserve && pick(rng) == 0) {
            // Cancelled at once: the bucket is as it was, never fuller.
            const std::optional<Micros> restored = gcra_give_back(*tat, d.tat, s, cost);
            ASSERT_TRUE(restored.has_value());
            ASSERT_EQ(*restored, std::max(before.value_or(now), now));
            ASSERT_EQ(gcra_remaining(*restored, now, s),
                      gcra_remaining(before.value_or(now), now, s));
            tat = restored;
            passed.pop_back();
        } else if (reserve && before.has_value() && *before > now) {
            // Only the latest reservation is given back.
            ASSERT_FALSE(gcra_give_back(*tat, *before, s, cost).has_value());
        }
    }
    // Units passed by any instant t: at most burst + floor((t - start) / T).
    std::sort(passed.begin(), passed.end(),
              [](const Passed& a, const Passed& b) { return a.at < b.at; });
    Wide units = 0;
    for (const Passed& p : passed) {
        units += p.units;
        ASSERT_LE(units, s.burst + (p.at - start) / s.emission)
            << "T " << s.emission << " burst " << s.burst << " start " << start;
    }
}

void drive_all(const std::vector<ShapeArgs>& shapes, std::mt19937_64& rng, int calls) {
    for (const ShapeArgs& a : shapes) {
        const BucketShapeResult r = make_bucket_shape(a.rate, a.per, a.burst);
        const Wide emission = ceil_div(a.per, a.rate);
        if (r.error == BucketShapeError::kTooLarge) {
            // Refused exactly when tau does not fit.
            EXPECT_GT(emission * a.burst, kMax) << a.rate << " per " << a.per << " x " << a.burst;
            continue;
        }
        ASSERT_EQ(r.error, BucketShapeError::kNone);
        ASSERT_EQ(r.shape.emission, emission);
        ASSERT_EQ(r.shape.tolerance, emission * a.burst);
        for (const Micros start : anchors(r.shape, rng)) {
            drive(r.shape, start, false, calls, rng);
            drive(r.shape, start, true, calls, rng);
        }
    }
}

TEST(GcraRange, EdgeShapesNearTheEndsOfTime) {
    std::mt19937_64 rng(39);
    drive_all(edge_shapes(), rng, 80);
}

TEST(GcraRange, RandomShapesNearTheEndsOfTime) {
    std::mt19937_64 rng(20'240'039);
    drive_all(random_shapes(rng, 300), rng, 40);
}

// The case: burst 1, per '2561944444 hours'. Five calls at one
// `now` pass at most once, for every rate and every `now`; where even the
// first call's TAT would pass the last microsecond, every call is refused.
TEST(GcraRange, ReportedShapePassesAtMostOnce) {
    const Micros nows[] = {
        kMin,     kPgMin, -1, 0, 1, k2025, kPgEnd - 1, kMax - kReportedPer, kMax - kReportedPer + 1,
        kMax - 1, kMax};
    for (const std::int64_t rate : {1, 2, 3, 7, 1'000, 1'000'000}) {
        const BucketShapeResult r = make_bucket_shape(rate, kReportedPer, 1);
        ASSERT_EQ(r.error, BucketShapeError::kNone);
        for (const Micros now : nows) {
            std::optional<Micros> tat;
            int allowed = 0;
            for (int call = 0; call < 5; call++) {
                const GcraDecision d = gcra_decide(tat, now, r.shape, 1);
                ASSERT_TRUE(matches_model(d, tat, now, r.shape, 1, 0));
                if (d.allowed) {
                    allowed++;
                    tat = d.tat;
                }
            }
            EXPECT_LE(allowed, 1) << "rate " << rate << " now " << now;
            // Waiting without a limit reserves at most one unit per T.
            tat.reset();
            std::optional<Wide> last_at;
            for (int call = 0; call < 5; call++) {
                const GcraDecision d = gcra_reserve(tat, now, r.shape, 1, kNever);
                ASSERT_TRUE(matches_model(d, tat, now, r.shape, 1, kNever));
                if (d.allowed) {
                    const Wide at = std::max<Wide>(d.allowed_at, now);
                    if (last_at.has_value()) {
                        EXPECT_GE(at, *last_at + r.shape.emission);
                    }
                    last_at = at;
                    tat = d.tat;
                }
            }
        }
    }
    // Rate 1 on a real clock in 2025: the first TAT is already past the end.
    const BucketShape s = make_bucket_shape(1, kReportedPer, 1).shape;
    for (int call = 0; call < 5; call++) {
        const GcraDecision d = gcra_decide(std::nullopt, k2025, s, 1);
        EXPECT_FALSE(d.allowed);
        EXPECT_TRUE(d.out_of_range);
    }
    // From 2000-01-01 it fits: one call passes, the next four are denied,
    // and waiting for the next unit is refused.
    std::optional<Micros> tat;
    int allowed = 0;
    for (int call = 0; call < 5; call++) {
        const GcraDecision d = gcra_decide(tat, 0, s, 1);
        EXPECT_FALSE(d.out_of_range);
        if (d.allowed) {
            allowed++;
            tat = d.tat;
        } else {
            EXPECT_EQ(d.retry_after, kReportedPer);
        }
    }
    EXPECT_EQ(allowed, 1);
    EXPECT_TRUE(gcra_reserve(tat, 0, s, 1, kNever).out_of_range);
    EXPECT_FALSE(gcra_reserve(tat, 0, s, 1, kHour).allowed);
    EXPECT_FALSE(gcra_reserve(tat, 0, s, 1, kHour).out_of_range);
}

// A TAT of kNever is a clamped one: it never lets anything pass, a peek
// included; a request that would pass on it is out_of_range.
TEST(GcraRange, AClampedTatNeverPasses) {
    std::mt19937_64 rng(7);
    std::vector<ShapeArgs> shapes = edge_shapes();
    const std::vector<ShapeArgs> more = random_shapes(rng, 50);
    shapes.insert(shapes.end(), more.begin(), more.end());
    for (const ShapeArgs& a : shapes) {
        const BucketShapeResult r = make_bucket_shape(a.rate, a.per, a.burst);
        if (r.error != BucketShapeError::kNone) {
            continue;
        }
        for (const Micros now : anchors(r.shape, rng)) {
            EXPECT_EQ(gcra_remaining(kNever, now, r.shape), 0);
            for (const std::int64_t cost : {std::int64_t{0}, std::int64_t{1}, r.shape.burst}) {
                for (const Micros max_wait : {Micros{0}, r.shape.tolerance, kNever}) {
                    const GcraDecision d = gcra_reserve(kNever, now, r.shape, cost, max_wait);
                    const Model m = model(kNever, now, r.shape, cost, max_wait);
                    EXPECT_FALSE(d.allowed);
                    EXPECT_EQ(d.out_of_range, m.passes);
                    EXPECT_EQ(d.tat, kNever);
                    EXPECT_EQ(d.remaining, 0);
                }
            }
        }
    }
}

// Before the fix a TAT clamped to the last microsecond let every call pass:
// no decision now stores one.
TEST(GcraRange, NoDecisionStoresTheLastMicrosecond) {
    const BucketShape s = make_bucket_shape(1, kHour, 1).shape;
    const GcraDecision exact = gcra_decide(std::nullopt, kMax - kHour, s, 1);
    EXPECT_TRUE(exact.out_of_range);  // would leave kNever
    const GcraDecision below = gcra_decide(std::nullopt, kMax - kHour - 1, s, 1);
    ASSERT_TRUE(below.allowed);
    EXPECT_EQ(below.tat, kMax - 1);
    EXPECT_FALSE(gcra_decide(below.tat, kMax - kHour - 1, s, 1).allowed);
    EXPECT_FALSE(gcra_decide(below.tat, kMax - 2, s, 1).allowed);
    EXPECT_TRUE(gcra_decide(below.tat, kMax - 1, s, 1).out_of_range);
}

}  // namespace
}  // namespace pg_throttle::core
