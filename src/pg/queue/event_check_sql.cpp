// throttle._event_check(): the rules of a row of throttle.event, a trigger
// BEFORE INSERT OR UPDATE, where CHECK constraints stood until 0.3.0. The
// rules are the same, with the same constraint names and SQLSTATE (23514),
// and like a CHECK a rule holds when its columns are NULL (NOT NULL is
// checked after the trigger):
//   event_queue_check                queue <> '' AND octet_length(queue) <= 63
//   event_item_key_check             item_key <> ''
//   event_state_check                state IN ('pending', 'claimed', 'dead')
//   event_max_attempts_check         max_attempts > 0
//   event_concurrency_key_ungrouped  concurrency_key IS NULL OR group_key IS NULL
// And one more: a pending event has attempts left. No call leaves one
// without (claim's lean path takes only events with attempts left), so a row
// that comes without — restored from a dump of an earlier version, which
// left them — is stored dead, as its next claim made it then: completed_at
// the time, completed_by its last worker, last_error kept or 'lease expired
// N times'.
//
// And it notes the position of each pending event without a group_key it
// lets through, for the queue's scan floor, and the instant each pending
// event falls due or each claim's lease ends, for the database's waker,
// reported when the transaction commits (scan_floors.hpp, wakeups.hpp):
// every write of the table, whoever makes it, passes here.
//
// The trigger is ENABLE ALWAYS: it also runs under session_replication_role
// = replica (a logical replication apply worker), as CHECK constraints did.
//
// Why a trigger: PostgreSQL builds a table's CHECK expressions again, from
// their stored form, at every execution of a statement that writes the
// table (ExecRelCheck keeps them in the executor state only), and every
// claim updates a row: the five cost a claim and its complete 151 000 of
// 1 147 000 instructions (callgrind, 2026-11-28). The trigger reads seven
// columns of the new row (7 000).

// The core's headers (through clock.hpp) come before PostgreSQL's.
#include "pg/server/clock.hpp"
#include "pg/queue/no_key_writes.hpp"
#include "pg/queue/scan_floors.hpp"
#include "pg/queue/wakeups.hpp"
#include "pg/server/boundary.hpp"

extern "C" {
#include "commands/trigger.h"
#include "utils/builtins.h"
#include "utils/rel.h"
}

namespace pg_throttle::pg {
namespace {

enum Column : int {
    kQueue,
    kItemKey,
    kGroupKey,
    kState,
    kMaxAttempts,
    kConcurrencyKey,
    kAttempts,
    kCompletedAt,
    kCompletedBy,
    kClaimedBy,
    kLastError,
    kRunAt,
    kId,
    kPriority,
    kLeaseUntil,
    kColumns
};
constexpr const char* kNames[] = {"queue",        "item_key",        "group_key",  "state",
                                  "max_attempts", "concurrency_key", "attempts",   "completed_at",
                                  "completed_by", "claimed_by",      "last_error", "run_at",
                                  "id",           "priority",        "lease_until"};
constexpr Oid kTypes[] = {TEXTOID, TEXTOID,        TEXTOID,        TEXTOID, INT4OID,
                          TEXTOID, INT4OID,        TIMESTAMPTZOID, TEXTOID, TEXTOID,
                          TEXTOID, TIMESTAMPTZOID, INT8OID,        INT4OID, TIMESTAMPTZOID};

static_assert(std::size(kNames) == kColumns && std::size(kTypes) == kColumns);

// The columns' numbers in the table, looked up by name on first use and
// checked by name and type on every use (a table made again may number them
// apart; a column of another type is never read as this one's).
AttrNumber attnums[kColumns];

bool is_column(TupleDesc desc, AttrNumber number, Column column) {
    if (number <= 0 || number > desc->natts) {
        return false;
    }
    const Form_pg_attribute attribute = TupleDescAttr(desc, number - 1);
    return !attribute->attisdropped && strcmp(NameStr(attribute->attname), kNames[column]) == 0 &&
           attribute->atttypid == kTypes[column];
}

AttrNumber attnum_of(TupleDesc desc, Column column) {
    if (is_column(desc, attnums[column], column)) {
        return attnums[column];
    }
    const int found = SPI_fnumber(desc, kNames[column]);
    if (found <= 0 || !is_column(desc, static_cast<AttrNumber>(found), column)) {
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("throttle._event_check() runs on throttle.event only"),
                        errdetail("The table has no column %s of type %s.", kNames[column],
                                  format_type_be(kTypes[column]))));
    }
    attnums[column] = static_cast<AttrNumber>(found);
    return attnums[column];
}

