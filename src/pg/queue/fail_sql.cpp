// throttle.fail(ids, token, error, retry_in): records a failed attempt of
// the events that the claim `token` still holds, natively (kept plans,
// kept_plan.hpp).
//
//  1. Locks the claim's events (claim_lock.hpp).
//  2. In one statement: an event whose item_key has a newer pending run
//     (scheduled while it ran) is superseded by it, cancelled into
//     throttle.event_history; the others go back to pending, to run again
//     after retry_in (or a backoff of 10 s * 2^(attempts - 1), at most an
//     hour), or die when their attempts are used up; every attempt goes to
//     throttle.event_attempt. A newer run that commits while this runs
//     shows as a unique violation of event_pending_key: the statement runs
//     again, in a subtransaction of its own, with it in view (read
//     committed); a transaction snapshot cannot see it (40001).
//  3. In a group kept in strict order (throttle.group_policy), the claim's
//     later events of the group go back to pending behind the failed one,
//     their attempt not counted (throttle._fence_claims, as release_group).
//  4. The group leases of claims left with nothing claimed are released at
//     commit, and what the end lets go is NOTIFYed (claim_end.hpp).
//  5. When the token did not hold every event given, a NOTICE says so
//     (claim_not_held.hpp).
#include "pg/registry/standby.hpp"
#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"
#include "pg/server/clock.hpp"
#include "pg/server/kept_plan.hpp"
#include "pg/queue/subtransaction.hpp"
#include "pg/queue/claim_end.hpp"
#include "pg/queue/claim_lock.hpp"
#include "pg/queue/claim_not_held.hpp"
#include "pg/queue/event_rows.hpp"
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {
namespace {

// How many times step 2 runs when newer runs keep committing under it.
constexpr int kFailAttempts = 3;

// Step 2. ($1 ids, $2 token, $3 now, $4 error, $5 retry_in.) Each event
// is found by primary key and tested on its own row (CLAIM_OF_CALLER) and
// for a newer pending run of its item_key (one lookup per row,
// event_pending_key): no part of the statement joins the events to a list
// of them, which a generic plan that expects ten ids runs as a nested loop
// (fail of 10 000 events took 4 to 20 s). Both parts see one snapshot, so they
// decide alike for each event.
#define CLAIM_OF_CALLER                                                     \
    "e.id = ANY ($1) AND upper(e.state) = 'CLAIMED' AND e.claim_token = $2" \
    " AND throttle._acts_as(e.claimed_role)"
#define SUPERSEDED                                                     \
    "(e.attempts < e.max_attempts"                                     \
    " AND EXISTS (SELECT 1 FROM throttle.event u"                      \
    "             WHERE u.queue = e.queue AND u.item_key = e.item_key" \
    "               AND u.state = 'pending' OFFSET 0))"
KeptPlan fail_events{
    "WITH gone AS ("
    "  DELETE FROM throttle.event e"
    "  WHERE " CLAIM_OF_CALLER " AND " SUPERSEDED
    "  RETURNING e.*),"
    " superseded AS ("
    "  INSERT INTO throttle.event_history"
    "  SELECT g.id, g.queue, g.item_key, g.group_key, g.payload, g.run_at, 'cancelled',"
    "         g.attempts, g.max_attempts, g.enqueued_at, g.enqueued_by, g.claimed_at,"
    "         g.claimed_by, g.claim_token, NULL, NULL, NULL, $3, $4,"
    "         g.claimed_role, g.priority, $3, g.cancelled_by, g.concurrency_key"
    "  FROM gone g"
    "  RETURNING *),"
    " failed AS ("
    "  UPDATE throttle.event e"
    "  SET last_error = $4, lease_until = NULL,"
    "      state = CASE WHEN e.attempts >= e.max_attempts THEN 'dead' ELSE 'pending' END,"
    "      completed_at = CASE WHEN e.attempts >= e.max_attempts THEN $3 END,"
    "      completed_by = CASE WHEN e.attempts >= e.max_attempts THEN e.claimed_by END,"
    "      failed_at = $3,"
    "      run_at = CASE WHEN e.attempts >= e.max_attempts THEN e.run_at"
    "                    ELSE $3 + coalesce($5, least(interval '1 hour',"
    "                         interval '10 seconds' * 2 ^ least(e.attempts - 1, 16)))"
    "               END"
    "  WHERE " CLAIM_OF_CALLER " AND NOT " SUPERSEDED
    "  RETURNING e.*),"
    " ended AS ("
    "  SELECT h.id, h.queue, h.item_key, h.group_key, h.concurrency_key, h.attempts,"
    "         h.claimed_at, h.claimed_by, h.claimed_role FROM superseded h"
    "  UNION ALL"
    "  SELECT u.id, u.queue, u.item_key, u.group_key, u.concurrency_key, u.attempts,"
    "         u.claimed_at, u.claimed_by, u.claimed_role FROM failed u),"
    " logged AS ("
    "  INSERT INTO throttle.event_attempt (event_id, attempt, claimed_at, claimed_by,"
    "                                      claimed_role, ended_at, outcome, error)"
    "  SELECT x.id, x.attempts, x.claimed_at, x.claimed_by, x.claimed_role, $3, 'failed', $4"
    "  FROM ended x ORDER BY x.id)"
    " SELECT x.id, x.queue, x.item_key, x.group_key, x.concurrency_key"
    " FROM ended x ORDER BY x.id",
    5,
    {INT8ARRAYOID, INT8OID, TIMESTAMPTZOID, TEXTOID, INTERVALOID},
    nullptr};
#undef SUPERSEDED
#undef CLAIM_OF_CALLER
enum FailedColumn : int { kId = 1, kQueue = 2, kItemKey = 3, kGroupKey = 4, kConcurrencyKey = 5 };

// Step 3: the claim's later events of groups kept in strict order, fenced
// (pending again), their attempt not counted: they did not run. As (id,
// queue, item_key). ($1 ids, $2 queues, $3 group_keys of the failed events,
// $4 token, $5 now.)
KeptPlan hold_back_later{
    "SELECT b.id, b.queue, b.item_key FROM (SELECT ARRAY(SELECT e.id"
    "        FROM (SELECT f.queue, f.group_key, min(f.id) AS first_failed"
    "              FROM unnest($1::bigint[], $2::text[], $3::text[]) AS f(id, queue, group_key)"
    "              WHERE f.group_key IS NOT NULL"
    "                AND EXISTS (SELECT 1 FROM throttle.group_policy p"
    "                            WHERE p.queue = f.queue AND p.strict_order)"
    "              GROUP BY f.queue, f.group_key) AS h"
    "        CROSS JOIN LATERAL (SELECT e.id FROM throttle.event e"  // event_claimed_groups
    "                            WHERE e.queue = h.queue AND e.group_key = h.group_key"
    "                              AND e.group_key IS NOT NULL AND e.state = 'claimed'"
    "                              AND e.claim_token = $4 AND e.id > h.first_failed"
    "                            OFFSET 0) AS e"
    "        ORDER BY e.id) AS ids) AS later"
    " CROSS JOIN LATERAL throttle._fence_claims(later.ids, $5, later.ids) AS b",
    5,
    {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT8OID, TIMESTAMPTZOID},
    nullptr};
enum HeldBackColumn : int { kHeldId = 1, kHeldQueue = 2, kHeldItemKey = 3 };

// Raises 22023 unless retry_in (argument 3) is NULL or a finite interval
// that is not negative.
void check_retry_in(FunctionCallInfo fcinfo) {
    if (PG_ARGISNULL(3)) {
        return;
    }
    const Datum retry_in = PG_GETARG_DATUM(3);
    const Datum zero = IntervalPGetDatum(static_cast<Interval*>(palloc0(sizeof(Interval))));
    if (DatumGetBool(DirectFunctionCall2(interval_lt, retry_in, zero))) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("retry_in must not be negative")));
    }
    if (!DatumGetBool(DirectFunctionCall1(interval_finite, retry_in))) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("retry_in must be a finite interval")));
    }
}

