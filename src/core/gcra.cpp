#include "core/gcra.hpp"

#include <algorithm>

namespace pg_throttle::core {

BucketShapeResult make_bucket_shape(std::int64_t rate, Micros per, std::int64_t burst) noexcept {
    if (rate > per) {
        return BucketShapeResult{BucketShapeError::kRateTooHigh, {}};
    }
    // ceil(per / rate) without overflow: per, rate > 0.
    const Micros emission = per / rate + (per % rate != 0 ? 1 : 0);
    Micros tolerance = 0;
    if (__builtin_mul_overflow(emission, burst, &tolerance)) {
        return BucketShapeResult{BucketShapeError::kTooLarge, {}};
    }
    return BucketShapeResult{BucketShapeError::kNone, BucketShape{emission, tolerance, burst}};
}

namespace {

// floor((now + tau - max(TAT, now)) / T) for a TAT below kNever, without
// forming now + tau, which need not fit: what the bucket owes is compared
// with tau instead. It saturates only beyond kNever, above tau either way.
std::int64_t remaining_of(Micros tat, Micros now, const BucketShape& shape) noexcept {
    const Micros owed = saturating_sub(std::max(tat, now), now);
    if (owed >= shape.tolerance) {
        return 0;
    }
    return std::min((shape.tolerance - owed) / shape.emission, shape.burst);
}

}  // namespace

std::int64_t gcra_remaining(Micros tat, Micros now, const BucketShape& shape) noexcept {
    // A clamped TAT: the bucket owes at least until kNever.
    return tat == kNever ? 0 : remaining_of(tat, now, shape);
}

GcraDecision gcra_decide(std::optional<Micros> tat, Micros now, const BucketShape& shape,
                         std::int64_t cost) noexcept {
    return gcra_reserve(tat, now, shape, cost, 0);
}

std::optional<Micros> gcra_give_back(Micros current, Micros reserved, const BucketShape& shape,
                                     std::int64_t cost) noexcept {
    if (cost == 0 || current != reserved) {
        return std::nullopt;  // a peek reserved nothing
    }
    // The TAT before the reservation (or the instant it was made, if the
    // bucket was full then): it was a time point, so this fits.
    return saturating_sub(current, cost * shape.emission);
}

GcraDecision gcra_reserve(std::optional<Micros> tat, Micros now, const BucketShape& shape,
                          std::int64_t cost, Micros max_wait) noexcept {
    const Micros base = tat.has_value() ? std::max(*tat, now) : now;
    const Micros unchanged = tat.has_value() ? *tat : now;
    // A peek answers for one unit and takes nothing: a request of 0 always
    // passes, which says nothing about the bucket.
    const bool peek = cost == 0;
    const std::int64_t asked = peek ? 1 : cost;
    // asked <= burst, so asked * T <= tau: no overflow. new - tau is taken
    // as base - (tau - asked * T), which only clamps below INT64_MIN, before
    // any now: such a request passes either way.
    const Micros allowed_at = saturating_sub(base, shape.tolerance - asked * shape.emission);
    // Clamped to kNever only when the exact wait is longer still: only a
    // max_wait of kNever (no limit) lets it pass, as it should.
    const Micros wait = allowed_at > now ? saturating_sub(allowed_at, now) : 0;
    const bool passes = wait <= max_wait;
    // The TAT a passing request leaves: never clamped (a clamped TAT would
    // let every later request through), and below kNever, which stands for
    // a clamped TAT.
    Micros next = 0;
    const bool next_fits =
        !__builtin_add_overflow(base, asked * shape.emission, &next) && next != kNever;
    // A clamped TAT is a lower bound: what passes on it may not pass on the
    // TAT it stands for, and a request that does pass leaves no TAT that fits.
    const bool clamped = tat.has_value() && *tat == kNever;
    GcraDecision d{};
    d.out_of_range = passes && (clamped || (!peek && !next_fits));
    d.allowed = passes && !d.out_of_range;
    d.tat = (d.allowed && !peek) ? next : unchanged;
    // An absent bucket at a `now` of kNever is full, not clamped.
    d.remaining = clamped ? 0 : remaining_of(d.tat, now, shape);
    d.retry_after = wait;
    d.reset_after = saturating_sub(std::max(d.tat, now), now);
    d.allowed_at = allowed_at;
    return d;
}

}  // namespace pg_throttle::core
