// The extension's one clock. Everything time-dependent reads "now" here, so
// the superuser-only GUC pg_throttle.test_clock can stand in for real time.
#pragma once

#include "core/time_math.hpp"

namespace pg_throttle::pg {

// Defines pg_throttle.test_clock.
void define_clock_guc();

// The test clock when set, otherwise the real time (not the transaction's
// start: a call inside a long transaction sees the time it is made).
core::Micros clock_now();

// Whether pg_throttle.test_clock is set in this session: the entries it makes
// then live apart from those of the real clock (registry.hpp, EntryClock).
bool clock_is_test();

// The real clock, for what is shared between sessions and survives them:
// lock and lease expiry, reclaim, checkpoints. pg_throttle.test_clock never
// applies to these.
core::Micros real_now();

}  // namespace pg_throttle::pg