// Step 2, run in a subtransaction (subtransaction.hpp).
struct FailEvents {
    const Datum* args;
    const char* nulls;
    bool may_retry;
};

bool fail_events_step(void* arg) {
    const auto* call = static_cast<const FailEvents*>(arg);
    run_kept_plan(&fail_events, call->args, call->nulls, SPI_OK_SELECT);
    return true;
}

// A newer run of an item_key that committed meanwhile: given up, to be
// tried again, when `may_retry` (40001 under a transaction snapshot).
bool newer_run_committed(const ErrorData* error, void* arg) {
    const bool newer_run = error->sqlerrcode == ERRCODE_UNIQUE_VIOLATION &&
                           error->constraint_name != nullptr &&
                           std::strcmp(error->constraint_name, "event_pending_key") == 0;
    if (!newer_run || !static_cast<const FailEvents*>(arg)->may_retry) {
        return false;
    }
    if (IsolationUsesXactSnapshot()) {
        ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                        errmsg("a newer run of an item_key was scheduled concurrently"),
                        errhint("Retry the transaction.")));
    }
    return true;
}

// Runs step 2 in a subtransaction, as a PL/pgSQL block with an exception
// handler would. Returns false, the subtransaction rolled back, when a
// newer run of an item_key committed meanwhile and `may_retry`; raises
// every other error (40001 for that one under a transaction snapshot).
// The rows are in SPI_tuptable when it returns true.
bool run_fail_events(const Datum* args, const char* nulls, bool may_retry) {
    FailEvents call{args, nulls, may_retry};
    return run_in_subtransaction(fail_events_step, &call, newer_run_committed);
}

