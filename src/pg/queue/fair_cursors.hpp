// The round-robin cursors, in shared memory: per (database, queue) the
// group_key of the group claim_group served last (throttle.group_policy.
// fairness = 'round_robin'), and apart from it the concurrency_key of the
// key claim served last (throttle.concurrency_policy.fairness), so that the
// next claim starts its walk after it, whichever worker makes it.
//
// A fixed table of 256 slots under one LWLock ("pg_throttle fair cursors",
// held for a look-up or a store, never around anything that raises or
// waits); past 256 cursors in use the slot used longest ago goes. Not
// durable: after a restart (or an eviction) the claims know no cursor, and
// serve oldest first once, which sets it. Fairness is a property of
// throughput, not a promise across a crash.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

void fair_cursors_request_shmem();
void fair_cursors_attach_shmem();

// Whose turn a cursor keeps.
enum class FairTurns : int32 {
    kGroups = 1,           // claim_group's groups, by group_key
    kConcurrencyKeys = 2,  // claim's concurrency keys ('': its events without one)
};

// The key served last of `turns` for `queue` in the current database,
// copied into the current memory context; nullptr when none is known.
// Raises only when out of memory, outside the lock.
text* fair_cursor_of(FairTurns turns, const text* queue);

// Records `key` as the key served last of `turns` for `queue`. Raises
// nothing.
void fair_cursor_store(FairTurns turns, const text* queue, const text* key);

}  // namespace pg_throttle::pg
