// throttle.complete(ids, token): marks done the events that the claim
// `token` still holds, natively (kept plans, kept_plan.hpp), and moves them
// to throttle.event_history.
//
//  1. Events without a group_key (claims of throttle.claim): one statement
//     locks them in id order, if the caller may act for the claim's role,
//     and moves them, done (move_done_ungrouped).
//  2. The rest, events of group claims: locked with the other events of
//     their claims (claim_lock.hpp), then moved the same way.
//  3. NOTIFYs the due runs scheduled for the finished events' item_keys
//     while they ran (found by the move itself); releases, at commit, the
//     leases of group claims with nothing left claimed, and NOTIFYs the due
//     events of those groups and the oldest due event of the finished
//     events' concurrency_keys (claim_end.hpp).
//  4. When the token did not hold every event given, a NOTICE says so
//     (claim_not_held.hpp).
#include "pg/registry/standby.hpp"
#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"
#include "pg/server/clock.hpp"
#include "pg/server/kept_plan.hpp"
#include "pg/queue/claim_end.hpp"
#include "pg/queue/claim_lock.hpp"
#include "pg/queue/claim_not_held.hpp"
#include "pg/queue/event_rows.hpp"
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {
namespace {

// Done events leave the hot table for throttle.event_history: a delete
// and an insert into a table with two indexes cost less than the update of
// a row that throttle.event's indexes and checks would see again. What the
// statements after it need comes back from it: none of them reads the
// history, whose statistics (an empty table before a drain) could give
// their kept plans a scan of the whole table.
// The move, of the events `rows` (an array expression): the claim's events
// among them, done.
#define MOVE_DONE(rows) \
    "WITH done AS ("                                                                         \
    "  DELETE FROM throttle.event e"                                                         \
    "  WHERE e.id = ANY (" rows ") AND upper(e.state) = 'CLAIMED' AND e.claim_token = $2"    \
    "    AND throttle._acts_as(e.claimed_role)"                                              \
    "  RETURNING e.*)"                                                                       \
    " INSERT INTO throttle.event_history"                                                    \
    " SELECT d.id, d.queue, d.item_key, d.group_key, d.payload, d.run_at, 'done', d.attempts," \
    "        d.max_attempts, d.enqueued_at, d.enqueued_by, d.claimed_at, d.claimed_by,"     \
    "        d.claim_token, NULL, $3, d.claimed_by, d.cancelled_at, d.last_error,"           \
    "        d.claimed_role, d.priority, d.failed_at, d.cancelled_by, d.concurrency_key"     \
    " FROM done d"                                                                           \
    " RETURNING id, queue, item_key, group_key, concurrency_key,"                            \
    /* The pending run of the item_key, scheduled while the event ran        */             \
    /* (event_pending_key; the claimed row is not pending): the end lets it go. */           \
    "   (SELECT u.id FROM throttle.event u"                                                  \
    "    WHERE u.queue = event_history.queue AND u.item_key = event_history.item_key"        \
    "      AND u.state = 'pending' LIMIT 1)"

// After the events are locked (claim_lock.hpp).
KeptPlan move_done{MOVE_DONE("$1"), 3, {INT8ARRAYOID, INT8OID, TIMESTAMPTZOID}, nullptr};

// The lean path, first: the events of a claim of throttle.claim (no
// group_key) need no lock but their own, taken in id order, the order
// lock_claim_events keeps for complete, fail and extend, whatever the plan
// (a bitmap scan of the primary key would lock in the order of the rows in
// the table): locked by the subquery, moved by the DELETE. The events of a
// group claim are left to move_done.
KeptPlan move_done_ungrouped{
    MOVE_DONE("ARRAY(SELECT g.id FROM throttle.event g"
              "      WHERE g.id = ANY ($1) AND upper(g.state) = 'CLAIMED' AND g.claim_token = $2"
              "        AND g.group_key IS NULL AND throttle._acts_as(g.claimed_role)"
              "      ORDER BY g.id FOR UPDATE OF g)"),
    3,
    {INT8ARRAYOID, INT8OID, TIMESTAMPTZOID},
    nullptr};

// Of the pending runs $1 that the moves found, those due at $2: the clock
// read after the moves, so that a run that came due while a move waited for
// a lock is NOTIFYed too. (A newer run that commits after the move's
// snapshot, during a wait for a row or after it, is not among them: as for
// any newer run scheduled while its predecessor's end is not committed, its
// own NOTIFY comes before the end, and a worker finds it by polling.)
KeptPlan due_successors{
    "SELECT queue, id FROM throttle.event"
    " WHERE id = ANY ($1) AND upper(state) = 'PENDING' AND run_at <= $2",
    2,
    {INT8ARRAYOID, TIMESTAMPTZOID},
    nullptr};

#undef MOVE_DONE

enum DoneColumn : int {
    kQueue = 2,
    kItemKey = 3,
    kGroupKey = 4,
    kConcurrencyKey = 5,
    kSuccessor = 6
};

// NOTIFYs, on its queue's channel, the pending run of each moved event's
// item_key that is due. Replaces SPI_tuptable.
void notify_item_key_successors() {
    Datum* successors = static_cast<Datum*>(palloc(sizeof(Datum) * SPI_processed));
    int count = 0;
    for (uint64 i = 0; i < SPI_processed; ++i) {
        bool is_null = true;
        const Datum successor =
            SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, kSuccessor, &is_null);
        if (!is_null) {
            successors[count++] = successor;
        }
    }
    if (count == 0) {
        return;
    }
    Datum args[2] = {PointerGetDatum(ids_array(successors, count)),
                     TimestampTzGetDatum(clock_now())};
    run_kept_plan(&due_successors, args, nullptr, SPI_OK_SELECT);
    for (uint64 i = 0; i < SPI_processed; ++i) {
        bool is_null = true;
        notify_event(SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1),
                     DatumGetInt64(
                         SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &is_null)));
    }
}

