// throttle.claim(queue, worker, lease, max): up to max due events without a
// group_key, for one worker, natively: each step is one statement whose plan
// this backend prepared once (kept_plan.hpp), and the claim's token comes
// straight from the fence counter.
//
// The steps, in one snapshot each and never waiting for a row another
// transaction holds (SKIP LOCKED):
//  0. the highest priority of the pending events, whether any claim (of
//     either claimer) expired, whether the queue has pending events with a
//     concurrency_key, its bucket, whether it is paused (then the claim
//     ends with no rows), and its scan floor counted again (where
//     the first pending event of the priority its slot tracks is:
//     scan_floors.hpp), in one statement; the scans of that priority start
//     at the floor;
//  -  when an expired claim of claim_group holds back a due event without a
//     group_key (a newer run of its item_key), that claim ended first
//     (blocking_claims.hpp);
//  -  the lean path, for a queue with no concurrency_key pending, no bucket
//     and no expired claim of its own: one statement per priority finds,
//     locks and marks the due events (claim_due_lean), and that is the
//     claim; else
//  -  the concurrency keys that the snapshot shows full;
//  1. claims whose lease expired, oldest lease first;
//  2. due pending events, one priority at a time from the highest (a skip
//     scan along event_due_single: within a priority run_at <= now bounds
//     the scan, so events scheduled for later cost nothing), the next
//     priority looked up only while the claim wants more; an event whose
//     item_key has a claimed run waits for it;
//  -  of events with a concurrency_key, in steps 1 and 2, only as many as
//     the key has room for (concurrency_keys.hpp); the scans leave the keys
//     found full, and run again without the keys this claim found full or
//     held by another claim while it wants more;
//  3. a queue whose claims a bucket limits keeps as many of them, in this
//     order, as the bucket gives units (claim_limit.hpp);
//  4. they are marked claimed (or dead, when their attempts are used up, or
//     cancelled, an expired claim superseded by a newer run: mark_claimed.hpp),
//     in a transaction whose commit is durable (durable_commit.hpp).
//
// The plans are generic and kept for the backend's life, so a statement that
// finds rows by id tests the state as upper(state): the planner then always
// takes the primary key, never a partial index on state, whose entries the
// statistics of an idle moment may have counted as few.
#include "pg/registry/standby.hpp"
#include "pg/durability/fence.hpp"
#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"
#include "pg/server/catalog.hpp"
#include "pg/server/clock.hpp"
#include "pg/queue/group_policy.hpp"
#include "pg/server/kept_plan.hpp"
#include "pg/queue/blocking_claims.hpp"
#include "pg/queue/claim_key_turns.hpp"
#include "pg/queue/claim_limit.hpp"
#include "pg/queue/claimed_ids.hpp"
#include "pg/queue/concurrency_keys.hpp"
#include "pg/queue/durable_commit.hpp"
#include "pg/queue/event_rows.hpp"
#include "pg/queue/fair_cursors.hpp"
#include "pg/queue/mark_claimed.hpp"
#include "pg/queue/no_key_writes.hpp"
#include "pg/queue/scan_floors.hpp"
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {
namespace {

// A new claim token: a fence token (durability/fence.hpp), unique on the
// server and greater than every token handed out before, also after a crash
// or a promotion, so that a claim made after an earlier one expired never has
// its token. (A group claim's token is its group lease's, from the same
// counter.)
int64 new_claim_token() {
    for (;;) {
        fence_reserve_ahead();
        const int64 token = fence_next();
        if (token != 0) {
            return token;
        }
    }
}

// Which keyed rows a scan returns (PG_THROTTLE_KEYED_ROWS): none of the keys
// in $full (a hashed list), or, when $open is not NULL (the claim takes no
// key it has not met yet), only the keys in $open. Scans go on from the
// last row the claim's previous pass returned ($after, $after_id), so a
// pass never reads again what the claim has locked or left.
#define KEYED_ROWS(full, open)                                      \
    "   AND (e.concurrency_key IS NULL"                             \
    "        OR (" open                                             \
    "::text[] IS NULL"                                              \
    "            AND e.concurrency_key NOT IN (SELECT unnest(" full \
    "::text[])))"                                                   \
    "        OR e.concurrency_key = ANY (" open "))"

KeptPlan expired_claims{
    "SELECT e.id, e.concurrency_key, e.lease_until FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'claimed' AND e.lease_until <= $2 AND e.group_key IS NULL"
    KEYED_ROWS("$4", "$5")
    "   AND (e.lease_until, e.id) > ($6, $7)"
    " ORDER BY e.lease_until, e.id LIMIT $3 FOR UPDATE SKIP LOCKED",
    7,
    {TEXTOID, TIMESTAMPTZOID, INT4OID, TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID, INT8OID},
    nullptr};

// What a claim reads first: the highest priority of the pending ungrouped
// events. It is found by a
// backward scan of event_due_single (ORDER BY ... DESC LIMIT 1 keeps the
// generic plan on it whatever the statistics said): it starts at the newest
// events of the highest priority, not at the oldest, where claims leave dead
// entries until vacuum.
#define TOP_PENDING_PRIORITY(condition)                                              \
    "(SELECT e.priority FROM throttle.event e"                                       \
    "  WHERE e.queue = $1 AND e.state = 'pending' AND e.group_key IS NULL" condition \
    "  ORDER BY e.priority DESC LIMIT 1)"

// And whether any ungrouped claim's lease has ended (a probe of
// event_leases_single): step 1's scan runs only then, one statement fewer
// for a claim that finds none.
#define ANY_EXPIRED_CLAIM(grouped)                                               \
    "EXISTS (SELECT 1 FROM throttle.event e"                                     \
    "        WHERE e.queue = $1 AND e.state = 'claimed' AND e.lease_until <= $2" \
    "          AND e.group_key " grouped ")"

// And whether any claim of claim_group expired (a probe of
// event_leases_grouped): only then is it asked whether one holds back a due
// event without a group_key (any_blocking, blocking_claims.hpp).
// And whether the queue has pending events with a concurrency_key (a probe of
// event_pending_concurrency): without them, and without a bucket or an
// expired claim, a claim takes the lean path (claim_due_lean).
// And the queue's bucket (catalog.hpp): the same statement, not one more.
#define ANY_KEYED_PENDING                                \
    "EXISTS (SELECT 1 FROM throttle.event k"             \
    "        WHERE k.queue = $1 AND k.state = 'pending'" \
    "          AND k.concurrency_key IS NOT NULL)"

// And the counts of the queue's scan floors (scan_floors.hpp) at the two
// priorities its slot tracks, $3 above $6 (either NULL when not tracked),
// from ($4, $5) and ($7, $8): the first pending ungrouped event at each (f1,
// f2). The highest priority then comes from probes that start at the
// floors, or from ranges where no entry is, whenever it can: only a
// priority above both, or between them, is looked up by the scans that
// start at the newest events (with the queue drained and the entries of
// finished claims kept by an old snapshot, they walk them all).
#define ANY_PENDING_BETWEEN(condition)                                           \
    "EXISTS (SELECT 1 FROM throttle.event h"                                     \
    "        WHERE h.queue = $1 AND h.state = 'pending' AND h.group_key IS NULL" \
    "          AND " condition ")"
#define HIGHEST_PENDING_PRIORITY \
    "CASE WHEN $3::integer IS NULL OR " ANY_PENDING_BETWEEN("h.priority > $3")  \
    "     THEN " TOP_PENDING_PRIORITY("")                                        \
    "     WHEN f1.id IS NOT NULL THEN $3"                                        \
    "     WHEN $6::integer IS NULL"                                              \
    "       OR " ANY_PENDING_BETWEEN("h.priority < $3 AND h.priority > $6")      \
    "     THEN " TOP_PENDING_PRIORITY(" AND e.priority < $3")                    \
    "     WHEN f2.id IS NOT NULL THEN $6"                                        \
    "     ELSE " TOP_PENDING_PRIORITY(" AND e.priority < $6") " END"
#define FIRST_AT_TRACKED_PRIORITY(f, level, run_at, id)                        \
    " LEFT JOIN LATERAL (SELECT e.run_at, e.id FROM throttle.event e"          \
    "   WHERE e.queue = $1 AND e.state = 'pending' AND e.group_key IS NULL"    \
    "     AND e.priority = " level " AND (e.run_at, e.id) >= (" run_at ", " id \
    ")"                                                                        \
    "   ORDER BY e.run_at, e.id LIMIT 1) " f " ON true"

// The look-up of expired claims without a group_key starts at the floor of
// the queue's claims ($9, $10), which the same statement counts again (fl).
#define ANY_EXPIRED_UNGROUPED_CLAIM                                              \
    "EXISTS (SELECT 1 FROM throttle.event e"                                     \
    "        WHERE e.queue = $1 AND e.state = 'claimed' AND e.lease_until <= $2" \
    "          AND e.group_key IS NULL AND (e.lease_until, e.id) >= ($9, $10))"
#define FIRST_CLAIM                                                         \
    " LEFT JOIN LATERAL (SELECT e.lease_until, e.id FROM throttle.event e"  \
    "   WHERE e.queue = $1 AND e.state = 'claimed' AND e.group_key IS NULL" \
    "     AND (e.lease_until, e.id) >= ($9, $10)"                           \
    "   ORDER BY e.lease_until, e.id LIMIT 1) fl ON true"

// And whether the whole queue is paused (throttle.pause): a probe of
// queue_pause_key, in this statement rather than one of its own. A claim
// whose snapshot shows the pause claims nothing.
#define QUEUE_PAUSED                               \
    "EXISTS (SELECT 1 FROM throttle.queue_pause p" \
    "        WHERE p.queue = $1 AND p.group_key IS NULL)"

// And whether its concurrency keys are served in turn
// (throttle.concurrency_policy.fairness, claim_key_turns.hpp).
#define KEYS_ROUND_ROBIN                          \
    "coalesce((SELECT c.fairness = 'round_robin'" \
    "          FROM throttle.concurrency_policy c WHERE c.queue = $1), false)"

#define CLAIM_START(paused, round_robin)                                                         \
    "SELECT " HIGHEST_PENDING_PRIORITY ", " ANY_EXPIRED_UNGROUPED_CLAIM ", " ANY_EXPIRED_CLAIM(  \
        "IS NOT NULL") ", " ANY_KEYED_PENDING ", " PG_THROTTLE_QUEUE_BUCKET_COLUMNS              \
                       ", f1.run_at, f1.id, f2.run_at, f2.id, fl.lease_until, fl.id, " paused    \
                       ", " round_robin PG_THROTTLE_QUEUE_BUCKET_FROM FIRST_AT_TRACKED_PRIORITY( \
                           "f1", "$3", "$4", "$5")                                               \
                           FIRST_AT_TRACKED_PRIORITY("f2", "$6", "$7", "$8") FIRST_CLAIM

KeptPlan claim_start{CLAIM_START(QUEUE_PAUSED, KEYS_ROUND_ROBIN),
                     10,
                     {TEXTOID, TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID, INT8OID, INT4OID,
                      TIMESTAMPTZOID, INT8OID, TIMESTAMPTZOID, INT8OID},
                     nullptr};
// The same on a database whose SQL is still 0.3.0's (the module is updated
// before ALTER EXTENSION ... UPDATE): no throttle.queue_pause, no pause, no
// round robin.
KeptPlan claim_start_without_pauses{CLAIM_START("false", "false"),
                                    10,
                                    {TEXTOID, TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID, INT8OID,
                                     INT4OID, TIMESTAMPTZOID, INT8OID, TIMESTAMPTZOID, INT8OID},
                                    nullptr};

#undef CLAIM_START
#undef QUEUE_PAUSED
#undef KEYS_ROUND_ROBIN
#undef FIRST_CLAIM
#undef ANY_EXPIRED_UNGROUPED_CLAIM

#undef ANY_PENDING_BETWEEN
#undef FIRST_AT_TRACKED_PRIORITY
#undef HIGHEST_PENDING_PRIORITY

#undef ANY_KEYED_PENDING
#undef ANY_EXPIRED_CLAIM

enum StartColumn : int {
    kTopPriority = 1,
    kAnyExpired = 2,
    kAnyGroupExpired = 3,
    kAnyKeyed = 4,
    kBucket = 5,  // to 8
    kFirst = 9,   // f1.run_at, f1.id, f2.run_at, f2.id, fl.lease_until, fl.id
    kPaused = 15,
    kRoundRobin = 16
};

KeptPlan any_blocking{
    "SELECT " PG_THROTTLE_ANY_BLOCKING_GROUP_CLAIM, 2, {TEXTOID, TIMESTAMPTZOID}, nullptr};

// The keys the snapshot shows full, for the claims that may meet keys.
KeptPlan full_keys{
    "SELECT " PG_THROTTLE_FULL_CONCURRENCY_KEYS, 2, {TEXTOID, TIMESTAMPTZOID}, nullptr};

// The highest priority below $2 (the same backward scan).
KeptPlan next_priority{
    "SELECT " TOP_PENDING_PRIORITY(" AND e.priority < $2"), 2, {TEXTOID, INT4OID}, nullptr};

#undef TOP_PENDING_PRIORITY

// The test for a claimed run of the item_key is NOT EXISTS (... OFFSET 0):
// OFFSET keeps PostgreSQL from turning it into a join or a hash, whose
// inner side a plan made on an empty table reads whole for every row, so
// it is one lookup per row the scan returns. Written as
// (SELECT ... LIMIT 1) IS NULL it was that too, but counted as true for
// 0.5 % of rows, which made the plan test every due event and sort them
// before the LIMIT (keyed claims ran 15 times slower).
#define DUE_AT_LEVEL                                                            \
    " WHERE e.queue = $1 AND e.state = 'pending' AND e.group_key IS NULL"       \
    "   AND e.priority = $2 AND e.run_at <= $3"                                 \
    "   AND NOT EXISTS (SELECT 1 FROM throttle.event c" /* event_claimed_key */ \
    "                   WHERE c.queue = e.queue AND c.item_key = e.item_key"    \
    "                     AND c.state = 'claimed' OFFSET 0)"

KeptPlan due_events{
    "SELECT e.id, e.concurrency_key, e.run_at FROM throttle.event e" DUE_AT_LEVEL
    KEYED_ROWS("$5", "$6")
    "   AND (e.run_at, e.id) > ($7, $8)"
    " ORDER BY e.run_at, e.id LIMIT $4 FOR UPDATE OF e SKIP LOCKED",
    8,
    {TEXTOID, INT4OID, TIMESTAMPTZOID, INT4OID, TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID,
     INT8OID},
    nullptr};

// The lean path, for a queue with no concurrency_key pending, no bucket and
// no expired claim: the due events of one priority are found, locked and
// marked claimed by one statement. Its plan has the fewest nodes a claim
// can have (each node costs at every execution, whether it runs or not):
// the scan of event_due_single locks up to $4 rows (SKIP LOCKED, rechecked
// on the version it locks), and the UPDATE reaches them by primary key.
// Only events with attempts left are candidates: no call leaves a pending
// event without them (the upgrade to 0.4.0 made the ones earlier versions
// left dead). The scan starts at the queue's scan floor ($9, $10), before
// which no event of the priority is pending.
KeptPlan claim_due_lean{
    "WITH claimed AS ("
    "  UPDATE throttle.event u"
    "  SET state = 'claimed', claimed_at = $3, claimed_by = $5, lease_until = $3 + $6,"
    "      claim_token = $7, claimed_role = $8, attempts = u.attempts + 1"
    "  WHERE u.id = ANY (ARRAY("
    "      SELECT e.id FROM throttle.event e" DUE_AT_LEVEL
    "        AND e.concurrency_key IS NULL AND e.attempts < e.max_attempts"
    "        AND (e.run_at, e.id) >= ($9, $10)"
    "      ORDER BY e.run_at, e.id LIMIT $4 FOR UPDATE OF e SKIP LOCKED))"
    "    AND upper(u.state) = 'PENDING'"
    "  RETURNING u.*)"
    " SELECT * FROM claimed ORDER BY run_at, id",
    10,
    {TEXTOID, INT4OID, TIMESTAMPTZOID, INT4OID, TEXTOID, INTERVALOID, INT8OID, OIDOID,
     TIMESTAMPTZOID, INT8OID},
    nullptr};

#undef DUE_AT_LEVEL

// Where a scan's arguments are, and where it goes on from.
struct Scan {
    KeptPlan* plan;
    Datum* args;
    int limit_arg;  // how many rows at most
    int full_arg;   // then open, after, after_id
    Datum after;    // the last row's order column (lease_until, run_at)
    Datum after_id;
    core::QueuePosition floor;  // where the scan starts
};

// Takes, of the rows in SPI_tuptable (id, concurrency_key, order column),
// those that `keys` admit, while fewer than `max` are taken, and moves the
// scan past them. Returns whether it left one for its key.
bool take_rows(Scan* scan, Ids* taken, ConcurrencyKeys* keys, int max) {
    // Kept: admitting a key runs statements that replace SPI_tuptable.
    const uint64 n = SPI_processed;
    SPITupleTable* rows = SPI_tuptable;
    bool left_one = false;
    for (uint64 i = 0; i < n && taken->count < max; ++i) {
        bool is_null = false;
        bool key_null = false;
        const Datum id = SPI_getbinval(rows->vals[i], rows->tupdesc, 1, &is_null);
        const Datum key = SPI_getbinval(rows->vals[i], rows->tupdesc, 2, &key_null);
        scan->after = SPI_getbinval(rows->vals[i], rows->tupdesc, 3, &is_null);
        scan->after_id = id;
        if (key_null) {
            append(taken, id, nullptr);
        } else if (concurrency_key_admit(keys, DatumGetTextPP(key))) {
            append(taken, id, DatumGetTextPP(key));
        } else {
            left_one = true;
        }
    }
    return left_one;
}

// Where a scan of due events at one priority starts: just before the
// floor (the scans go on after ($after, $after_id)).
void scan_from_floor(Scan* scan) {
    const bool at_start = scan->floor.id == PG_INT64_MIN;  // kQueueStart, or an id with none below
    scan->after = TimestampTzGetDatum(at_start ? DT_NOBEGIN : scan->floor.run_at);
    scan->after_id = Int64GetDatum(at_start ? 0 : scan->floor.id - 1);
}

// Runs `scan` until the claim has `max` events or the scan has none left
// for it: a pass that returned all it was asked for and left some for their
// key runs again, from where it stopped, without the keys now full.
void scan_until_full(Scan* scan, Ids* taken, ConcurrencyKeys* keys, int max) {
    scan_from_floor(scan);
    char nulls[kMaxPlanArgs];
    for (;;) {
        const int32 wanted = max - taken->count;
        std::memset(nulls, ' ', sizeof(nulls));
        scan->args[scan->limit_arg] = Int32GetDatum(wanted);
        scan->args[scan->full_arg] = PointerGetDatum(concurrency_keys_full(*keys));
        ArrayType* open = concurrency_keys_open(*keys);
        scan->args[scan->full_arg + 1] = PointerGetDatum(open);
        if (open == nullptr) {
            nulls[scan->full_arg + 1] = 'n';
        }
        scan->args[scan->full_arg + 2] = scan->after;
        scan->args[scan->full_arg + 3] = scan->after_id;
        run_kept_plan(scan->plan, scan->args, nulls, SPI_OK_SELECT);
        const bool may_have_more = SPI_processed == static_cast<uint64>(wanted);
        const bool left_one = take_rows(scan, taken, keys, max);
        if (taken->count >= max || !left_one || !may_have_more) {
            return;
        }
    }
}

// The highest priority of the queue's pending ungrouped events below
// `below`; false when there is none.
bool priority_below(Datum queue, int32 below, int32* level) {
    Datum args[2] = {queue, Int32GetDatum(below)};
    run_kept_plan(&next_priority, args, nullptr, SPI_OK_SELECT, 1);
    bool is_null = true;
    const Datum value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null);
    if (is_null) {
        return false;
    }
    *level = DatumGetInt32(value);
    return true;
}

// What claim_start read.
struct Start {
    bool have_level;  // a pending event without a group_key: the highest priority
    int32 level;
    ScanStarts starts;  // where its scans start (the queue's scan floors)
    bool expired_found;
    bool group_expired_found;
    bool any_keyed;
    bool paused;       // the whole queue (throttle.pause)
    bool round_robin;  // its concurrency keys in turn (claim_key_turns.hpp)
    ClaimLimit limit;
};

// The position in columns `column`, `column` + 1 of `row`, or core::kQueueEnd.
core::QueuePosition first_in_row(HeapTuple row, TupleDesc desc, int column) {
    bool run_at_null = true;
    bool id_null = true;
    const Datum run_at = SPI_getbinval(row, desc, column, &run_at_null);
    const Datum id = SPI_getbinval(row, desc, column + 1, &id_null);
    if (run_at_null || id_null) {
        return core::kQueueEnd;
    }
    return core::QueuePosition{DatumGetTimestampTz(run_at), DatumGetInt64(id)};
}

Start claim_start_of(Datum queue, Datum now) {
    const text* queue_name = DatumGetTextPP(queue);
    // Begun before the statement takes its snapshot (scan_floors.hpp).
    const FloorCountOf count = scan_floor_count_begin(queue_name);
    Datum args[10] = {queue,
                      now,
                      0,
                      0,
                      0,
                      0,
                      0,
                      0,
                      TimestampTzGetDatum(count.leases.count.from.run_at),
                      Int64GetDatum(count.leases.count.from.id)};
    char nulls[10] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
    for (int i = 0; i < kFloorLevels; i++) {
        const LevelCount& level = count.levels[i];
        args[2 + 3 * i] = Int32GetDatum(level.priority);
        args[3 + 3 * i] = TimestampTzGetDatum(level.count.from.run_at);
        args[4 + 3 * i] = Int64GetDatum(level.count.from.id);
        nulls[2 + 3 * i] = level.tracked ? ' ' : 'n';
    }
    run_kept_plan(pauses_installed() ? &claim_start : &claim_start_without_pauses, args, nulls,
                  SPI_OK_SELECT, 1);
    const HeapTuple row = SPI_tuptable->vals[0];
    const TupleDesc desc = SPI_tuptable->tupdesc;
    const FloorFirsts first{{first_in_row(row, desc, kFirst), first_in_row(row, desc, kFirst + 2)},
                            first_in_row(row, desc, kFirst + 4)};
    Start start{};
    start.starts = scan_floor_count_end(count, first);
    bool is_null = false;
    const Datum top = SPI_getbinval(row, desc, kTopPriority, &is_null);
    start.have_level = !is_null;
    start.level = is_null ? 0 : DatumGetInt32(top);
    if (!count.off && start.have_level && !start.starts.tracks(start.level)) {
        scan_floor_track(queue_name, start.level);
    }
    start.expired_found = DatumGetBool(SPI_getbinval(row, desc, kAnyExpired, &is_null));
    start.group_expired_found = DatumGetBool(SPI_getbinval(row, desc, kAnyGroupExpired, &is_null));
    start.any_keyed = DatumGetBool(SPI_getbinval(row, desc, kAnyKeyed, &is_null));
    start.paused = DatumGetBool(SPI_getbinval(row, desc, kPaused, &is_null));
    start.round_robin = DatumGetBool(SPI_getbinval(row, desc, kRoundRobin, &is_null));
    DeclaredBucket declared{};
    text* bucket_name = nullptr;
    const bool limited = queue_bucket_in_row(row, desc, kBucket, &declared, &bucket_name);
    start.limit = claim_limit_declared(bucket_name, limited ? &declared : nullptr);
    return start;
}

// Whether an expired claim of claim_group holds back a due event of `queue`
// without a group_key.
bool any_blocking_claim(Datum queue, Datum now) {
    Datum args[2] = {queue, now};
    run_kept_plan(&any_blocking, args, nullptr, SPI_OK_SELECT, 1);
    bool is_null = false;
    return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
}

// The lean path of a claim of up to `max` events, from the priority `level`
// down; the events claimed become the function's result.
void claim_lean(FunctionCallInfo fcinfo, Datum queue, const Start& start, Datum now, int32 max) {
    int32 level = start.level;
    // Taken before the statement that writes it, also when it claims
    // nothing (tokens grow, not densely).
    const int64 token = new_claim_token();
    Datum args[10] = {queue,
                      0,
                      now,
                      0,
                      PG_GETARG_DATUM(1),
                      PG_GETARG_DATUM(2),
                      Int64GetDatum(token),
                      ObjectIdGetDatum(GetOuterUserId()),
                      0,
                      0};
    InitMaterializedSRF(fcinfo, 0);
    int32 claimed = 0;
    do {
        args[1] = Int32GetDatum(level);
        args[3] = Int32GetDatum(max - claimed);
        const core::QueuePosition floor = start.starts.at(level);
        args[8] = TimestampTzGetDatum(floor.run_at);
        args[9] = Int64GetDatum(floor.id);
        run_kept_plan(&claim_due_lean, args, nullptr, SPI_OK_SELECT);
        add_events(fcinfo, SPI_tuptable, SPI_processed);
        claimed += static_cast<int32>(SPI_processed);
    } while (claimed < max && priority_below(queue, level, &level));
    if (claimed > 0) {
        require_durable_commit();
    }
}

// The events without a concurrency_key in a round-robin queue's turns
// (claim_key_turns.hpp): one at a time, from the highest priority down, by
// due_events with no key open; not looked for while the queue's hint says
// none is pending (no_key_writes.hpp).
struct UnkeyedScan {
    Datum queue;
    Datum now;
    const Start* start;
    bool have_level;
    int32 level;
    Datum args[8];
    Scan due;
    bool positioned;  // `due` is at the current level
    uint64 writes;    // the queue's count of such writes, read first
    bool skip;        // the hint holds: none is pending
    bool took_one;
    bool hinted;  // this claim has looked
};

// When the first pending event without a key falls due (a look in the
// latest snapshot): NULL when there is none.
KeptPlan first_no_key_pending{
    "SELECT min(e.run_at) FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'pending' AND e.group_key IS NULL"
    "   AND e.concurrency_key IS NULL",
    1,
    {TEXTOID},
    nullptr};

// The claim found no due event without a key: it looks when the first one
// falls due, in a snapshot later than its count of writes, and keeps that
// with the queue's cursor for the next claims.
void record_no_key_hint(UnkeyedScan* unkeyed) {
    unkeyed->hinted = true;
    Datum args[1] = {unkeyed->queue};
    run_kept_plan_latest(&first_no_key_pending, args, nullptr, SPI_OK_SELECT, 1);
    bool is_null = true;
    const Datum first = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null);
    const NoKeyHint hint{unkeyed->writes, is_null ? DT_NOEND : DatumGetTimestampTz(first),
                         GetCurrentTimestamp()};
    fair_cursor_store_no_key_hint(DatumGetTextPP(unkeyed->queue), hint);
}

