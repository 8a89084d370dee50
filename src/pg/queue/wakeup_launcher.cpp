// The launcher of the wakers (wakeups.hpp): one per server, connected to no
// database. At its start (the server's start, a crash's restart, a
// promotion) it starts a waker in every database that takes connections, two
// at a time: each announces what is due there and stays while something is
// ahead. Then it starts one wherever a commit asks for it.
//
// Only trivially destructible objects live in these frames (an ERROR here
// becomes FATAL; the postmaster starts the launcher again 5 s later).
#include "pg/queue/wakeup_slots.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_database.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

namespace pg_throttle::pg {
namespace {

constexpr long kTickMs = 1000;
constexpr int kScoutsAtOnce = 2;
constexpr int64 kStartTimeout = 60 * USECS_PER_SEC;
constexpr int64 kWarnEvery = 60 * USECS_PER_SEC;
constexpr int kNoConnections = -2;  // pg_database.datconnlimit of a database half dropped

BackgroundWorkerHandle* handles[kWakeupSlots];
Oid* scouts = nullptr;  // databases to visit once, in TopMemoryContext
int scout_count = 0;
TimestampTz warned_at = 0;

void release_launcher(int /*code*/, Datum /*arg*/) {
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    if (wakeups_shared()->launcher_latch == MyLatch) {
        wakeups_shared()->launcher_latch = nullptr;
    }
    LWLockRelease(wakeups_lock());
}

// Every database that takes connections and is no template.
void list_databases() {
    if (scouts != nullptr) {
        pfree(scouts);
    }
    scout_count = 0;
    int room = 64;
    scouts = static_cast<Oid*>(MemoryContextAlloc(TopMemoryContext, room * sizeof(Oid)));
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    PushActiveSnapshot(GetTransactionSnapshot());
    Relation rel = table_open(DatabaseRelationId, AccessShareLock);
    TableScanDesc scan = table_beginscan_catalog(rel, 0, nullptr);
    HeapTuple tuple = nullptr;
    while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
        const auto* db = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
        if (!db->datallowconn || db->datistemplate || db->datconnlimit == kNoConnections) {
            continue;
        }
        if (scout_count == room) {
            room *= 2;
            scouts = static_cast<Oid*>(repalloc(scouts, room * sizeof(Oid)));
        }
        scouts[scout_count++] = db->oid;
    }
    table_endscan(scan);
    table_close(rel, AccessShareLock);
    PopActiveSnapshot();
    CommitTransactionCommand();
}

// Under the lock: the scouts that fit become wanted.
void want_scouts() {
    int starting = 0;
    for (const WakeupSlot& slot : wakeups_shared()->slots) {
        starting += slot.starting ? 1 : 0;
    }
    while (scout_count > 0 && starting < kScoutsAtOnce) {
        const Oid database = scouts[--scout_count];
        const int index = wakeup_slot_take(database);
        if (index < 0) {
            return;  // every slot busy: later
        }
        WakeupSlot& slot = wakeups_shared()->slots[index];
        if (!slot.running && !slot.starting && !slot.absent) {
            slot.wanted = true;
            starting++;
        }
    }
}

bool start_waker(int index, Oid database) {
    BackgroundWorker worker{};
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
    worker.bgw_restart_time = BGW_NEVER_RESTART;
    strlcpy(worker.bgw_library_name, "pg_throttle", BGW_MAXLEN);
    strlcpy(worker.bgw_function_name, "pg_throttle_waker_main", BGW_MAXLEN);
    snprintf(worker.bgw_name, BGW_MAXLEN, "pg_throttle waker %u", database);
    strlcpy(worker.bgw_type, "pg_throttle waker", BGW_MAXLEN);
    worker.bgw_main_arg = Int32GetDatum(index);
    memcpy(worker.bgw_extra, &database, sizeof database);
    worker.bgw_notify_pid = MyProcPid;
    if (handles[index] != nullptr) {
        pfree(handles[index]);
        handles[index] = nullptr;
    }
    return RegisterDynamicBackgroundWorker(&worker, &handles[index]);
}

bool stopped(int index) {
    pid_t pid = 0;
    return handles[index] == nullptr ||
           GetBackgroundWorkerPid(handles[index], &pid) == BGWH_STOPPED;
}

// Whether `database` still exists (a waker that could not connect: a
// database dropped meanwhile frees its slot).
bool database_exists(Oid database) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    const bool exists = SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(database));
    CommitTransactionCommand();
    return exists;
}

