// The waker of one database (wakeups.hpp): sleeps until the next instant
// something falls due, then NOTIFYs what did, through
// throttle._announce_due(after, upto), in a transaction of its own.
//
// Only trivially destructible objects live in these frames: an ERROR here
// becomes FATAL (a background worker has no handler to return to) and the
// process exits; the launcher starts another a second later, whose first
// pass announces everything due.
#include "pg/queue/wakeup_slots.hpp"

extern "C" {
#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "commands/extension.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "tcop/tcopprot.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

namespace pg_throttle::pg {
namespace {

// A pass at least this often, whatever the plan: a write the trigger did
// not report (wakeups.hpp) waits no longer.
constexpr int64 kFullPassEvery = 60 * USECS_PER_SEC;
// Nothing ahead for this long: the waker exits, and a commit that writes an
// instant asks the launcher for another.
constexpr int64 kIdleExitAfter = 10 * USECS_PER_SEC;
// The next instant further than this: the waker exits, and the launcher
// starts one kStartAhead before it (a worker slot is not held for a day).
constexpr int64 kExitIfFurther = 60 * USECS_PER_SEC;

// What a pass answers besides the next instant.
// _announce_due gave way to a lock: it returns '-infinity'.
constexpr TimestampTz kGaveWay = DT_NOBEGIN;
// No pg_throttle with wake-ups here: below every timestamptz SQL can return.
constexpr TimestampTz kAbsent = DT_NOBEGIN + 2;

int slot_index = -1;

WakeupSlot& my_slot() {
    return wakeups_shared()->slots[slot_index];
}

// Takes the slot; false when it is not this database's any more, or held.
// `covered`: where the last waker of the slot left off.
bool attach(Oid database, TimestampTz* covered) {
    bool attached = false;
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    WakeupSlot& slot = my_slot();
    if (slot.dbid == database) {
        slot.starting = false;
        if (!slot.running && slot.held_until <= GetCurrentTimestamp()) {
            slot.running = true;
            slot.wanted = false;  // this waker's first pass covers what was wanted
            slot.pid = MyProcPid;
            slot.latch = MyLatch;
            *covered = slot.covered;
            attached = true;
        }
    }
    LWLockRelease(wakeups_lock());
    return attached;
}

// At exit, however it comes. A waker that failed is wanted again after a
// back-off; one sent away (a hold) when its plan comes; one that left idle
// never, until a commit asks.
void detach(int code, Datum /*arg*/) {
    Latch* launcher = nullptr;
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    WakeupSlot& slot = my_slot();
    if (slot.running && slot.pid == MyProcPid) {
        slot.running = false;
        slot.pid = 0;
        slot.latch = nullptr;
        if (pg_atomic_read_u64(&slot.hinted) != kNothingAhead) {
            slot.wanted = true;  // a commit asked meanwhile
        }
        if (code != 0 && !slot.absent) {
            slot.wanted = true;
            wakeup_slot_failed(&slot, GetCurrentTimestamp());
        }
        if (slot.absent) {
            pg_atomic_write_u64(&slot.planned, kNothingAhead);
        }
        launcher = wakeups_shared()->launcher_latch;
    }
    LWLockRelease(wakeups_lock());
    if (launcher != nullptr) {
        SetLatch(launcher);
    }
}

// Leaves when nothing was hinted since the last pass, the slot keeping its
// plan (the launcher starts a waker by then) and where this one left off;
// false when a hint came.
bool exit_if_quiet(TimestampTz covered) {
    bool leave = false;
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    WakeupSlot& slot = my_slot();
    if (pg_atomic_read_u64(&slot.hinted) == kNothingAhead) {
        slot.running = false;
        slot.pid = 0;
        slot.latch = nullptr;
        slot.covered = covered;
        leave = true;
    }
    LWLockRelease(wakeups_lock());
    return leave;
}

void passed(TimestampTz covered) {
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    my_slot().covered = covered;
    my_slot().failures = 0;
    LWLockRelease(wakeups_lock());
}

void mark_absent() {
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    my_slot().absent = true;
    LWLockRelease(wakeups_lock());
}

// pg_throttle's own throttle._announce_due(timestamptz, timestamptz): the
// function of that name in schema throttle that is a member of extension
// pg_throttle, found by the catalogs and never by a search path (a
// database's owner sets the settings this superuser process starts with);
// InvalidOid when there is none.
Oid announce_function() {
    const Oid extension = get_extension_oid("pg_throttle", true);
    const Oid schema = get_namespace_oid("throttle", true);
    if (extension == InvalidOid || schema == InvalidOid) {
        return InvalidOid;
    }
    Oid types[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
    oidvector* args = buildoidvector(types, 2);
    HeapTuple tuple = SearchSysCache3(PROCNAMEARGSNSP, CStringGetDatum("_announce_due"),
                                      PointerGetDatum(args), ObjectIdGetDatum(schema));
    if (!HeapTupleIsValid(tuple)) {
        return InvalidOid;
    }
    const Oid function = reinterpret_cast<Form_pg_proc>(GETSTRUCT(tuple))->oid;
    ReleaseSysCache(tuple);
    return getExtensionOfObject(ProcedureRelationId, function) == extension ? function : InvalidOid;
}

// One pass: NOTIFYs what fell due in (after, upto]; answers the next instant
// something falls due (DT_NOEND: nothing ahead), kGaveWay or kAbsent.
TimestampTz pass(TimestampTz after, TimestampTz upto) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, "throttle._announce_due");
    TimestampTz next = kAbsent;
    const Oid function = announce_function();
    if (function != InvalidOid) {
        FmgrInfo flinfo;
        fmgr_info(function, &flinfo);
        LOCAL_FCINFO(call, 2);
        InitFunctionCallInfoData(*call, &flinfo, 2, InvalidOid, nullptr, nullptr);
        call->args[0].value = TimestampTzGetDatum(after);
        call->args[0].isnull = false;
        call->args[1].value = TimestampTzGetDatum(upto);
        call->args[1].isnull = false;
        const Datum value = FunctionCallInvoke(call);
        next = call->isnull ? DT_NOEND : DatumGetTimestampTz(value);
    }
    PopActiveSnapshot();
    CommitTransactionCommand();
    pgstat_report_activity(STATE_IDLE, nullptr);
    pgstat_report_stat(false);
    return next;
}

long sleep_ms(TimestampTz now, TimestampTz until) {
    const TimestampTz wake = std::min(until, now + kFullPassEvery);
    // Rounded up: never woken before the instant.
    return std::max(1L, static_cast<long>((wake - now + 999) / 1000));
}

}  // namespace
}  // namespace pg_throttle::pg