// What follows the move of the events in SPI_tuptable (a result of
// MOVE_DONE) out of the claim `token`.
void end_moved(Datum token) {
    if (SPI_processed == 0) {
        return;
    }
    const bool grouped = spi_any_not_null(kGroupKey);
    const bool keyed = spi_any_not_null(kConcurrencyKey);
    // Every column is read before the next statement replaces SPI_tuptable.
    const Datum queues = PointerGetDatum(spi_column(kQueue, TEXTOID));
    const Datum group_keys = grouped ? PointerGetDatum(spi_column(kGroupKey, TEXTOID)) : 0;
    const Datum concurrency_keys =
        keyed ? PointerGetDatum(spi_column(kConcurrencyKey, TEXTOID)) : 0;
    notify_item_key_successors();
    if (grouped) {
        release_emptied_groups(queues, group_keys, token);
    }
    if (keyed) {
        notify_key_waiters(queues, concurrency_keys);
    }
}

// (ids bigint[], token bigint) -> integer, how many were completed.
Datum complete(FunctionCallInfo fcinfo) {
    standby_refuse("throttle.complete");
    require_not_null(fcinfo, 0, "ids");
    require_not_null(fcinfo, 1, "token");
    registry_require();
    // Detoasted once: the statements and the NOTICE read this copy.
    const Datum ids = PointerGetDatum(PG_GETARG_ARRAYTYPE_P(0));
    const Datum token = PG_GETARG_DATUM(1);

    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    const Datum now = TimestampTzGetDatum(clock_now());
    Datum done_args[3] = {ids, token, now};
    run_kept_plan(&move_done_ungrouped, done_args, nullptr, SPI_OK_INSERT_RETURNING);
    uint64 completed = SPI_processed;
    end_moved(token);
    const ArrayType* given = DatumGetArrayTypeP(ids);
    if (completed < static_cast<uint64>(ArrayGetNItems(ARR_NDIM(given), ARR_DIMS(given)))) {
        // Grouped events (or ids of no event of the claim).
        lock_claim_events(ids, token);
        run_kept_plan(&move_done, done_args, nullptr, SPI_OK_INSERT_RETURNING);
        completed += SPI_processed;
        end_moved(token);
    }
    SPI_finish();
    notice_claim_not_held("throttle.complete", ids, completed, kClaimEndHint);
    PG_RETURN_INT32(static_cast<int32>(completed));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_complete, pg_throttle::pg::complete)
