// The wake-ups' shared slots, the notes a transaction's writes leave until
// its commit, and the holds of the utility hook; see wakeups.hpp.
#include "pg/queue/wakeups.hpp"

#include "pg/queue/wakeup_slots.hpp"

extern "C" {
#include "postmaster/bgworker.h"
}

#include <csignal>

namespace pg_throttle::pg {
namespace {

constexpr const char* kTrancheName = "pg_throttle wakeups";
constexpr int64 kHoldFor = 30 * USECS_PER_SEC;

bool wakeups_on = true;  // pg_throttle.wakeups
WakeupsShared* shared = nullptr;
LWLock* lock = nullptr;

// The lowest instant this transaction wrote after its statements' starts.
TimestampTz noted = PG_INT64_MAX;
// throttle._waker_start() ran in this transaction.
bool want_at_commit = false;
bool callback_registered = false;
int cached_slot = -1;

void init_slot(WakeupSlot* slot, Oid database) {
    slot->dbid = database;
    slot->wanted = false;
    slot->starting = false;
    slot->running = false;
    slot->absent = false;
    slot->held_until = 0;
    slot->started_at = 0;
    slot->restart_at = 0;
    slot->covered = DT_NOBEGIN;
    slot->failures = 0;
    slot->pid = 0;
    slot->latch = nullptr;
    pg_atomic_write_u64(&slot->hinted, kNothingAhead);
    pg_atomic_write_u64(&slot->planned, kNothingAhead);
}

// A slot that holds nothing to keep: no waker, none wanted or planned.
bool idle(WakeupSlot& slot, TimestampTz now) {
    return !slot.wanted && !slot.starting && !slot.running && slot.held_until <= now &&
           pg_atomic_read_u64(&slot.hinted) == kNothingAhead &&
           pg_atomic_read_u64(&slot.planned) == kNothingAhead;
}

}  // namespace

int wakeup_slot_take(Oid database) {
    const int found = wakeup_slot_find(database);
    if (found >= 0) {
        return found;
    }
    const TimestampTz now = GetCurrentTimestamp();
    int taken = -1;
    for (int i = 0; i < kWakeupSlots && taken < 0; i++) {
        if (shared->slots[i].dbid == InvalidOid) {
            taken = i;
        }
    }
    for (int i = 0; i < kWakeupSlots && taken < 0; i++) {
        if (idle(shared->slots[i], now)) {
            taken = i;
        }
    }
    if (taken >= 0) {
        init_slot(&shared->slots[taken], database);
    }
    return taken;
}

namespace {

// After this database's commit wrote `instant`: lowers its slot's hint and
// wakes its waker, or asks the launcher for one, when the waker would sleep
// past it. Nothing here raises: the commit has happened.
void report(TimestampTz instant) {
    int index = cached_slot;
    if (index < 0 || shared->slots[index].dbid != MyDatabaseId) {
        LWLockAcquire(lock, LW_EXCLUSIVE);
        index = wakeup_slot_take(MyDatabaseId);
        LWLockRelease(lock);
        if (index < 0) {
            return;  // more databases with something ahead than slots
        }
        cached_slot = index;
    }
    WakeupSlot& slot = shared->slots[index];
    if (!lower_instant(&slot.hinted, instant)) {
        return;  // an earlier instant is reported already, and its waking done
    }
    pg_memory_barrier();  // the hint before the plan: see wakeups.hpp
    if (instant >= instant_of(pg_atomic_read_u64(&slot.planned))) {
        return;
    }
    Latch* latch = nullptr;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    if (slot.dbid != MyDatabaseId) {
        // The slot went to another database meanwhile (it was idle).
        index = wakeup_slot_take(MyDatabaseId);
        cached_slot = index;
        if (index >= 0) {
            (void)lower_instant(&shared->slots[index].hinted, instant);
        }
    }
    if (index >= 0 && !shared->slots[index].absent) {
        WakeupSlot& mine = shared->slots[index];
        if (mine.running) {
            latch = mine.latch;
        } else {
            mine.wanted = true;
            latch = shared->launcher_latch;
        }
    }
    LWLockRelease(lock);
    if (latch != nullptr) {
        SetLatch(latch);
    }
}

void want(Oid database) {
    Latch* latch = nullptr;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    const int index = wakeup_slot_take(database);
    if (index >= 0) {
        WakeupSlot& slot = shared->slots[index];
        slot.absent = false;
        if (!slot.running) {
            slot.wanted = true;
            latch = shared->launcher_latch;
        } else {
            latch = slot.latch;  // it passes again: a full pass
        }
    }
    LWLockRelease(lock);
    if (latch != nullptr) {
        SetLatch(latch);
    }
}

void on_transaction(XactEvent event, void* /*arg*/) {
    switch (event) {
        case XACT_EVENT_COMMIT:
        case XACT_EVENT_PARALLEL_COMMIT:
        case XACT_EVENT_PREPARE:
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PARALLEL_ABORT:
            // At PREPARE the rows are not visible yet, and the commit comes
            // elsewhere: the waker's full pass finds them.
            if (event == XACT_EVENT_COMMIT && shared != nullptr && wakeups_on) {
                if (want_at_commit) {
                    want(MyDatabaseId);
                }
                if (noted != PG_INT64_MAX) {
                    report(noted);
                }
            }
            noted = PG_INT64_MAX;
            want_at_commit = false;
            break;
        case XACT_EVENT_PRE_COMMIT:
        case XACT_EVENT_PARALLEL_PRE_COMMIT:
        case XACT_EVENT_PRE_PREPARE:
            break;
    }
}

void register_callback() {
    if (!callback_registered) {
        RegisterXactCallback(on_transaction, nullptr);
        callback_registered = true;
    }
}

}  // namespace

WakeupsShared* wakeups_shared() {
    return shared;
}

LWLock* wakeups_lock() {
    return lock;
}

bool wakeups_enabled() {
    return wakeups_on;
}

bool lower_instant(pg_atomic_uint64* cell, TimestampTz instant) {
    uint64 seen = pg_atomic_read_u64(cell);
    while (instant < instant_of(seen)) {
        if (pg_atomic_compare_exchange_u64(cell, &seen, bits_of(instant))) {
            return true;
        }
    }
    return false;
}

void wakeup_slot_failed(WakeupSlot* slot, TimestampTz now) {
    slot->failures = std::min(slot->failures + 1, 7);
    slot->restart_at = now + std::min<int64>(60, int64{1} << (slot->failures - 1)) * USECS_PER_SEC;
}

int wakeup_slot_find(Oid database) {
    for (int i = 0; i < kWakeupSlots; i++) {
        if (shared->slots[i].dbid == database) {
            return i;
        }
    }
    return -1;
}

void wakeups_define_guc() {
    DefineCustomBoolVariable(
        "pg_throttle.wakeups",
        "NOTIFYs a queue's channel when an event falls due later than it was written.",
        "A background worker per database with something ahead sends them; off, workers "
        "find such events by polling only.",
        &wakeups_on, true, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
}

void wakeups_request_shmem() {
    RequestAddinShmemSpace(MAXALIGN(sizeof(WakeupsShared)));
    RequestNamedLWLockTranche(kTrancheName, 1);
}

void wakeups_attach_shmem() {
    bool found = false;
    shared = static_cast<WakeupsShared*>(
        ShmemInitStruct("pg_throttle wakeups", sizeof(WakeupsShared), &found));
    if (!found) {
        shared->launcher_latch = nullptr;
        for (WakeupSlot& slot : shared->slots) {
            pg_atomic_init_u64(&slot.hinted, kNothingAhead);
            pg_atomic_init_u64(&slot.planned, kNothingAhead);
            init_slot(&slot, InvalidOid);
        }
    }
    lock = &GetNamedLWLockTranche(kTrancheName)[0].lock;
}

void wakeups_register_launcher() {
    BackgroundWorker worker{};
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
    worker.bgw_restart_time = 5;
    strlcpy(worker.bgw_library_name, "pg_throttle", BGW_MAXLEN);
    strlcpy(worker.bgw_function_name, "pg_throttle_wakeup_launcher_main", BGW_MAXLEN);
    strlcpy(worker.bgw_name, "pg_throttle wakeup launcher", BGW_MAXLEN);
    strlcpy(worker.bgw_type, "pg_throttle wakeup launcher", BGW_MAXLEN);
    RegisterBackgroundWorker(&worker);
}

void wakeup_note(TimestampTz instant) {
    if (shared == nullptr || !wakeups_on || instant >= noted ||
        instant <= GetCurrentStatementStartTimestamp()) {
        return;
    }
    noted = instant;
    register_callback();
}

void wakeups_pass_from_the_start() {
    if (shared != nullptr && wakeups_on) {
        report(kFromTheStart);
    }
}

void wakeups_want_copy(Oid from, Oid to) {
    if (shared != nullptr && wakeups_on && from != InvalidOid && to != InvalidOid) {
        LWLockAcquire(lock, LW_SHARED);
        const bool known = wakeup_slot_find(from) >= 0;
        LWLockRelease(lock);
        if (known) {
            want(to);
        }
    }
}

void wakeups_want_here() {
    if (shared != nullptr) {
        want_at_commit = true;
        register_callback();
    }
}

void wakeups_hold(Oid database) {
    if (shared == nullptr || database == InvalidOid) {
        return;
    }
    int pid = 0;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    const int index = wakeup_slot_find(database);
    if (index >= 0) {
        WakeupSlot& slot = shared->slots[index];
        slot.held_until = GetCurrentTimestamp() + kHoldFor;
        if (slot.running || slot.starting) {
            slot.wanted = true;  // again once the hold ends, unless dropped
        }
        pid = slot.running ? slot.pid : 0;
    }
    LWLockRelease(lock);
    if (pid == 0) {
        return;
    }
    (void)kill(pid, SIGTERM);
    // Until it has gone (at most 5 s): the statement counts the database's
    // other processes, and WITH (FORCE) would try to end this one itself,
    // which a database's owner may not.
    for (int waited = 0; waited < 500; waited++) {
        LWLockAcquire(lock, LW_SHARED);
        const bool gone = !shared->slots[index].running || shared->slots[index].pid != pid;
        LWLockRelease(lock);
        if (gone) {
            break;
        }
        CHECK_FOR_INTERRUPTS();
        pg_usleep(10000);
    }
}

void wakeups_release(Oid database, bool dropped) {
    if (shared == nullptr || database == InvalidOid) {
        return;
    }
    LWLockAcquire(lock, LW_EXCLUSIVE);
    const int index = wakeup_slot_find(database);
    if (index >= 0) {
        WakeupSlot& slot = shared->slots[index];
        if (dropped && !slot.running && !slot.starting) {
            init_slot(&slot, InvalidOid);
        } else {
            slot.held_until = 0;
            slot.wanted = slot.wanted && !dropped;
        }
    }
    Latch* latch = shared->launcher_latch;
    LWLockRelease(lock);
    if (latch != nullptr) {
        SetLatch(latch);
    }
}

}  // namespace pg_throttle::pg