// (ids bigint[], token bigint, error text, retry_in interval) -> integer,
// how many failed.
Datum fail(FunctionCallInfo fcinfo) {
    standby_refuse("throttle.fail");
    registry_require();
    require_not_null(fcinfo, 0, "ids");
    require_not_null(fcinfo, 1, "token");
    check_retry_in(fcinfo);
    // Detoasted once: the statements and the NOTICE read this copy.
    const Datum ids = PointerGetDatum(PG_GETARG_ARRAYTYPE_P(0));
    const Datum token = PG_GETARG_DATUM(1);

    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    const Datum now = TimestampTzGetDatum(clock_now());
    lock_claim_events(ids, token);
    const Datum args[5] = {ids, token, now, PG_ARGISNULL(2) ? 0 : PG_GETARG_DATUM(2),
                           PG_ARGISNULL(3) ? 0 : PG_GETARG_DATUM(3)};
    const char nulls[5] = {' ', ' ', ' ', PG_ARGISNULL(2) ? 'n' : ' ', PG_ARGISNULL(3) ? 'n' : ' '};
    for (int attempt = 1; !run_fail_events(args, nulls, attempt < kFailAttempts); ++attempt) {
    }
    const uint64 failed = SPI_processed;
    const bool grouped = spi_any_not_null(kGroupKey);
    const bool keyed = spi_any_not_null(kConcurrencyKey);
    if (failed > 0) {
        // Every column is read before the next statement replaces SPI_tuptable.
        const Datum queues = PointerGetDatum(spi_column(kQueue, TEXTOID));
        const Datum item_keys = PointerGetDatum(spi_column(kItemKey, TEXTOID));
        const Datum concurrency_keys =
            keyed ? PointerGetDatum(spi_column(kConcurrencyKey, TEXTOID)) : 0;
        Datum held_queues = 0;
        Datum held_item_keys = 0;
        if (grouped) {
            const Datum failed_ids = PointerGetDatum(spi_column(kId, INT8OID));
            const Datum group_keys = PointerGetDatum(spi_column(kGroupKey, TEXTOID));
            Datum hold_args[5] = {failed_ids, queues, group_keys, token, now};
            run_kept_plan(&hold_back_later, hold_args, nullptr, SPI_OK_SELECT);
            if (SPI_processed > 0) {
                held_queues = PointerGetDatum(spi_column(kHeldQueue, TEXTOID));
                held_item_keys = PointerGetDatum(spi_column(kHeldItemKey, TEXTOID));
            }
            release_emptied_groups(queues, group_keys, token);
        }
        notify_successors(queues, item_keys, concurrency_keys);
        if (held_queues != 0) {
            notify_successors(held_queues, held_item_keys, 0);
        }
    }
    SPI_finish();
    notice_claim_not_held("throttle.fail", ids, failed, kClaimEndHint);
    PG_RETURN_INT32(static_cast<int32>(failed));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_fail, pg_throttle::pg::fail)
