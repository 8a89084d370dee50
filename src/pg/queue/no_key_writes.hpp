// Writes of events without a concurrency_key, counted for round robin
// between concurrency keys (claim_key_turns.hpp): the events without a key
// take their turn after the last key, and looking for them means a scan of
// the queue's due events that reads past its keyed ones. A round-robin
// claim that found none pending records so in its queue's cursor
// (fair_cursors.hpp), with the count of its queue read before it looked;
// later claims skip the look while the count is unchanged.
//
// The count: per (database, queue), hashed into 256 shared counters
// (atomics, no lock), raised when a transaction that wrote a pending event
// without a group_key and without a concurrency_key (the row trigger notes
// it) commits, after its rows are visible; all of them when a prepared
// transaction commits (its writer's notes are gone). Two queues that share
// a counter only cost each other a look. Writes that no trigger noted
// (triggers disabled) are found by the look that the hint's age forces
// (kNoKeyHintSeconds).
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

inline constexpr int kNoKeyHintSeconds = 60;

void no_key_writes_request_shmem();
void no_key_writes_attach_shmem();

// The row trigger: this transaction wrote a pending event of `queue`
// without a group_key and without a concurrency_key. Raises nothing.
void no_key_write_note(const text* queue);

// A prepared transaction committed: every count moves.
void no_key_writes_all_moved();

// The count of `queue`'s writes, to be read before the snapshot that looks.
uint64 no_key_writes_count(const text* queue);

}  // namespace pg_throttle::pg
