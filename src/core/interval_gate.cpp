#include "core/interval_gate.hpp"

namespace pg_throttle::core {

IntervalDecision decide_interval(const IntervalWindow* current, Micros now, Micros every) noexcept {
    if (current != nullptr && window_denies(*current, now)) {
        return IntervalDecision{false, *current};
    }
    return IntervalDecision{true, IntervalWindow{now, saturating_add(now, every)}};
}

}  // namespace pg_throttle::core
