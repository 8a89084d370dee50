// Token buckets with the generic cell rate algorithm (GCRA).
//
// A bucket of capacity `burst` refills at `rate` per `per`. Its only state is
// the theoretical arrival time (TAT): the instant at which the bucket will be
// full again. With emission interval T = per / rate and tolerance
// tau = burst * T, a request of `cost` at `now` is decided as:
//   base = max(TAT, now); new = base + cost * T
//   allowed <=> new - tau <= now; if allowed, TAT := new
// A bucket whose TAT is not after now is full: the same as an absent one.
//
// The ends of the range. Every decision is exact for any int64 `now` and any
// TAT below kNever: the comparisons are made on differences that fit (what
// the bucket owes against tau), never on a clamped time. The one value that
// may not fit is the TAT a passing request leaves, new = base + cost * T;
// it is never clamped (a TAT clamped to the last microsecond would let every
// later request through): a request that passes but whose new TAT is not
// below kNever (294277-01-09 04:00:54.775807) is refused, out_of_range, and
// nothing changes. That needs a tau within `now` of the whole int64 range
// (about 292 000 years from 2000), or a test clock within tau of the end of
// PostgreSQL's timestamps, or waiters queued that far ahead.
// A TAT of kNever is therefore always a clamped one (a caller's, such as a
// bucket born after a crash at R with R + tau past the range): it stands for
// some TAT at or after kNever, so nothing passes on it; a request that
// would pass if it were exact is out_of_range, and remaining is 0. Only
// retry_after and reset_after, durations reported to the caller, are clamped
// to kNever when longer still.
#pragma once
#include "core/cpp_only.hpp"

#include <cstdint>
#include <optional>

#include "core/time_math.hpp"

namespace pg_throttle::core {

struct BucketShape {
    Micros emission;   // T, microseconds per unit
    Micros tolerance;  // tau = burst * T
    std::int64_t burst;
};

enum class BucketShapeError { kNone, kRateTooHigh, kTooLarge };

struct BucketShapeResult {
    BucketShapeError error;
    BucketShape shape;
};

// The shape of a bucket of `rate` (> 0) per `per` (> 0) microseconds with
// capacity `burst` (> 0). T is per / rate rounded UP to whole microseconds:
// a unit never costs less time than the exact rate, so rounding can only
// grant less, never more. A rate above one per microsecond is kRateTooHigh;
// a tolerance that does not fit in int64 is kTooLarge.
BucketShapeResult make_bucket_shape(std::int64_t rate, Micros per, std::int64_t burst) noexcept;

struct GcraDecision {
    bool allowed;
    // The request would pass, but its new TAT would not be below kNever (or
    // the TAT it was given is a clamped one): it is refused (allowed false,
    // tat unchanged), and the caller raises an error rather than answer
    // "denied" for a bucket that may have the units. Never set for a peek of
    // a TAT below kNever: a peek stores nothing.
    bool out_of_range;
    Micros tat;              // the TAT after the decision
    std::int64_t remaining;  // whole units left after the decision, 0 .. burst
    Micros retry_after;      // 0 when allowed, else when the same request would pass
    Micros reset_after;      // until the bucket is full again
    Micros allowed_at;       // new - tau: the first instant the request passes
};
// retry_after and reset_after are clamped to kNever when they do not fit;
// allowed_at to INT64_MIN (before any now) when new - tau is below it.

// Decides a request of `cost` (0 .. burst) at `now`. `tat` is empty for an
// absent bucket. cost 0 peeks: it changes nothing, and answers for a request
// of one unit (allowed when one unit is available now, retry_after the wait
// until one is), with remaining and reset_after of the bucket as it is.
GcraDecision gcra_decide(std::optional<Micros> tat, Micros now, const BucketShape& shape,
                         std::int64_t cost) noexcept;

// Like gcra_decide, but also reserves a request that passes within
// `max_wait` (>= 0; kNever: no limit): TAT advances at once and the caller must wait until
// allowed_at, so waiters are served in the order they reserved. `allowed`
// then means "reserved"; retry_after is the wait (0 when it passes now).
// gcra_decide is gcra_reserve with max_wait = 0. A peek (cost 0) reserves
// nothing: `allowed` then means one unit is available within `max_wait`.
GcraDecision gcra_reserve(std::optional<Micros> tat, Micros now, const BucketShape& shape,
                          std::int64_t cost, Micros max_wait) noexcept;

// The TAT after giving back a reservation of `cost` whose TAT was `reserved`,
// when the bucket's TAT is `current`. Only the latest reservation is given
// back (current == reserved): a later one keeps its place in the queue, and
// an earlier slot is never handed to someone who came after it. A peek
// (cost 0) reserved nothing and gives nothing back.
std::optional<Micros> gcra_give_back(Micros current, Micros reserved, const BucketShape& shape,
                                     std::int64_t cost) noexcept;

// Whole units available at `now` for a bucket with `tat`; 0 for a clamped
// TAT (kNever).
std::int64_t gcra_remaining(Micros tat, Micros now, const BucketShape& shape) noexcept;

}  // namespace pg_throttle::core
