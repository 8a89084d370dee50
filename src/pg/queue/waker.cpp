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
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "tcop/tcopprot.h"
#include "utils/snapmgr.h"
}

namespace pg_throttle::pg {
namespace {

// A pass at least this often, whatever the plan: a write the trigger did
// not report (wakeups.hpp) waits no longer.
constexpr int64 kFullPassEvery = 60 * USECS_PER_SEC;
// Nothing ahead for this long: the waker exits, and a commit that writes an
// instant asks the launcher for another.
constexpr int64 kIdleExitAfter = 10 * USECS_PER_SEC;

constexpr const char* kFindFunction =
    "SELECT to_regprocedure('throttle._announce_due(timestamptz, timestamptz)') IS NOT NULL";
constexpr const char* kAnnounce = "SELECT throttle._announce_due($1, $2)";

int slot_index = -1;

WakeupSlot& my_slot() {
    return wakeups_shared()->slots[slot_index];
}

// Takes the slot; false when it is not this database's any more, or held.
bool attach(Oid database) {
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
            attached = true;
        }
    }
    LWLockRelease(wakeups_lock());
    return attached;
}

// At exit, however it comes: another waker is wanted when something was
// ahead, or when this one failed (the launcher waits a second).
void detach(int code, Datum /*arg*/) {
    Latch* launcher = nullptr;
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    WakeupSlot& slot = my_slot();
    if (slot.running && slot.pid == MyProcPid) {
        slot.running = false;
        slot.pid = 0;
        slot.latch = nullptr;
        const bool ahead = pg_atomic_read_u64(&slot.hinted) != kNothingAhead ||
                           pg_atomic_read_u64(&slot.planned) != kNothingAhead;
        if (!slot.absent && (ahead || code != 0)) {
            slot.wanted = true;
            slot.restart_at = GetCurrentTimestamp() + (code != 0 ? USECS_PER_SEC : 0);
        }
        launcher = wakeups_shared()->launcher_latch;
    }
    LWLockRelease(wakeups_lock());
    if (launcher != nullptr) {
        SetLatch(launcher);
    }
}

// Exits when nothing was hinted since the last pass; false otherwise.
bool exit_if_idle() {
    bool leave = false;
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    WakeupSlot& slot = my_slot();
    if (pg_atomic_read_u64(&slot.hinted) == kNothingAhead) {
        slot.running = false;
        slot.pid = 0;
        slot.latch = nullptr;
        leave = true;
    }
    LWLockRelease(wakeups_lock());
    return leave;
}

void mark_absent() {
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    my_slot().absent = true;
    LWLockRelease(wakeups_lock());
}

// One pass: NOTIFYs what fell due in (after, upto]; the next instant
// something falls due (DT_NOEND: nothing ahead), or DT_NOBEGIN when this
// database has no throttle._announce_due.
TimestampTz pass(TimestampTz after, TimestampTz upto, bool check_function) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, kAnnounce);
    TimestampTz next = DT_NOEND;
    bool found = true;
    if (check_function) {
        if (SPI_execute(kFindFunction, true, 1) != SPI_OK_SELECT || SPI_processed != 1) {
            elog(ERROR, "pg_throttle waker: the look-up of throttle._announce_due failed");
        }
        bool is_null = true;
        found =
            DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
    }
    if (found) {
        Oid types[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
        Datum values[2] = {TimestampTzGetDatum(after), TimestampTzGetDatum(upto)};
        if (SPI_execute_with_args(kAnnounce, 2, types, values, nullptr, false, 1) !=
                SPI_OK_SELECT ||
            SPI_processed != 1) {
            elog(ERROR, "pg_throttle waker: throttle._announce_due failed");
        }
        bool is_null = true;
        const Datum value =
            SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null);
        next = is_null ? DT_NOEND : DatumGetTimestampTz(value);
    } else {
        next = DT_NOBEGIN;
    }
    SPI_finish();
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
    pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
    BackgroundWorkerUnblockSignals();
    if (slot_index < 0 || slot_index >= kWakeupSlots || wakeups_shared() == nullptr) {
        proc_exit(1);
    }
    BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, 0);
    if (!attach(database)) {
        proc_exit(0);
    }
    before_shmem_exit(detach, 0);
    // Its NOTIFYs need no durable commit: a pass lost in a crash is done
    // again by the first pass after it.
    SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("statement_timeout", "10s", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("lock_timeout", "5s", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("idle_in_transaction_session_timeout", "0", PGC_SUSET, PGC_S_OVERRIDE);

    WakeupSlot& mine = my_slot();
    TimestampTz after = DT_NOBEGIN;  // the first pass announces everything due
    TimestampTz idle_since = GetCurrentTimestamp();
    bool first = true;
    for (;;) {
        ResetLatch(MyLatch);
        if (ShutdownRequestPending != 0) {
            proc_exit(0);
        }
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
        const TimestampTz next = pass(after, upto, first);
        if (next == DT_NOBEGIN) {
            mark_absent();  // an older pg_throttle here: _waker_start() of its update calls again
            pg_atomic_write_u64(&mine.planned, kNothingAhead);
            proc_exit(0);
        }
        first = false;
        after = upto;
        pg_atomic_write_u64(&mine.planned, bits_of(next));
        pg_memory_barrier();  // the plan before the hint: see wakeups.hpp
        if (pg_atomic_read_u64(&mine.hinted) != kNothingAhead) {
            continue;
        }
        const TimestampTz now = GetCurrentTimestamp();
        if (next != DT_NOEND) {
            idle_since = now;
        } else if (now - idle_since >= kIdleExitAfter && exit_if_idle()) {
            proc_exit(0);
        }
        const TimestampTz until = next != DT_NOEND ? next : idle_since + kIdleExitAfter;
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                        sleep_ms(now, until), PG_WAIT_EXTENSION);
        CHECK_FOR_INTERRUPTS();
    }
}