bool take_next_unkeyed(void* context, Ids* taken) {
    auto* unkeyed = static_cast<UnkeyedScan*>(context);
    if (unkeyed->skip) {
        return false;
    }
    while (unkeyed->have_level) {
        Scan& due = unkeyed->due;
        if (!unkeyed->positioned) {
            unkeyed->args[1] = Int32GetDatum(unkeyed->level);
            due.floor = unkeyed->start->starts.at(unkeyed->level);
            scan_from_floor(&due);
            unkeyed->positioned = true;
        }
        unkeyed->args[due.full_arg + 2] = due.after;
        unkeyed->args[due.full_arg + 3] = due.after_id;
        run_kept_plan(due.plan, unkeyed->args, nullptr, SPI_OK_SELECT, 1);
        if (SPI_processed == 1) {
            bool is_null = false;
            const HeapTuple row = SPI_tuptable->vals[0];
            const Datum id = SPI_getbinval(row, SPI_tuptable->tupdesc, 1, &is_null);
            due.after = SPI_getbinval(row, SPI_tuptable->tupdesc, 3, &is_null);
            due.after_id = id;
            append(taken, id, nullptr);
            unkeyed->took_one = true;
            return true;
        }
        unkeyed->have_level = priority_below(unkeyed->queue, unkeyed->level, &unkeyed->level);
        unkeyed->positioned = false;
    }
    if (!unkeyed->took_one && !unkeyed->hinted) {
        record_no_key_hint(unkeyed);
    }
    return false;
}

