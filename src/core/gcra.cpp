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

std::int64_t gcra_remaining(Micros tat, Micros now, const BucketShape& shape) noexcept {
    const Micros base = std::max(tat, now);
    const Micros headroom = saturating_add(now, shape.tolerance) - base;
    if (headroom <= 0) {
        return 0;
    }
    return std::min(headroom / shape.emission, shape.burst);
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
    return saturating_add(current, -(cost * shape.emission));
}

GcraDecision gcra_reserve(std::optional<Micros> tat, Micros now, const BucketShape& shape,
                          std::int64_t cost, Micros max_wait) noexcept {
    const Micros base = tat.has_value() ? std::max(*tat, now) : now;
    const Micros unchanged = tat.has_value() ? *tat : now;
    // A peek answers for one unit and takes nothing: a request of 0 always
    // passes, which says nothing about the bucket.
    const bool peek = cost == 0;
    const std::int64_t asked = peek ? 1 : cost;
    // asked <= burst, so asked * T <= tau: no overflow.
    const Micros next = saturating_add(base, asked * shape.emission);
    const Micros allowed_at = saturating_add(next, -shape.tolerance);
    const Micros wait = allowed_at > now ? allowed_at - now : 0;
    const bool allowed = wait <= max_wait;
    GcraDecision d{};
    d.allowed = allowed;
    d.tat = (allowed && !peek) ? next : unchanged;
    d.remaining = gcra_remaining(d.tat, now, shape);
    d.retry_after = (allowed && wait == 0) ? 0 : wait;
    d.reset_after = std::max(d.tat, now) - now;
    d.allowed_at = allowed_at;
    return d;
}

}  // namespace pg_throttle::core
