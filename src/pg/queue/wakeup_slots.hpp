// The wake-ups' shared state (wakeups.hpp): a slot per database, shared by
// the committing sessions, the launcher and the wakers. Plain data; the
// fields but the two instants are read and written under the one LWLock
// "pg_throttle wakeups", taken alone and never around anything that raises
// or waits.
#pragma once

#include "pg/server/pg_headers.hpp"

extern "C" {
#include "port/atomics.h"
}

namespace pg_throttle::pg {

inline constexpr int kWakeupSlots = 64;
// +infinity for the two instants: nothing ahead.
inline constexpr uint64 kNothingAhead = static_cast<uint64>(PG_INT64_MAX);

struct WakeupSlot {
    Oid dbid;                // InvalidOid: free
    bool wanted;             // a waker should run here: the launcher starts one
    bool starting;           // the launcher registered a waker that has not attached yet
    bool running;            // a waker is attached
    bool absent;             // no pg_throttle with wake-ups here: none until _waker_start()
    TimestampTz held_until;  // no waker before (wakeups_hold)
    TimestampTz started_at;  // when `starting` was set
    TimestampTz restart_at;  // not started again before (a waker that failed)
    TimestampTz covered;     // the last pass's upto: where the next waker goes on from
    int failures;            // starts or passes that failed in a row (the back-off)
    int pid;                 // the attached waker's
    Latch* latch;            // the attached waker's
    // Instants as TimestampTz bit patterns (signed: compare as int64).
    // hinted: the earliest instant committed since the waker last looked.
    // planned: when a waker must next pass: the attached one's wake-up, or,
    // with none attached, when the launcher starts one (+infinity: never).
    pg_atomic_uint64 hinted;
    pg_atomic_uint64 planned;
};

struct WakeupsShared {
    Latch* launcher_latch;  // nullptr: no launcher
    WakeupSlot slots[kWakeupSlots];
};
static_assert(std::is_trivially_copyable_v<WakeupsShared>);

WakeupsShared* wakeups_shared();
LWLock* wakeups_lock();
bool wakeups_enabled();  // pg_throttle.wakeups

inline TimestampTz instant_of(uint64 bits) {
    return static_cast<TimestampTz>(bits);
}
inline uint64 bits_of(TimestampTz instant) {
    return static_cast<uint64>(instant);
}

// Lowers `cell` to `instant` when it is earlier; true when it did.
bool lower_instant(pg_atomic_uint64* cell, TimestampTz instant);

// How long before `planned` the launcher starts a waker that exited
// because nothing was near.
inline constexpr int64 kStartAhead = 2 * USECS_PER_SEC;
// A hint that asks for a pass from the beginning of time (a prepared
// transaction committed: its instants are unknown).
inline constexpr TimestampTz kFromTheStart = DT_NOBEGIN + 1;

// The back-off of a slot whose waker failed to start or failed a pass,
// under the lock: not again before 1, 2, 4 ... 60 s.
void wakeup_slot_failed(WakeupSlot* slot, TimestampTz now);

// The slot of `database`, or -1; under the lock.
int wakeup_slot_find(Oid database);
// The slot of `database`, or a free or idle one given to it, or -1 when
// every slot is busy; under the lock, exclusive.
int wakeup_slot_take(Oid database);

}  // namespace pg_throttle::pg

// The waker's loop and the launcher's (background worker entry points).
extern "C" {
PGDLLEXPORT void pg_throttle_waker_main(Datum slot);
PGDLLEXPORT void pg_throttle_wakeup_launcher_main(Datum arg);
}