// Whether the queue's hint says that no event without a key is pending
// now: kept with its cursor, no such write since, not too old.
bool no_key_hint_holds(const KeyCursor& cursor, uint64 writes, TimestampTz now) {
    const NoKeyHint& hint = cursor.hint;
    return cursor.has_hint && hint.count == writes && now < hint.until &&
           GetCurrentTimestamp() - hint.looked_at <
               static_cast<TimestampTz>(kNoKeyHintSeconds) * USECS_PER_SEC;
}

// Step 2 in a round-robin queue whose cursor is known: the keys in turn.
void take_due_in_turns(Datum queue, Datum now, const Start& start, const KeyCursor& cursor,
                       ConcurrencyKeys* keys, Ids* taken, int32 max) {
    ArrayType* none = construct_empty_array(TEXTOID);
    UnkeyedScan unkeyed{queue, now,   &start, start.have_level, start.level, {}, {}, false, 0,
                        false, false, false};
    // Read before any snapshot that looks (no_key_writes.hpp).
    unkeyed.writes = no_key_writes_count(DatumGetTextPP(queue));
    unkeyed.skip = no_key_hint_holds(cursor, unkeyed.writes, DatumGetTimestampTz(now));
    unkeyed.args[0] = queue;
    unkeyed.args[2] = now;
    unkeyed.args[3] = Int32GetDatum(1);
    unkeyed.args[4] = PointerGetDatum(none);  // no key full
    unkeyed.args[5] = PointerGetDatum(none);  // and none open: no keyed event
    unkeyed.due = Scan{&due_events, unkeyed.args, 3, 4, 0, 0, core::kQueueEnd};
    const KeyTurnsClaim claim{queue, now, keys, UnkeyedTurn{take_next_unkeyed, &unkeyed}, max};
    take_in_turns(claim, cursor, taken);
}