void pg_throttle_waker_main(Datum slot) {
    using namespace pg_throttle::pg;
    slot_index = DatumGetInt32(slot);
    Oid database = InvalidOid;
    memcpy(&database, MyBgworkerEntry->bgw_extra, sizeof database);
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    // die: a pass in progress ends at its next CHECK_FOR_INTERRUPTS (a DROP
    // DATABASE waits for this process). Only trivially destructible objects
    // live in these frames.
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    if (slot_index < 0 || slot_index >= kWakeupSlots || wakeups_shared() == nullptr) {
        proc_exit(1);
    }
    BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, 0);
    TimestampTz after = DT_NOBEGIN;
    if (!attach(database, &after)) {
        proc_exit(0);
    }
    before_shmem_exit(detach, 0);
    // This process is a superuser with the database's settings: none of them
    // decides what it runs (the function is found by its oid, and runs with
    // its own search_path) or how long it waits.
    SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
    // Its NOTIFYs need no durable commit: a pass lost in a crash is done
    // again by the first pass after it.
    SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
    // Shorter than deadlock_timeout: a pass gives way to DDL (throttle._announce_due).
    SetConfigOption("lock_timeout", "100ms", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("idle_in_transaction_session_timeout", "0", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("default_transaction_read_only", "off", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("default_transaction_isolation", "read committed", PGC_SUSET, PGC_S_OVERRIDE);

    WakeupSlot& mine = my_slot();
    TimestampTz idle_since = GetCurrentTimestamp();
    for (;;) {
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending != 0) {
            ConfigReloadPending = 0;
            ProcessConfigFile(PGC_SIGHUP);
            if (!wakeups_enabled()) {
                pg_atomic_write_u64(&mine.planned, kNothingAhead);
                proc_exit(0);
            }
        }
        const TimestampTz hinted = instant_of(pg_atomic_exchange_u64(&mine.hinted, kNothingAhead));
        if (hinted <= after) {
            after = hinted - 1;  // committed after a pass that ran past it
        }
        const TimestampTz upto = GetCurrentTimestamp();
        TimestampTz next = pass(after, upto);
        if (next == kAbsent) {
            // No pg_throttle with wake-ups here (an older version, or none):
            // _waker_start() of its update asks again.
            mark_absent();
            pg_atomic_write_u64(&mine.planned, kNothingAhead);
            proc_exit(0);
        }
        if (next == kGaveWay) {
            next = upto + USECS_PER_SEC;  // (after, upto] again a second later
        } else {
            after = upto;
            passed(after);
        }
        pg_atomic_write_u64(&mine.planned, bits_of(next));
        pg_memory_barrier();  // the plan before the hint: see wakeups.hpp
        if (pg_atomic_read_u64(&mine.hinted) != kNothingAhead) {
            continue;
        }
        const TimestampTz now = GetCurrentTimestamp();
        if (next != DT_NOEND) {
            idle_since = now;
            if (next - now > kExitIfFurther && exit_if_quiet(after)) {
                proc_exit(0);  // the launcher starts one kStartAhead before `next`
            }
        } else if (now - idle_since >= kIdleExitAfter && exit_if_quiet(after)) {
            proc_exit(0);
        }
        const TimestampTz until = next != DT_NOEND ? next : idle_since + kIdleExitAfter;
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                        sleep_ms(now, until), PG_WAIT_EXTENSION);
    }
}