[[noreturn]] void violated(Relation rel, const char* constraint) {
    ereport(ERROR, (errcode(ERRCODE_CHECK_VIOLATION),
                    errmsg("new row for relation \"%s\" violates check constraint \"%s\"",
                           RelationGetRelationName(rel), constraint),
                    errtableconstraint(rel, constraint)));
    pg_unreachable();
}

// The text in `column` of `row`; false when it is NULL.
bool text_of(HeapTuple row, TupleDesc desc, Column column, text** value) {
    bool is_null = true;
    const Datum datum = heap_getattr(row, attnum_of(desc, column), desc, &is_null);
    if (!is_null) {
        *value = DatumGetTextPP(datum);
    }
    return !is_null;
}

bool is_null(HeapTuple row, TupleDesc desc, Column column) {
    bool null = true;
    (void)heap_getattr(row, attnum_of(desc, column), desc, &null);
    return null;
}

bool text_is(const text* value, const char* literal) {
    const size_t length = strlen(literal);
    return VARSIZE_ANY_EXHDR(value) == length && memcmp(VARDATA_ANY(value), literal, length) == 0;
}

// `row`, or, when it is a pending event without attempts left, the row
// made dead.
HeapTuple spent_pending_dead(HeapTuple row, TupleDesc desc) {
    text* state = nullptr;
    bool attempts_null = true;
    bool max_null = true;
    const Datum attempts = heap_getattr(row, attnum_of(desc, kAttempts), desc, &attempts_null);
    const Datum max_attempts = heap_getattr(row, attnum_of(desc, kMaxAttempts), desc, &max_null);
    if (!text_of(row, desc, kState, &state) || !text_is(state, "pending") || attempts_null ||
        max_null || DatumGetInt32(attempts) < DatumGetInt32(max_attempts)) {
        return row;
    }
    int columns[4] = {attnum_of(desc, kState), attnum_of(desc, kCompletedAt),
                      attnum_of(desc, kCompletedBy), attnum_of(desc, kLastError)};
    Datum values[4] = {CStringGetTextDatum("dead"), TimestampTzGetDatum(clock_now()), 0, 0};
    bool nulls[4] = {false, false, true, false};
    values[2] = heap_getattr(row, attnum_of(desc, kClaimedBy), desc, &nulls[2]);
    bool no_error = true;
    values[3] = heap_getattr(row, columns[3], desc, &no_error);
    if (no_error) {
        values[3] =
            CStringGetTextDatum(psprintf("lease expired %d times", DatumGetInt32(attempts)));
    }
    return heap_modify_tuple_by_cols(row, desc, 4, columns, values, nulls);
}