// The other path, for queues with concurrency keys, a bucket or expired
// claims: steps 1 to 4 (above), each scan a statement of its own, the marks
// one more; the events claimed become the function's result.
void claim_by_scans(FunctionCallInfo fcinfo, Datum queue, Datum now, const Start& start,
                    int32 max) {
    const ClaimLimit& limit = start.limit;
    int32 level = start.level;
    Datum full_args[2] = {queue, now};
    run_kept_plan(&full_keys, full_args, nullptr, SPI_OK_SELECT, 1);
    bool is_null = false;
    ConcurrencyKeys keys =
        concurrency_keys_start(queue, DatumGetTimestampTz(now),
                               DatumGetArrayTypeP(SPI_getbinval(
                                   SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null)));
    Ids taken{};

    if (start.expired_found) {
        Datum expired_args[7] = {queue, now, 0, 0, 0, 0, 0};
        Scan expired{&expired_claims, expired_args, 2, 3, 0, 0, start.starts.floors.leases};
        scan_until_full(&expired, &taken, &keys, max);
    }
    const bool any_expired = taken.count > 0;
    const int first_due = taken.count;  // the events of step 2 follow

    const text* queue_text = DatumGetTextPP(queue);
    const KeyCursor cursor =
        start.round_robin && taken.count < max ? fair_key_cursor_of(queue_text) : KeyCursor{};
    // Oldest first; also a round-robin queue whose cursor is not known (its
    // first claim, a restart, an eviction): served as oldest first would,
    // never always from the first key, it leaves the cursor for the next.
    bool have_level = taken.count < max && start.have_level && !cursor.known;
    if (cursor.known && start.have_level) {
        take_due_in_turns(queue, now, start, cursor, &keys, &taken, max);
    }
    while (have_level) {
        Datum due_args[8] = {queue, Int32GetDatum(level), now, 0, 0, 0, 0, 0};
        Scan due{&due_events, due_args, 3, 4, 0, 0, start.starts.at(level)};
        scan_until_full(&due, &taken, &keys, max);
        if (taken.count >= max) {
            break;
        }
        have_level = priority_below(queue, level, &level);
    }
    const uint64 found_count = static_cast<uint64>(taken.count);
    ArrayType* ids = ids_array(taken.values, taken.count);

    const int64 allowed = found_count == 0 ? 0
                                           : claim_limit_take(limit, DatumGetTimestampTz(now),
                                                              static_cast<int64>(found_count));
    if (allowed == 0) {
        InitMaterializedSRF(fcinfo, 0);
        return;
    }
    if (allowed < static_cast<int64>(found_count)) {  // others took units meanwhile
        ids = first_ids(ids, static_cast<int>(allowed));
    }
    if (start.round_robin && allowed > first_due) {  // after the last due event kept
        fair_key_cursor_store(queue_text, taken.keys[allowed - 1]);
    }
    const int64 token = new_claim_token();
    require_durable_commit();
    const ClaimRequest request{ids,
                               any_expired,
                               PG_GETARG_DATUM(1),
                               PG_GETARG_DATUM(2),
                               token,
                               DatumGetTimestampTz(now),
                               ClaimOrder::kPriority,
                               nullptr};
    const SPITupleTable* claimed = nullptr;
    const uint64 claimed_count = mark_claimed(request, &claimed);
    return_events(fcinfo, claimed, claimed_count);
}

