// throttle.claim(queue, worker, lease, max): up to max due events without a
// group_key, for one worker, natively: each step is one statement whose plan
// this backend prepared once (kept_plan.hpp), and the claim's token comes
// straight from the fence counter.
//
// The steps, in one snapshot each and never waiting for a row another
// transaction holds (SKIP LOCKED):
//  1. claims whose lease expired, oldest lease first;
//  2. due pending events, one priority at a time from the highest (a skip
//     scan along event_due_single: within a priority run_at <= now bounds
//     the scan, so events scheduled for later cost nothing), the next
//     priority looked up only while the claim wants more; an event whose
//     item_key has a claimed run waits for it;
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
#include "pg/arguments.hpp"
#include "pg/boundary.hpp"
#include "pg/clock.hpp"
#include "pg/kept_plan.hpp"
#include "pg/queue/claim_limit.hpp"
#include "pg/queue/claim_token.hpp"
#include "pg/queue/durable_commit.hpp"
#include "pg/queue/event_rows.hpp"
#include "pg/queue/mark_claimed.hpp"
#include "pg/registry.hpp"

namespace pg_throttle::pg {
namespace {

KeptPlan expired_claims{
    "SELECT e.id FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'claimed' AND e.lease_until <= $2 AND e.group_key IS NULL"
    " ORDER BY e.lease_until, e.id LIMIT $3 FOR UPDATE SKIP LOCKED",
    3,
    {TEXTOID, TIMESTAMPTZOID, INT4OID},
    nullptr};

KeptPlan top_priority{
    "SELECT max(e.priority) FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'pending' AND e.group_key IS NULL",
    1,
    {TEXTOID},
    nullptr};

KeptPlan next_priority{
    "SELECT max(e.priority) FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'pending' AND e.group_key IS NULL AND e.priority < $2",
    2,
    {TEXTOID, INT4OID},
    nullptr};

KeptPlan due_events{
    "SELECT e.id FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'pending' AND e.group_key IS NULL"
    "   AND e.priority = $2 AND e.run_at <= $3"
    "   AND NOT EXISTS (SELECT 1 FROM throttle.event c"  // event_claimed_key
    "                   WHERE c.queue = e.queue AND c.item_key = e.item_key"
    "                     AND c.state = 'claimed')"
    " ORDER BY e.run_at, e.id LIMIT $4 FOR UPDATE SKIP LOCKED",
    4,
    {TEXTOID, INT4OID, TIMESTAMPTZOID, INT4OID},
    nullptr};

// The highest priority of the queue's pending ungrouped events below `below`
// (or of all when `below` is nullptr); false when there is none.
bool priority_level(Datum queue, const int32* below, int32* level) {
    if (below == nullptr) {
        Datum args[1] = {queue};
        run_kept_plan(&top_priority, args, nullptr, SPI_OK_SELECT, 1);
    } else {
        Datum args[2] = {queue, Int32GetDatum(*below)};
        run_kept_plan(&next_priority, args, nullptr, SPI_OK_SELECT, 1);
    }
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
    const ClaimLimit limit = claim_limit_of(PG_GETARG_TEXT_PP(0));
    const int32 max = static_cast<int32>(
        claim_limit_available(limit, DatumGetTimestampTz(now), PG_GETARG_INT32(3)));
    if (max == 0) {
        InitMaterializedSRF(fcinfo, 0);
        SPI_finish();
        return static_cast<Datum>(0);
    }
    Datum expired_args[3] = {queue, now, Int32GetDatum(max)};
    run_kept_plan(&expired_claims, expired_args, nullptr, SPI_OK_SELECT);
    uint64 found = 0;
    ArrayType* expired = spi_ids(&found);
    const uint64 expired_count = found;
    ArrayType* ids = found > 0 ? expired : nullptr;

    int32 level = 0;
    bool have_level = found < static_cast<uint64>(max) && priority_level(queue, nullptr, &level);
    while (have_level) {
        Datum due_args[4] = {queue, Int32GetDatum(level), now,
                             Int32GetDatum(max - static_cast<int32>(found))};
        run_kept_plan(&due_events, due_args, nullptr, SPI_OK_SELECT);
        uint64 more = 0;
        ArrayType* due = spi_ids(&more);
        if (more > 0) {
            ids = concat_ids(ids, due);
            found += more;
        }
        if (found >= static_cast<uint64>(max)) {
            break;
        }
        const int32 below = level;
        have_level = priority_level(queue, &below, &level);
    }

    const int64 allowed =
        found == 0 ? 0
                   : claim_limit_take(limit, DatumGetTimestampTz(now), static_cast<int64>(found));
    if (allowed == 0) {
        InitMaterializedSRF(fcinfo, 0);
        SPI_finish();
        return static_cast<Datum>(0);
    }
    if (allowed < static_cast<int64>(found)) {  // others took units meanwhile
        ids = first_ids(ids, static_cast<int>(allowed));
    }
    const int64 token = new_claim_token();
    require_durable_commit();
    const ClaimRequest request{
        ids,   expired_count > 0,        PG_GETARG_DATUM(1),    PG_GETARG_DATUM(2),
        token, DatumGetTimestampTz(now), ClaimOrder::kPriority, nullptr};
    const SPITupleTable* claimed = nullptr;
    const uint64 claimed_count = mark_claimed(request, &claimed);
    return_events(fcinfo, claimed, claimed_count);
    SPI_finish();
    return static_cast<Datum>(0);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_claim, pg_throttle::pg::claim)
