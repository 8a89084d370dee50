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

// The group_key claim_group served last for `queue` in the current
// database, copied into the current memory context; nullptr when none is
// known. Raises only when out of memory, outside the lock.
text* fair_group_cursor_of(const text* queue);

// Records `group_key` as the group claim_group served last for `queue`.
// Raises nothing.
void fair_group_cursor_store(const text* queue, const text* group_key);

// What a round-robin claim of concurrency keys found of the queue's events
// without a key: none pending before `until` (DT_NOEND: none), in a look
// whose snapshot came after the queue's count of such writes was `count`
// (no_key_writes.hpp), at `looked_at` (the server's real clock).
struct NoKeyHint {
    uint64 count;
    TimestampTz until;
    TimestampTz looked_at;
};

// Where claim's turn of concurrency keys stands in a queue, and the hint
// kept with it, read together.
struct KeyCursor {
    bool known;
    bool no_key;  // the events without a key were served last (the turn goes on at the first key)
    bool truncated;  // `key` is the first bytes (1 024 at most) of the key served last
    text* key;       // else the key served last, copied into the current memory context
    bool has_hint;
    NoKeyHint hint;
};

KeyCursor fair_key_cursor_of(const text* queue);

// Records `key` (nullptr: the events without a key) as served last by
// claim in `queue`; of a key longer than a slot keeps (schedule refuses
// them, a direct INSERT may write them), its first bytes, marked truncated.
// Raises nothing.
void fair_key_cursor_store(const text* queue, const text* key);

// Keeps `hint` with the key cursor of `queue`, when it has one. Raises
// nothing.
void fair_cursor_store_no_key_hint(const text* queue, const NoKeyHint& hint);

}  // namespace pg_throttle::pg