// One round: wakers that failed to attach are tried again after a back-off
// (their slot freed when the database is gone); a slot whose plan comes
// within kStartAhead is wanted; the wanted ones are started.
void start_wanted() {
    const TimestampTz now = GetCurrentTimestamp();
    Oid to_start[kWakeupSlots];
    Oid failed[kWakeupSlots];
    bool gone[kWakeupSlots];  // looked up before the lock: it takes another
    for (int i = 0; i < kWakeupSlots; i++) {
        gone[i] = stopped(i);
    }
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    want_scouts();
    for (int i = 0; i < kWakeupSlots; i++) {
        WakeupSlot& slot = wakeups_shared()->slots[i];
        to_start[i] = InvalidOid;
        failed[i] = InvalidOid;
        if (slot.starting && !slot.running && (now - slot.started_at > kStartTimeout || gone[i])) {
            slot.starting = false;  // it could not connect: again after a back-off
            slot.wanted = true;
            wakeup_slot_failed(&slot, now);
            failed[i] = slot.dbid;
        }
        const TimestampTz planned = instant_of(pg_atomic_read_u64(&slot.planned));
        if (slot.dbid != InvalidOid && !slot.running && !slot.starting && planned != DT_NOEND &&
            planned - kStartAhead <= now) {
            slot.wanted = true;
        }
        if (slot.dbid != InvalidOid && slot.wanted && !slot.running && !slot.starting &&
            !slot.absent && slot.held_until <= now && slot.restart_at <= now) {
            slot.starting = true;
            slot.started_at = now;
            to_start[i] = slot.dbid;
        }
    }
    LWLockRelease(wakeups_lock());
    for (int i = 0; i < kWakeupSlots; i++) {
        if (failed[i] != InvalidOid && !database_exists(failed[i])) {
            LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
            WakeupSlot& slot = wakeups_shared()->slots[i];
            if (slot.dbid == failed[i] && !slot.running && !slot.starting) {
                slot.wanted = false;
                pg_atomic_write_u64(&slot.hinted, kNothingAhead);
                pg_atomic_write_u64(&slot.planned, kNothingAhead);
                slot.dbid = InvalidOid;
            }
            LWLockRelease(wakeups_lock());
        }
    }
    for (int i = 0; i < kWakeupSlots; i++) {
        if (to_start[i] == InvalidOid || start_waker(i, to_start[i])) {
            continue;
        }
        LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
        WakeupSlot& slot = wakeups_shared()->slots[i];
        if (slot.dbid == to_start[i]) {
            slot.starting = false;  // still wanted: tried again after a back-off
            wakeup_slot_failed(&slot, now);
        }
        LWLockRelease(wakeups_lock());
        if (now - warned_at >= kWarnEvery) {
            warned_at = now;
            ereport(WARNING,
                    (errmsg("pg_throttle could not start a waker for database %u", to_start[i]),
                     errhint("Raise max_worker_processes: pg_throttle needs one for each "
                             "database with events ahead, besides its launcher and "
                             "checkpointer.")));
        }
    }
}

}  // namespace
}  // namespace pg_throttle::pg

void pg_throttle_wakeup_launcher_main(Datum /*arg*/) {
    using namespace pg_throttle::pg;
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
    BackgroundWorkerUnblockSignals();
    BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
    LWLockAcquire(wakeups_lock(), LW_EXCLUSIVE);
    wakeups_shared()->launcher_latch = MyLatch;
    LWLockRelease(wakeups_lock());
    before_shmem_exit(release_launcher, 0);
    bool enabled = wakeups_enabled();
    if (enabled) {
        list_databases();
    }
    for (;;) {
        ResetLatch(MyLatch);
        if (ShutdownRequestPending != 0) {
            // 1, not 0: a static worker that exits with 0 is never started
            // again (the postmaster's own shutdown stops it for good anyway).
            proc_exit(1);
        }
        if (ConfigReloadPending != 0) {
            ConfigReloadPending = 0;
            ProcessConfigFile(PGC_SIGHUP);
            if (wakeups_enabled() && !enabled) {
                list_databases();  // turned on: every database is visited again
            }
            enabled = wakeups_enabled();
        }
        if (enabled) {
            start_wanted();
        }
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, kTickMs,
                        PG_WAIT_EXTENSION);
        CHECK_FOR_INTERRUPTS();  // a ProcSignalBarrier (DROP DATABASE waits for each process)
    }
}
