// throttle.schedule(queue, item_key, run_at, payload, group_key,
// max_attempts, priority, on_duplicate, concurrency_key): one event,
// natively, in one statement whose plan this backend prepared once
// (kept_plan.hpp).
//
//  1. The arguments checked, with the messages and SQLSTATEs that
//     schedule_many gives for the same values.
//  2. An INSERT into throttle.event; when the queue has a pending event of
//     item_key (event_pending_key), on_duplicate says what changes in it:
//     replace (run_at, payload, priority), keep_earlier (the same, but the
//     earlier run_at) or ignore (nothing). Replace and keep_earlier make it
//     a new run, with attempts of its own: they start again at 0 (one whose
//     earlier claims used its attempts up would otherwise die at its next
//     claim, unrun). A claimed event of item_key is never touched: the new
//     event is its pending successor.
//  3. A NOTIFY on the queue's channel, with the event's id, when it is due.
#include "pg/registry/standby.hpp"
#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"
#include "pg/server/clock.hpp"
#include "pg/server/kept_plan.hpp"
#include "pg/queue/caller.hpp"
#include "pg/queue/event_rows.hpp"
#include "pg/queue/group_lease.hpp"
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {
namespace {

// Keys are indexed: an index entry holds at most about 2 700 bytes.
constexpr size_t kMaxKeyBytes = 1024;

KeptPlan schedule_event{
    "INSERT INTO throttle.event AS e (queue, item_key, group_key, payload, run_at, max_attempts,"
    "                                 enqueued_at, enqueued_by, priority, concurrency_key)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
    " ON CONFLICT (queue, item_key) WHERE state = 'pending'"
    " DO UPDATE SET run_at = CASE $11 WHEN 'replace' THEN excluded.run_at"
    "                                 WHEN 'keep_earlier' THEN least(e.run_at, excluded.run_at)"
    "                                 ELSE e.run_at END,"
    "               payload = CASE WHEN $11 = 'ignore' THEN e.payload ELSE excluded.payload END,"
    "               priority = CASE WHEN $11 = 'ignore' THEN e.priority ELSE excluded.priority END,"
    "               attempts = CASE WHEN $11 = 'ignore' THEN e.attempts ELSE 0 END"
    " RETURNING e.id, e.run_at",
    11,
    {TEXTOID, TEXTOID, TEXTOID, JSONBOID, TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID, TEXTOID, INT4OID,
     TEXTOID, TEXTOID},
    nullptr};

enum Arg : int {
    kQueue = 0,
    kItemKey = 1,
    kRunAt = 2,
    kPayload = 3,
    kGroupKey = 4,
    kMaxAttempts = 5,
    kPriority = 6,
    kOnDuplicate = 7,
    kConcurrencyKey = 8
};

// The byte length of text argument `n`, or 0 when it is NULL.
size_t text_bytes(FunctionCallInfo fcinfo, int n) {
    return PG_ARGISNULL(n) ? 0 : VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(n));
}

// throttle._check_schedule's and throttle._check_concurrency_key's rules,
// in their order.
void check_arguments(FunctionCallInfo fcinfo) {
    require_not_null(fcinfo, kQueue, "queue");
    require_not_null(fcinfo, kItemKey, "item_key");
    require_not_null(fcinfo, kRunAt, "run_at");
    require_not_null(fcinfo, kPayload, "payload");
    require_not_null(fcinfo, kMaxAttempts, "max_attempts");
    require_not_null(fcinfo, kPriority, "priority");
    require_not_null(fcinfo, kOnDuplicate, "on_duplicate");
    const char* on_duplicate = text_to_cstring(PG_GETARG_TEXT_PP(kOnDuplicate));
    if (std::strcmp(on_duplicate, "replace") != 0 &&
        std::strcmp(on_duplicate, "keep_earlier") != 0 &&
        std::strcmp(on_duplicate, "ignore") != 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("on_duplicate must be replace, keep_earlier or ignore")));
    }
    if (PG_GETARG_INT32(kMaxAttempts) <= 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("max_attempts must be positive")));
    }
    const size_t queue_bytes = text_bytes(fcinfo, kQueue);
    if (queue_bytes == 0 || queue_bytes > kMaxQueueBytes) {
        ereport(
            ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("queue name must have 1 to 63 bytes"),
             errdetail("The queue name is also the NOTIFY channel that workers LISTEN on.")));
    }
    const size_t item_key_bytes = text_bytes(fcinfo, kItemKey);
    if (item_key_bytes == 0) {
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("item_key must not be empty")));
    }
    const char* too_long = item_key_bytes > kMaxKeyBytes                        ? "item_key"
                           : text_bytes(fcinfo, kGroupKey) > kMaxKeyBytes       ? "group_key"
                           : text_bytes(fcinfo, kConcurrencyKey) > kMaxKeyBytes ? "concurrency_key"
                                                                                : nullptr;
    if (too_long != nullptr) {
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("%s must have at most 1024 bytes", too_long),
                 errdetail("Keys are indexed; an index entry holds at most about 2700 bytes.")));
    }
    if (!PG_ARGISNULL(kConcurrencyKey) && text_bytes(fcinfo, kConcurrencyKey) == 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("concurrency_key must not be empty"), errhint("NULL means none.")));
    }
    if (!PG_ARGISNULL(kConcurrencyKey) && !PG_ARGISNULL(kGroupKey)) {
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("an event has a group_key or a concurrency_key, not both"),
                 errhint("A group's events go to claim_group, which throttle.group_policy limits "
                         "per group.")));
    }
}

// (queue text, item_key text, run_at timestamptz, payload jsonb, group_key
// text, max_attempts integer, priority integer, on_duplicate text,
// concurrency_key text) -> bigint, the event's id.
Datum schedule(FunctionCallInfo fcinfo) {
    standby_refuse("throttle.schedule");
    registry_require();  // 55000 before any argument error, as the PL/pgSQL schedule did
    check_arguments(fcinfo);
    const TimestampTz now = clock_now();
    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    Datum args[11] = {PG_GETARG_DATUM(kQueue),
                      PG_GETARG_DATUM(kItemKey),
                      PG_ARGISNULL(kGroupKey) ? 0 : PG_GETARG_DATUM(kGroupKey),
                      PG_GETARG_DATUM(kPayload),
                      PG_GETARG_DATUM(kRunAt),
                      PG_GETARG_DATUM(kMaxAttempts),
                      TimestampTzGetDatum(now),
                      PointerGetDatum(caller_name()),
                      PG_GETARG_DATUM(kPriority),
                      PG_ARGISNULL(kConcurrencyKey) ? 0 : PG_GETARG_DATUM(kConcurrencyKey),
                      PG_GETARG_DATUM(kOnDuplicate)};
    char nulls[11];
    std::memset(nulls, ' ', sizeof(nulls));
    nulls[2] = PG_ARGISNULL(kGroupKey) ? 'n' : ' ';
    nulls[9] = PG_ARGISNULL(kConcurrencyKey) ? 'n' : ' ';
    run_kept_plan(&schedule_event, args, nulls, SPI_OK_INSERT_RETURNING, 1);
    bool is_null = false;
    const int64 id =
        DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
    const TimestampTz run_at = DatumGetTimestampTz(
        SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &is_null));
    SPI_finish();
    if (run_at <= now) {
        notify_event(text_to_cstring(PG_GETARG_TEXT_PP(kQueue)), id);  // checked above
    }
    PG_RETURN_INT64(id);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_schedule, pg_throttle::pg::schedule)