// A pending event without a group_key, or a claim without one: its
// position goes to the queue's scan floors when the transaction commits
// (scan_floors.hpp).
void note_for_floors(HeapTuple row, TupleDesc desc) {
    text* state = nullptr;
    text* queue = nullptr;
    if (!text_of(row, desc, kState, &state) || !is_null(row, desc, kGroupKey) ||
        !text_of(row, desc, kQueue, &queue)) {
        return;
    }
    if (text_is(state, "claimed")) {
        bool lease_null = true;
        bool id_null = true;
        const Datum lease = heap_getattr(row, attnum_of(desc, kLeaseUntil), desc, &lease_null);
        const Datum id = heap_getattr(row, attnum_of(desc, kId), desc, &id_null);
        if (!lease_null && !id_null) {
            scan_floor_note_claimed(
                queue, core::QueuePosition{DatumGetTimestampTz(lease), DatumGetInt64(id)});
        }
        return;
    }
    if (!text_is(state, "pending")) {
        return;
    }
    if (is_null(row, desc, kConcurrencyKey)) {
        no_key_write_note(queue);  // for round robin between keys (no_key_writes.hpp)
    }
    bool run_at_null = true;
    bool id_null = true;
    bool priority_null = true;
    const Datum run_at = heap_getattr(row, attnum_of(desc, kRunAt), desc, &run_at_null);
    const Datum id = heap_getattr(row, attnum_of(desc, kId), desc, &id_null);
    const Datum priority = heap_getattr(row, attnum_of(desc, kPriority), desc, &priority_null);
    if (run_at_null || id_null || priority_null) {
        return;  // NOT NULL, checked after the trigger, refuses it
    }
    scan_floor_note_pending(queue, DatumGetInt32(priority),
                            core::QueuePosition{DatumGetTimestampTz(run_at), DatumGetInt64(id)});
}

// The instant a pending event falls due, or a claim's lease ends: the
// commit reports it to the database's waker when it lies ahead
// (wakeups.hpp).
void note_for_wakeups(HeapTuple row, TupleDesc desc) {
    text* state = nullptr;
    if (!text_of(row, desc, kState, &state)) {
        return;
    }
    const bool pending = text_is(state, "pending");
    if (!pending && !text_is(state, "claimed")) {
        return;
    }
    bool null = true;
    const Datum instant =
        heap_getattr(row, attnum_of(desc, pending ? kRunAt : kLeaseUntil), desc, &null);
    if (!null) {
        wakeup_note(DatumGetTimestampTz(instant));
    }
}

Datum event_check(FunctionCallInfo fcinfo) {
    if (!CALLED_AS_TRIGGER(fcinfo)) {
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("throttle._event_check() runs only as a trigger")));
    }
    auto* trigger = reinterpret_cast<TriggerData*>(fcinfo->context);
    if (!TRIGGER_FIRED_BEFORE(trigger->tg_event) || !TRIGGER_FIRED_FOR_ROW(trigger->tg_event) ||
        TRIGGER_FIRED_BY_DELETE(trigger->tg_event)) {
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("throttle._event_check() runs BEFORE INSERT OR UPDATE, per row")));
    }
    const HeapTuple row =
        TRIGGER_FIRED_BY_UPDATE(trigger->tg_event) ? trigger->tg_newtuple : trigger->tg_trigtuple;
    const Relation rel = trigger->tg_relation;
    const TupleDesc desc = RelationGetDescr(rel);

    text* value = nullptr;
    if (text_of(row, desc, kQueue, &value) &&
        (VARSIZE_ANY_EXHDR(value) == 0 || VARSIZE_ANY_EXHDR(value) > 63)) {
        violated(rel, "event_queue_check");
    }
    if (text_of(row, desc, kItemKey, &value) && VARSIZE_ANY_EXHDR(value) == 0) {
        violated(rel, "event_item_key_check");
    }
    if (text_of(row, desc, kState, &value) && !text_is(value, "pending") &&
        !text_is(value, "claimed") && !text_is(value, "dead")) {
        violated(rel, "event_state_check");
    }
    bool null = true;
    const Datum max_attempts = heap_getattr(row, attnum_of(desc, kMaxAttempts), desc, &null);
    if (!null && DatumGetInt32(max_attempts) <= 0) {
        violated(rel, "event_max_attempts_check");
    }
    if (!is_null(row, desc, kConcurrencyKey) && !is_null(row, desc, kGroupKey)) {
        violated(rel, "event_concurrency_key_ungrouped");
    }
    const HeapTuple stored = spent_pending_dead(row, desc);
    note_for_floors(stored, desc);
    note_for_wakeups(stored, desc);
    return PointerGetDatum(stored);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_event_check, pg_throttle::pg::event_check)
