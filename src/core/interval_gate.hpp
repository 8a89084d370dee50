// "At most once per interval": the decision behind throttle.acquire.
//
// A grant at time g with interval e opens a window [g, g + e) in which every
// other caller is denied. The window's end is fixed at grant time, so the
// decision needs only the stored end and the current time, and an entry whose
// window has ended is indistinguishable from an absent one.
//
// A window whose end g + e would pass the last int64 microsecond ends at
// kNever, and a window ending at kNever never closes, even for a `now` of
// kNever itself (one that ends exactly there cannot be told apart, and
// denies that one instant more): [g, g + e) then covers every later time
// point, so a window never grants twice, at any time point.
#pragma once
#include "core/cpp_only.hpp"

#include "core/time_math.hpp"

namespace pg_throttle::core {

struct IntervalWindow {
    Micros granted_at;  // start of the window opened by the last grant
    Micros expires_at;  // first instant at which a new grant is possible
};

struct IntervalDecision {
    bool granted;
    IntervalWindow window;  // the window in force after the decision
};

// Whether a window that is still open denies a caller at `now`. A clock that
// stepped back before the grant keeps denying until expires_at: never an
// extra grant.
constexpr bool window_denies(const IntervalWindow& window, Micros now) noexcept {
    return now < window.expires_at || window.expires_at == kNever;
}

// Decide a call at `now` asking for windows of `every` (> 0) microseconds.
// `current` is the stored window, or nullptr when there is none.
IntervalDecision decide_interval(const IntervalWindow* current, Micros now, Micros every) noexcept;

}  // namespace pg_throttle::core
