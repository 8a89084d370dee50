// The scan floors of the queues (core/scan_floor.hpp), in shared memory:
// where throttle.claim starts its walk of a queue's due events, so that the
// index entries finished claims left behind (which an old snapshot keeps
// from vacuum) are not walked again by every claim.
//
// A slot per (database, queue), with a floor for each of two priorities:
// the highest that the queue's claims found, and one other below it (a
// queue with urgent events above its backlog is served at both). A fixed
// table of 256 slots under one LWLock ("pg_throttle scan floors", held for
// a look-up among them and a few stores, never around anything that raises
// or waits); a queue without a slot, or a priority its slot does not track,
// is walked from the start, as without floors; past 256 queues in use the
// slot used longest ago goes.
//
// The same protocol keeps a floor of the queue's claims without a group_key
// by (lease_until, id), where claim's look-up of expired claims starts:
// completed claims leave their entries in event_leases_single too.
//
// The writers: throttle._event_check() (the row trigger every INSERT and
// UPDATE of throttle.event runs, whoever writes) notes each pending event,
// and each claim, without a group_key it writes; at the commit, once the rows are visible,
// their positions are reported to the floors (scan_floor_note_write). A
// rollback reports nothing: what it wrote is gone.
//
// The readers: a claim in READ COMMITTED counts the floor in the statement
// it runs first (scan_floor_count_begin before it, _end after). A claim in
// a transaction that has written already (it has a transaction id) sees its
// own changes, which a rollback may undo, so it only uses the floor,
// lowered to the pending events it wrote itself, and publishes nothing; a
// claim of REPEATABLE READ or SERIALIZABLE, whose snapshot may be older
// than the floor, scans from the start.
//
// What a claim may miss: an event whose commit runs at the same moment as
// the claim (committed but not yet reported), as it would have missed one
// committed just after its snapshot; the next claim finds it. A write that
// goes unreported (a table written with its triggers disabled, a trigger
// of the user's that moves a row after event_check noted it) waits for the
// next count from the start, at most a minute later.
//
// Floors are off while max_prepared_transactions > 0: the commit of a
// prepared transaction runs in a session that did not note its writes.
#pragma once

#include "core/scan_floor.hpp"
#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

void scan_floors_request_shmem();
void scan_floors_attach_shmem();

inline constexpr int kFloorLevels = 2;

// A count of one tracked priority's floor (from core::kQueueStart when not
// tracked).
struct LevelCount {
    bool tracked;  // the slot tracks a priority here: the rest means something
    int32 priority;
    int level;  // its place in the slot
    uint32 generation;
    core::FloorCount count;
};

// The counts a claim begun for `queue` (scan_floor_count_begin): levels[0]
// the higher priority, levels[1] the lower; and the queue's leases.
struct FloorCountOf {
    bool off;  // floors are off, or not for this claim (its isolation level)
    int slot;  // -1: no slot
    uint32 generation;
    LevelCount levels[kFloorLevels];
    LevelCount leases;
};

// Positions per tracked level and for the leases, as FloorCountOf has them.
struct FloorFirsts {
    core::QueuePosition levels[kFloorLevels];
    core::QueuePosition leases;
};

// Begins the counts for `queue` in the current database, before the
// statement whose snapshot counts. Raises nothing.
FloorCountOf scan_floor_count_begin(const text* queue);

// Where a claim's scans start: per priority the slot tracks, and for the
// expired claims (core::kQueueStart: from the start).
struct ScanStarts {
    bool tracked[kFloorLevels];
    int32 priority[kFloorLevels];
    FloorFirsts floors;

    bool tracks(int32 level) const { return of(level) != nullptr; }
    // Where a scan of the priority `level` starts.
    core::QueuePosition at(int32 level) const {
        const core::QueuePosition* floor = of(level);
        return floor == nullptr ? core::kQueueStart : *floor;
    }

private:
    const core::QueuePosition* of(int32 level) const {
        for (int i = 0; i < kFloorLevels; i++) {
            if (tracked[i] && priority[i] == level) {
                return &floors.levels[i];
            }
        }
        return nullptr;
    }
};

// Ends them: first.levels[i] is the first pending event without a
// group_key at levels[i]'s priority at or after its count.from in that
// statement's snapshot, first.leases the first claim without a group_key by
// (lease_until, id) at or after the leases' count.from (core::kQueueEnd when
// none). Returns where the claim's scans start. Raises nothing.
ScanStarts scan_floor_count_end(const FloorCountOf& of, const FloorFirsts& first);

// The queue's claims found `priority` highest: its slot tracks it from
// here, in place of the lower of the two it tracked, its floor not known
// yet (taking a slot when the queue had none). Raises nothing.
void scan_floor_track(const text* queue, int32 priority);

// Called by the row trigger for a pending event without a group_key: its
// position is reported to the floors when the transaction commits.
void scan_floor_note_pending(const text* queue, int32 priority, core::QueuePosition at);

// And for a claim without a group_key: its (lease_until, id).
void scan_floor_note_claimed(const text* queue, core::QueuePosition lease);

}  // namespace pg_throttle::pg