// (queue text, worker text, lease interval, max integer) -> SETOF throttle.event
Datum claim(FunctionCallInfo fcinfo) {
    standby_refuse("throttle.claim");
    require_not_null(fcinfo, 0, "queue");
    require_not_null(fcinfo, 1, "worker");
    require_not_null(fcinfo, 3, "max");
    require_not_null(fcinfo, 2, "lease");
    const Interval* lease = PG_GETARG_INTERVAL_P(2);
    require_positive_interval(lease, "lease");
    if (PG_GETARG_INT32(3) <= 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("max must be positive")));
    }
    registry_require();
    const Datum queue = PG_GETARG_DATUM(0);
    const Datum now = TimestampTzGetDatum(clock_now());
    require_ends_after(DatumGetTimestampTz(now), lease, "lease");

    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    const Start start = claim_start_of(queue, now);
    const int32 max = static_cast<int32>(
        claim_limit_available(start.limit, DatumGetTimestampTz(now), PG_GETARG_INT32(3)));
    // The pause as claim_start read it, in the transaction's snapshot; under
    // repeatable read that snapshot may predate a pause that has committed:
    // read again in the latest one, as claim_group reads it.
    const bool paused = start.paused || (IsolationUsesXactSnapshot() && pauses_installed() &&
                                         queue_paused_now(DatumGetTextPP(queue)));
    if (max == 0 || paused || (!start.have_level && !start.expired_found)) {
        InitMaterializedSRF(fcinfo, 0);  // nothing to claim, or the queue is paused
    } else {
        if (start.group_expired_found && any_blocking_claim(queue, now)) {
            end_blocking_claims(queue, DatumGetTimestampTz(now), Claimer::kClaim);
        }
        if (!start.limit.limited && !start.expired_found && !start.any_keyed) {
            claim_lean(fcinfo, queue, start, now, max);
        } else {
            claim_by_scans(fcinfo, queue, now, start, max);
        }
    }
    SPI_finish();
    return static_cast<Datum>(0);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_claim, pg_throttle::pg::claim)
