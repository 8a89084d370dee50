// throttle.complete(ids, token): marks done the events that the claim
// `token` still holds, natively (kept plans, kept_plan.hpp), and moves them
// to throttle.event_history.
//
//  1. Locks the claim's events (claim_lock.hpp).
//  2. Moves them to throttle.event_history, done, if the caller may act for
//     the claim's role.
//  3. Releases, at commit, the leases of group claims with nothing left
//     claimed, and NOTIFYs the due events of those groups, the due runs
//     scheduled for the finished events' item_keys while they ran, and the
//     oldest due event of their concurrency_keys.
#include "pg/arguments.hpp"
#include "pg/boundary.hpp"
#include "pg/clock.hpp"
#include "pg/kept_plan.hpp"
#include "pg/queue/claim_lock.hpp"
#include "pg/queue/event_rows.hpp"
#include "pg/queue/group_lease.hpp"
#include "pg/queue/group_lease_xact.hpp"
#include "pg/registry.hpp"

namespace pg_throttle::pg {
namespace {

// Done events leave the hot table for throttle.event_history: a delete
// and an insert into a table with two indexes cost less than the update of
// a row that throttle.event's indexes and checks would see again. What the
// statements after it need comes back from it: none of them reads the
// history, whose statistics (an empty table before a drain) could give
// their kept plans a scan of the whole table.
KeptPlan move_done{
    "WITH done AS ("
    "  DELETE FROM throttle.event e"
    "  WHERE e.id = ANY ($1) AND upper(e.state) = 'CLAIMED' AND e.claim_token = $2"
    "    AND throttle._acts_as(e.claimed_role)"
    "  RETURNING e.*)"
    " INSERT INTO throttle.event_history"
    " SELECT d.id, d.queue, d.item_key, d.group_key, d.payload, d.run_at, 'done', d.attempts,"
    "        d.max_attempts, d.enqueued_at, d.enqueued_by, d.claimed_at, d.claimed_by,"
    "        d.claim_token, NULL, $3, d.claimed_by, d.cancelled_at, d.last_error,"
    "        d.claimed_role, d.priority, d.failed_at, d.cancelled_by, d.concurrency_key"
    " FROM done d"
    " RETURNING id, group_key IS NOT NULL, concurrency_key IS NOT NULL, queue, item_key,"
    "           group_key, claim_token, concurrency_key",
    3,
    {INT8ARRAYOID, INT8OID, TIMESTAMPTZOID},
    nullptr};
enum DoneColumn : int {
    kGrouped = 2,
    kKeyed = 3,
    kQueue = 4,
    kItemKey = 5,
    kGroupKey = 6,
    kToken = 7,
    kConcurrencyKey = 8
};

// Of the group claims of the events just done, those with nothing left
// claimed: throttle._release_groups's test, which complete runs itself (as
// it runs _notify_successors's statements, below). The rows are found by
// event_groups, never through the partial indexes on state.
KeptPlan groups_left_empty{
    "SELECT f.queue, f.group_key, f.claim_token"
    " FROM (SELECT DISTINCT u.queue, u.group_key, u.claim_token"
    "       FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(queue, group_key, claim_token)"
    "       WHERE u.group_key IS NOT NULL) AS f"
    " WHERE NOT EXISTS (SELECT 1 FROM throttle.event e"  // event_groups
    "                   WHERE e.queue = f.queue AND e.group_key = f.group_key"
    "                     AND e.state IN ('pending', 'claimed') AND upper(e.state) = 'CLAIMED'"
    "                     AND e.group_key IS NOT NULL AND e.claim_token = f.claim_token)",
    3,
    {TEXTARRAYOID, TEXTARRAYOID, INT8ARRAYOID},
    nullptr};
enum EmptyGroupColumn : int { kEmptyQueue = 1, kEmptyGroupKey = 2, kEmptyToken = 3 };

// The due events of the groups released: they can be had once the commit
// frees the groups.
KeptPlan notify_released_groups{
    "SELECT pg_notify(x.queue, x.id::text)"
    " FROM unnest($1::text[], $2::text[]) AS g(queue, group_key)"
    " JOIN throttle.event x"  // event_groups
    "   ON x.queue = g.queue AND x.group_key = g.group_key AND x.group_key IS NOT NULL"
    "  AND x.state IN ('pending', 'claimed') AND upper(x.state) = 'PENDING' AND x.run_at <= $3",
    3,
    {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID},
    nullptr};

// Releases, at commit, the group leases of the claims in SPI_tuptable
// (groups_left_empty's rows), and NOTIFYs their groups' due events.
void release_groups_left_empty(Datum now) {
    const uint64 n = SPI_processed;
    if (n == 0) {
        return;
    }
    SPITupleTable* rows = SPI_tuptable;
    for (uint64 i = 0; i < n; ++i) {
        bool is_null = false;
        const Datum queue = SPI_getbinval(rows->vals[i], rows->tupdesc, kEmptyQueue, &is_null);
        const Datum group = SPI_getbinval(rows->vals[i], rows->tupdesc, kEmptyGroupKey, &is_null);
        const Datum token = SPI_getbinval(rows->vals[i], rows->tupdesc, kEmptyToken, &is_null);
        RegistryKey key;
        if (group_lease_find(DatumGetTextPP(queue), DatumGetTextPP(group), DatumGetInt64(token),
                             &key)) {
            group_lease_release_at_commit(key, DatumGetInt64(token));
        }
    }
    Datum notify_args[3] = {PointerGetDatum(spi_column(kEmptyQueue, TEXTOID)),
                            PointerGetDatum(spi_column(kEmptyGroupKey, TEXTOID)), now};
    run_kept_plan(&notify_released_groups, notify_args, nullptr, SPI_OK_SELECT);
}

// throttle._notify_successors's statement, for the (queue, item_key) pairs
// of the events done. complete runs these statements itself instead of
// calling the PL/pgSQL helpers that fail calls: each helper call
// cost more than its statement (claim + complete ran at 1 950 rather than
// 3 000 jobs/s through them).
KeptPlan notify_successors{
    "SELECT pg_notify(u.queue, u.id::text) FROM throttle.event u"  // event_pending_key
    " WHERE (u.queue, u.item_key) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
    "   AND u.state = 'pending' AND u.run_at <= $3",
    3,
    {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID},
    nullptr};

// The second statement of throttle._notify_successors: a claim of a
// concurrency_key ended, which may let the key's oldest due event go.
KeptPlan notify_key_waiters{
    "SELECT pg_notify(k.queue, w.id::text)"
    " FROM (SELECT DISTINCT f.queue, f.concurrency_key"
    "       FROM unnest($1::text[], $2::text[]) AS f(queue, concurrency_key)"
    "       WHERE f.concurrency_key IS NOT NULL) AS k"
    " CROSS JOIN LATERAL (SELECT u.id FROM throttle.event u"  // event_pending_concurrency
    "                     WHERE u.queue = k.queue AND u.concurrency_key = k.concurrency_key"
    "                       AND u.state = 'pending' AND u.concurrency_key IS NOT NULL"
    "                       AND u.run_at <= $3"
    "                     ORDER BY u.run_at LIMIT 1) AS w",
    3,
    {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID},
    nullptr};

// (ids bigint[], token bigint) -> integer, how many were completed.
Datum complete(FunctionCallInfo fcinfo) {
    require_not_null(fcinfo, 0, "ids");
    require_not_null(fcinfo, 1, "token");
    registry_require();
    const Datum ids = PG_GETARG_DATUM(0);
    const Datum token = PG_GETARG_DATUM(1);

    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    const Datum now = TimestampTzGetDatum(clock_now());
    lock_claim_events(ids, token);
    Datum done_args[3] = {ids, token, now};
    run_kept_plan(&move_done, done_args, nullptr, SPI_OK_INSERT_RETURNING);
    const uint64 completed = SPI_processed;
    bool is_null = false;
    bool grouped = false;
    bool keyed = false;
    for (uint64 i = 0; i < completed; ++i) {
        grouped = grouped || DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i],
                                                        SPI_tuptable->tupdesc, kGrouped, &is_null));
        keyed = keyed || DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
                                                    kKeyed, &is_null));
    }
    if (completed > 0) {
        // Every column is read before the next statement replaces SPI_tuptable.
        const Datum queues = PointerGetDatum(spi_column(kQueue, TEXTOID));
        const Datum item_keys = PointerGetDatum(spi_column(kItemKey, TEXTOID));
        const Datum group_keys = grouped ? PointerGetDatum(spi_column(kGroupKey, TEXTOID)) : 0;
        const Datum tokens = grouped ? PointerGetDatum(spi_column(kToken, INT8OID)) : 0;
        const Datum concurrency_keys =
            keyed ? PointerGetDatum(spi_column(kConcurrencyKey, TEXTOID)) : 0;
        if (grouped) {
            Datum group_args[3] = {queues, group_keys, tokens};
            run_kept_plan(&groups_left_empty, group_args, nullptr, SPI_OK_SELECT);
            release_groups_left_empty(now);
        }
        Datum notify_args[3] = {queues, item_keys, now};
        run_kept_plan(&notify_successors, notify_args, nullptr, SPI_OK_SELECT);
        if (keyed) {
            Datum key_args[3] = {queues, concurrency_keys, now};
            run_kept_plan(&notify_key_waiters, key_args, nullptr, SPI_OK_SELECT);
        }
    }
    SPI_finish();
    PG_RETURN_INT32(static_cast<int32>(completed));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_complete, pg_throttle::pg::complete)
