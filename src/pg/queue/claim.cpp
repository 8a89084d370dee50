// throttle.claim(queue, worker, lease, max): up to max due events without a
// group_key, for one worker, natively: each step is one statement whose plan
// this backend prepared once (kept_plan.hpp), and the claim's token comes
// straight from the fence counter.
//
// The steps, in one snapshot each and never waiting for a row another
// transaction holds (SKIP LOCKED):
//  0. the highest priority of the pending events, and the concurrency keys
//     that the snapshot shows full, in one statement;
//  -  when an expired claim of claim_group holds back a due event without a
//     group_key (a newer run of its item_key), that claim ended first
//     (blocking_claims.hpp);
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
#include "pg/standby.hpp"
#include "pg/arguments.hpp"
#include "pg/boundary.hpp"
#include "pg/clock.hpp"
#include "pg/kept_plan.hpp"
#include "pg/queue/blocking_claims.hpp"
#include "pg/queue/claim_limit.hpp"
#include "pg/queue/claim_token.hpp"
#include "pg/queue/concurrency_keys.hpp"
#include "pg/queue/durable_commit.hpp"
#include "pg/queue/event_rows.hpp"
#include "pg/queue/mark_claimed.hpp"
#include "pg/registry.hpp"

namespace pg_throttle::pg {
namespace {

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
// events, and the keys the snapshot shows full. The priority is found by a
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
#define ANY_EXPIRED_CLAIM                                                        \
    "EXISTS (SELECT 1 FROM throttle.event e"                                     \
    "        WHERE e.queue = $1 AND e.state = 'claimed' AND e.lease_until <= $2" \
    "          AND e.group_key IS NULL)"

// And whether an expired claim of claim_group holds back a due event
// without a group_key (blocking_claims.hpp): ended only then.
KeptPlan claim_start{"SELECT " TOP_PENDING_PRIORITY("") ", " PG_THROTTLE_FULL_CONCURRENCY_KEYS
                                                        ", " ANY_EXPIRED_CLAIM
                                                        ", " PG_THROTTLE_ANY_BLOCKING_GROUP_CLAIM,
                     2,
                     {TEXTOID, TIMESTAMPTZOID},
                     nullptr};

#undef ANY_EXPIRED_CLAIM

enum StartColumn : int { kTopPriority = 1, kFullKeys = 2, kAnyExpired = 3, kAnyBlocking = 4 };

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
KeptPlan due_events{
    "SELECT e.id, e.concurrency_key, e.run_at FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'pending' AND e.group_key IS NULL"
    "   AND e.priority = $2 AND e.run_at <= $3"
    "   AND NOT EXISTS (SELECT 1 FROM throttle.event c"  // event_claimed_key
    "                   WHERE c.queue = e.queue AND c.item_key = e.item_key"
    "                     AND c.state = 'claimed' OFFSET 0)"
    KEYED_ROWS("$5", "$6")
    "   AND (e.run_at, e.id) > ($7, $8)"
    " ORDER BY e.run_at, e.id LIMIT $4 FOR UPDATE OF e SKIP LOCKED",
    8,
    {TEXTOID, INT4OID, TIMESTAMPTZOID, INT4OID, TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID,
     INT8OID},
    nullptr};

// A growing list of bigint Datums in the claim's memory context.
struct Ids {
    Datum* values;
    int count;
    int capacity;
};

void append(Ids* ids, Datum id) {
    if (ids->count == ids->capacity) {
        ids->capacity = ids->capacity == 0 ? 16 : ids->capacity * 2;
        const size_t size = sizeof(Datum) * static_cast<size_t>(ids->capacity);
        ids->values = static_cast<Datum*>(ids->values == nullptr ? palloc(size)
                                                                 : repalloc(ids->values, size));
    }
    ids->values[ids->count++] = id;
}

// Where a scan's arguments are, and where it goes on from.
struct Scan {
    KeptPlan* plan;
    Datum* args;
    int limit_arg;  // how many rows at most
    int full_arg;   // then open, after, after_id
    Datum after;    // the last row's order column (lease_until, run_at)
    Datum after_id;
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
        if (key_null || concurrency_key_admit(keys, DatumGetTextPP(key))) {
            append(taken, id);
        } else {
            left_one = true;
        }
    }
    return left_one;
}

// Runs `scan` until the claim has `max` events or the scan has none left
// for it: a pass that returned all it was asked for and left some for their
// key runs again, from where it stopped, without the keys now full.
void scan_until_full(Scan* scan, Ids* taken, ConcurrencyKeys* keys, int max) {
    scan->after = TimestampTzGetDatum(DT_NOBEGIN);
    scan->after_id = Int64GetDatum(0);
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
    // A rate-limited queue: no more events locked than its bucket has units for.
    const ClaimLimit limit = claim_limits_of(PG_GETARG_TEXT_PP(0)).queue;
    const int32 max = static_cast<int32>(
        claim_limit_available(limit, DatumGetTimestampTz(now), PG_GETARG_INT32(3)));
    if (max == 0) {
        InitMaterializedSRF(fcinfo, 0);
        SPI_finish();
        return static_cast<Datum>(0);
    }
    Datum start_args[2] = {queue, now};
    run_kept_plan(&claim_start, start_args, nullptr, SPI_OK_SELECT, 1);
    bool no_level = true;
    bool is_null = false;
    int32 level = 0;
    const Datum top =
        SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, kTopPriority, &no_level);
    if (!no_level) {
        level = DatumGetInt32(top);
    }
    const bool expired_found = DatumGetBool(
        SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, kAnyExpired, &is_null));
    const bool blocking_found = DatumGetBool(
        SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, kAnyBlocking, &is_null));
    // Read before concurrency_keys_start, whose statements replace SPI_tuptable.
    ConcurrencyKeys keys = concurrency_keys_start(
        queue, DatumGetTimestampTz(now),
        DatumGetArrayTypeP(
            SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, kFullKeys, &is_null)));
    Ids taken{};

    if (blocking_found) {
        end_blocking_claims(queue, DatumGetTimestampTz(now), Claimer::kClaim);
    }
    if (expired_found) {
        Datum expired_args[7] = {queue, now, 0, 0, 0, 0, 0};
        Scan expired{&expired_claims, expired_args, 2, 3, 0, 0};
        scan_until_full(&expired, &taken, &keys, max);
    }
    const bool any_expired = taken.count > 0;

    bool have_level = taken.count < max && !no_level;
    while (have_level) {
        Datum due_args[8] = {queue, Int32GetDatum(level), now, 0, 0, 0, 0, 0};
        Scan due{&due_events, due_args, 3, 4, 0, 0};
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
        SPI_finish();
        return static_cast<Datum>(0);
    }
    if (allowed < static_cast<int64>(found_count)) {  // others took units meanwhile
        ids = first_ids(ids, static_cast<int>(allowed));
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
    SPI_finish();
    return static_cast<Datum>(0);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_claim, pg_throttle::pg::claim)
