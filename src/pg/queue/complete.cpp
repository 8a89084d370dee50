// throttle.complete(ids, token): marks done the events that the claim
// `token` still holds, natively (kept plans, kept_plan.hpp), and moves them
// to throttle.event_history.
//
//  1. Locks the claim's events (claim_lock.hpp).
//  2. Moves them to throttle.event_history, done, if the caller may act for
//     the claim's role.
//  3. NOTIFYs the due runs scheduled for the finished events' item_keys
//     while they ran (found by the move itself); releases, at commit, the
//     leases of group claims with nothing left claimed, and NOTIFYs the due
//     events of those groups and the oldest due event of the finished
//     events' concurrency_keys (claim_end.hpp).
#include "pg/standby.hpp"
#include "pg/arguments.hpp"
#include "pg/boundary.hpp"
#include "pg/clock.hpp"
#include "pg/kept_plan.hpp"
#include "pg/queue/claim_end.hpp"
#include "pg/queue/claim_lock.hpp"
#include "pg/queue/event_notify.hpp"
#include "pg/queue/event_rows.hpp"
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
    " RETURNING id, queue, item_key, group_key, concurrency_key,"
    // The due pending run of the item_key, scheduled while the event ran
    // (event_pending_key; the claimed row is not pending): the end lets it go.
    "   (SELECT u.id FROM throttle.event u"
    "    WHERE u.queue = event_history.queue AND u.item_key = event_history.item_key"
    "      AND u.state = 'pending' AND u.run_at <= $4 LIMIT 1)",
    4,
    {INT8ARRAYOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID},
    nullptr};
enum DoneColumn : int {
    kQueue = 2,
    kItemKey = 3,
    kGroupKey = 4,
    kConcurrencyKey = 5,
    kSuccessor = 6
};

// NOTIFYs, on its queue's channel, the successor of each moved event that
// has one.
void notify_item_key_successors() {
    for (uint64 i = 0; i < SPI_processed; ++i) {
        bool is_null = true;
        const Datum successor =
            SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, kSuccessor, &is_null);
        if (!is_null) {
            notify_event(SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, kQueue),
                         DatumGetInt64(successor));
        }
    }
}

// (ids bigint[], token bigint) -> integer, how many were completed.
Datum complete(FunctionCallInfo fcinfo) {
    standby_refuse("throttle.complete");
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
    // "Due" as of after the lock waits: a successor that came due while this
    // call waited is NOTIFYed too.
    Datum done_args[4] = {ids, token, now, TimestampTzGetDatum(clock_now())};
    run_kept_plan(&move_done, done_args, nullptr, SPI_OK_INSERT_RETURNING);
    const uint64 completed = SPI_processed;
    const bool grouped = spi_any_not_null(kGroupKey);
    const bool keyed = spi_any_not_null(kConcurrencyKey);
    if (completed > 0) {
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
    SPI_finish();
    PG_RETURN_INT32(static_cast<int32>(completed));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_complete, pg_throttle::pg::complete)
