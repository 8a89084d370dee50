// First: it includes src/core headers, which come before PostgreSQL's.
#include "pg/queue/group_lease.hpp"

#include "pg/server/clock.hpp"
#include "pg/server/kept_plan.hpp"
#include "pg/queue/claim_end.hpp"
#include "pg/queue/event_rows.hpp"
#include "pg/queue/group_lease_xact.hpp"

namespace pg_throttle::pg {
namespace {

// Of the group claims of the ended events, those with nothing left claimed
// (throttle._release_groups's test). The rows are found by event_groups,
// never through the partial indexes on state.
KeptPlan groups_left_empty{
    "SELECT f.queue, f.group_key"
    " FROM (SELECT DISTINCT u.queue, u.group_key"
    "       FROM unnest($1::text[], $2::text[]) AS u(queue, group_key)"
    "       WHERE u.group_key IS NOT NULL) AS f"
    " WHERE (SELECT 1 FROM throttle.event e"  // event_groups
    "        WHERE e.queue = f.queue AND e.group_key = f.group_key"
    "          AND e.state IN ('pending', 'claimed') AND upper(e.state) = 'CLAIMED'"
    "          AND e.group_key IS NOT NULL AND e.claim_token = $3 LIMIT 1) IS NULL",
    3,
    {TEXTARRAYOID, TEXTARRAYOID, INT8OID},
    nullptr};
enum EmptyGroupColumn : int { kEmptyQueue = 1, kEmptyGroupKey = 2 };

// The due events of the groups released: they can be had once the commit
// frees the groups.
KeptPlan notify_released_groups{
    "SELECT pg_notify(x.queue, x.id::text)"
    " FROM (SELECT DISTINCT * FROM unnest($1::text[], $2::text[])) AS g(queue, group_key)"
    " CROSS JOIN LATERAL (SELECT x.queue, x.id FROM throttle.event x"  // event_groups
    "                     WHERE x.queue = g.queue AND x.group_key = g.group_key"
    "                       AND x.group_key IS NOT NULL AND x.state IN ('pending', 'claimed')"
    "                       AND upper(x.state) = 'PENDING' AND x.run_at <= $3"
    "                     OFFSET 0) AS x",
    3,
    {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID},
    nullptr};

// throttle._notify_successors's first statement: the due pending runs of
// the (queue, item_key) pairs of the ended events. complete and fail run
// these statements themselves instead of calling the PL/pgSQL helpers: each
// helper call cost more than its statement (claim + complete ran at 1 950
// rather than 3 000 jobs/s through them).
KeptPlan notify_item_key_runs{
    "SELECT pg_notify(u.queue, u.id::text)"
    " FROM (SELECT DISTINCT * FROM unnest($1::text[], $2::text[])) AS f(queue, item_key)"
    " CROSS JOIN LATERAL (SELECT u.queue, u.id FROM throttle.event u"  // event_pending_key
    "                     WHERE u.queue = f.queue AND u.item_key = f.item_key"
    "                       AND u.state = 'pending' AND u.run_at <= $3"
    "                     LIMIT 1) AS u",
    3,
    {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID},
    nullptr};

// Its second statement: a claim of a concurrency_key ended, which may let
// the key's oldest due event go.
KeptPlan key_waiters{
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

}  // namespace

void release_emptied_groups(Datum queues, Datum group_keys, Datum token) {
    Datum group_args[3] = {queues, group_keys, token};
    run_kept_plan(&groups_left_empty, group_args, nullptr, SPI_OK_SELECT);
    const uint64 n = SPI_processed;
    if (n == 0) {
        return;
    }
    SPITupleTable* rows = SPI_tuptable;
    for (uint64 i = 0; i < n; ++i) {
        bool is_null = false;
        const Datum queue = SPI_getbinval(rows->vals[i], rows->tupdesc, kEmptyQueue, &is_null);
        const Datum group = SPI_getbinval(rows->vals[i], rows->tupdesc, kEmptyGroupKey, &is_null);
        RegistryKey key;
        if (group_lease_find(DatumGetTextPP(queue), DatumGetTextPP(group), DatumGetInt64(token),
                             &key)) {
            group_lease_release_at_commit(key, DatumGetInt64(token));
        }
    }
    Datum notify_args[3] = {PointerGetDatum(spi_column(kEmptyQueue, TEXTOID)),
                            PointerGetDatum(spi_column(kEmptyGroupKey, TEXTOID)),
                            TimestampTzGetDatum(clock_now())};
    run_kept_plan(&notify_released_groups, notify_args, nullptr, SPI_OK_SELECT);
}

void notify_key_waiters(Datum queues, Datum concurrency_keys) {
    Datum key_args[3] = {queues, concurrency_keys, TimestampTzGetDatum(clock_now())};
    run_kept_plan(&key_waiters, key_args, nullptr, SPI_OK_SELECT);
}

void notify_successors(Datum queues, Datum item_keys, Datum concurrency_keys) {
    Datum notify_args[3] = {queues, item_keys, TimestampTzGetDatum(clock_now())};
    run_kept_plan(&notify_item_key_runs, notify_args, nullptr, SPI_OK_SELECT);
    if (concurrency_keys != 0) {
        notify_key_waiters(queues, concurrency_keys);
    }
}

}  // namespace pg_throttle::pg
