// The round-robin cursors of claim_group (throttle.group_policy.fairness =
// 'round_robin'), in shared memory: per (database, queue) the group_key of
// the group served last, so that the next claim starts its walk of the due
// groups after it, whichever worker makes it.
//
// A fixed table of 256 slots under one LWLock ("pg_throttle fair cursors",
// held for a look-up or a store, never around anything that raises or
// waits); past 256 queues in use the slot used longest ago goes. Not
// durable: after a restart (or an eviction) the cycle starts again at the
// first key. Fairness is a property of throughput, not a promise across a
// crash.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

void fair_cursors_request_shmem();
void fair_cursors_attach_shmem();

// The group_key served last for `queue` in the current database, copied
// into the current memory context; nullptr when none is known (the cycle
// starts at the first key). Raises only when out of memory, outside the
// lock.
text* fair_cursor_of(const text* queue);

// Records `group_key` as the group served last for `queue`. Raises nothing.
void fair_cursor_store(const text* queue, const text* group_key);

}  // namespace pg_throttle::pg
