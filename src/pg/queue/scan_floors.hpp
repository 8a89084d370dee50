// The scan floors of the queues (core/scan_floor.hpp), in shared memory:
// where throttle.claim starts its walk of a queue's due events, so that the
// index entries finished claims left behind (which an old snapshot keeps
// from vacuum) are not walked again by every claim.
//
// One floor per (database, queue), for one priority: the highest that the
// queue's last claims found. A fixed table of slots under one LWLock ("pg_throttle scan floors",
// taken for a few loads and stores, never around anything that raises or
// waits); a queue without a slot, or a priority the slot does not track, is
// walked from the start, as without floors.
//
// The writers: throttle._event_check() (the row trigger every INSERT and
// UPDATE of throttle.event runs, whoever writes) notes each pending event
// without a group_key it writes; at the commit, once the rows are visible,
// their positions are reported to the floors (scan_floor_note_write). A
// rollback reports nothing: what it wrote is gone.
//
// Floors are off while max_prepared_transactions > 0: the commit of a
// prepared transaction runs in a session that did not note its writes.
#pragma once

#include "core/scan_floor.hpp"
#include "pg/pg_headers.hpp"

namespace pg_throttle::pg {

void scan_floors_request_shmem();
void scan_floors_attach_shmem();

// A count of the floor of `queue` begun by a claim (scan_floor_count_begin).
struct FloorCountOf {
    bool tracked;    // the queue has a slot: `priority` and `count` mean something
    int32 priority;  // the priority the slot's floor is for
    int slot;
    uint32 generation;
    core::FloorCount count;
};

// Begins a count for `queue` in the current database, before the statement
// whose snapshot counts. Raises nothing.
FloorCountOf scan_floor_count_begin(const text* queue);

// Ends it: `first` is the first pending event without a group_key at the
// tracked priority at or after count.from in that statement's snapshot
// (core::kQueueEnd when none). Returns the floor a claim at that priority
// may start from (core::kQueueStart when none). Raises nothing.
core::QueuePosition scan_floor_count_end(const FloorCountOf& of, core::QueuePosition first);

// The queue's claims now find `priority` highest: its slot tracks it from
// here, its floor not known yet (taking a slot when the queue had none).
// Raises nothing.
void scan_floor_track(const text* queue, int32 priority);

// Called by the row trigger for a pending event without a group_key: its
// position is reported to the floors when the transaction commits.
void scan_floor_note_pending(const text* queue, int32 priority, core::QueuePosition at);

}  // namespace pg_throttle::pg
