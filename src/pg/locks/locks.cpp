#include "pg/locks/locks.hpp"

// lease_journal.hpp brings in src/core: before any PostgreSQL header.
#include "pg/durability/lease_journal.hpp"

#include "pg/server/waiting.hpp"
#include "pg/server/clock.hpp"
#include "pg/durability/fence.hpp"
#include "pg/durability/sync_standbys.hpp"
#include "pg/locks/lock_waiters.hpp"
#include "pg/scale_out/placement.hpp"

extern "C" {
#include "access/xlog.h"
#include "utils/acl.h"
}

namespace pg_throttle::pg {
namespace {

// The clock a lock kind expires by. throttle.lock's leases are shared by
// every session and survive crashes: the real clock, always. A queue group's
// lease follows the queue's time, throttle.now(), like the claimed rows'
// lease_until, which are the durable truth it stands for.
core::Micros now_for(const RegistryKey& key) {
    return static_cast<EntryKind>(key.kind) == EntryKind::kQueueGroup ? clock_now() : real_now();
}

bool exit_callback_registered = false;

// The session locks this backend took or queued for: their keys, in its own
// memory, so that at exit and at DISCARD ALL it releases those it still
// holds without looking through the registry, and without allocating then.
// A session holds few: a list searched from its newest key (the one an
// unlock most often names) costs a lock and unlock pair a few dozen
// instructions, where a hash table cost 650.
struct SessionLockKeys {
    RegistryKey* keys;  // in TopMemoryContext
    int count;
    int capacity;
};
SessionLockKeys session_locks{nullptr, 0, 0};

int find_session_lock(const RegistryKey& key) {
    for (int i = session_locks.count - 1; i >= 0; --i) {
        if (registry_key_compare(&session_locks.keys[i], &key, sizeof key) == 0) {
            return i;
        }
    }
    return -1;
}

void remember_session_lock(const RegistryKey& key) {
    if (find_session_lock(key) >= 0) {
        return;
    }
    if (session_locks.count == session_locks.capacity) {
        const int capacity = session_locks.capacity == 0 ? 8 : session_locks.capacity * 2;
        const size_t size = sizeof(RegistryKey) * static_cast<size_t>(capacity);
        session_locks.keys = static_cast<RegistryKey*>(
            session_locks.keys == nullptr ? MemoryContextAlloc(TopMemoryContext, size)
                                          : repalloc(session_locks.keys, size));
        session_locks.capacity = capacity;
    }
    session_locks.keys[session_locks.count++] = key;
}

void forget_session_lock(const RegistryKey& key) {
    const int i = find_session_lock(key);
    if (i >= 0) {
        session_locks.keys[i] = session_locks.keys[--session_locks.count];
    }
}

bool held(const RegistryEntry& entry, core::Micros now) {
    return entry.of.lock.token != 0 && now < entry.expires_at;
}

bool own_session_lock(const RegistryEntry& entry) {
    return entry.of.lock.session && entry.holder_pid == MyProcPid;
}

// Whether the grant in force is a lease the journal knows.
bool journaled_grant(const RegistryEntry& entry) {
    return entry.of.lock.token != 0 && lease_is_journaled(entry);
}

void grant(RegistryEntry* entry, core::Micros now, int64 token, int64 ttl, int32 pid,
           const char* holder, Oid role) {
    entry->owner = role;  // the registry moves the entry's count along
    entry->of.lock.token = token;
    entry->of.lock.seq = lease_next_seq();
    entry->of.lock.session = ttl == 0;
    entry->granted_at = now;
    entry->expires_at = ttl == 0 ? core::kNever : core::saturating_add(now, ttl);
    entry->holder_pid = pid;
    strlcpy(entry->holder, holder, sizeof entry->holder);
    __atomic_fetch_add(&entry->grants, 1, __ATOMIC_RELAXED);
}

void set_free(RegistryEntry* entry) {
    entry->of.lock.token = 0;
    entry->of.lock.seq = lease_next_seq();
    entry->of.lock.session = false;
    entry->expires_at = kLongExpired;
}

// Gives `entry` to its earliest waiter, or frees it. The caller holds the
// entry's partition lock exclusively and not the waiters lock. When the
// durable block of fence tokens is used up, the lock is freed and the
// earliest waiter woken to take it over itself once it has reserved more.
void hand_over(RegistryEntry* entry, core::Micros now) {
    if (entry->of.lock.waiters > 0) {
        LWLockAcquire(registry_waiters_lock(), LW_EXCLUSIVE);
        WaiterSlot* next = waiter_earliest(*entry);
        if (next != nullptr) {
            const int64 token = fence_next();
            if (token != 0) {
                waiter_dequeue(entry, next);
                grant(entry, now, token, next->ttl, next->pid, next->holder, next->role);
                next->granted_token = token;
                next->granted_seq = entry->of.lock.seq;
                next->granted_at = now;
            } else {
                set_free(entry);
            }
            SetLatch(&ProcGlobal->allProcs[next->pgprocno].procLatch);
            LWLockRelease(registry_waiters_lock());
            return;
        }
        // Unreachable: the count is changed only with the slots it counts.
        Assert(false);
        entry->of.lock.waiters = 0;
        LWLockRelease(registry_waiters_lock());
    }
    set_free(entry);
}

// An expired lease with a queue goes to the queue first.
void hand_over_if_lapsed(RegistryEntry* entry, core::Micros now) {
    if (!held(*entry, now) && entry->of.lock.waiters > 0) {
        hand_over(entry, now);
    }
}

// Ends the grant in force (unlock, reset): the earliest waiter gets the lock,
// or it is free. When the grant was a journaled lease, `released` gets the
// record of the name made free, numbered before whatever follows it, for the
// caller to write once the lock is released; `*journal` says so.
void end_grant(RegistryEntry* entry, core::Micros now, LeaseRecord* released, bool* journal) {
    *journal = journaled_grant(*entry);
    if (*journal) {
        RegistryEntry freed = *entry;
        set_free(&freed);
        lease_record_of(freed, released);
    }
    hand_over(entry, now);
}

// Writes a release (not fsynced: a release lost in a crash only lets the
// lease run to its end). `to_wal` false when called while an error is
// being handled.
void write_release(const LeaseRecord& released, bool to_wal) {
    const bool written = to_wal ? lease_journal_write(released, false) != InvalidXLogRecPtr
                                : lease_journal_append_only(released);
    if (!written) {
        ereport(WARNING, (errcode_for_file_access(),
                          errmsg("could not write a release to the pg_throttle lease journal: %m"),
                          errdetail("After a crash, the lease would be held to its end.")));
    }
}

// --- taking -----------------------------------------------------------------

struct LockCall {
    core::Micros now;
    int64 ttl;  // 0: session lock
    bool may_wait;
    const Holder* holder;
    Oid role;
    int64 token;          // out: the grant, or 0
    bool already_mine;    // out: refused because this session holds it as a session lock
    bool queued;          // out: this backend is now waiting
    bool tokens_used_up;  // out: free, but the durable block of tokens ran out
    LeaseRecord granted;  // out: the grant's record, when it is journaled
};

// No fence token is negative, so nobody can unlock or renew this one.
constexpr int64 kUnknownHolderToken = -1;

// Only when the lease journal could not be read whole: a lock nobody has
// asked for since the restart counts as leased until the restart plus
// pg_throttle.max_lease, by a holder nobody knows.
void lock_born(RegistryEntry* entry, core::Micros restart, void* /*ctx*/) {
    // Its owner stays the role whose call created it: that role's quota
    // pays for it (nobody can unlock it: no token is negative).
    entry->of.lock.token = kUnknownHolderToken;
    entry->granted_at = restart;
    entry->expires_at = core::saturating_add(restart, registry_max_lease());
    strlcpy(entry->holder, "[unknown: granted before a crash]", sizeof entry->holder);
}

bool lock_decide_shared(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<LockCall*>(ctx);
    if (!held(*entry, call->now)) {
        return false;
    }
    call->already_mine = own_session_lock(*entry);
    if (call->may_wait && !call->already_mine) {
        return false;  // queue up: needs the exclusive lock
    }
    __atomic_fetch_add(&entry->denials, 1, __ATOMIC_RELAXED);
    return true;
}

void lock_apply_exclusive(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<LockCall*>(ctx);
    hand_over_if_lapsed(entry, call->now);
    if (!held(*entry, call->now)) {
        call->token = fence_next();
        if (call->token == 0) {
            call->tokens_used_up = true;
            return;
        }
        grant(entry, call->now, call->token, call->ttl, MyProcPid, call->holder->text, call->role);
        if (journaled_grant(*entry)) {
            lease_record_of(*entry, &call->granted);
        }
        return;
    }
    call->already_mine = own_session_lock(*entry);
    if (!call->may_wait || call->already_mine) {
        __atomic_fetch_add(&entry->denials, 1, __ATOMIC_RELAXED);
        return;
    }
    waiter_enqueue(entry, call->ttl, call->holder->text, call->role);
    call->queued = true;
}

constexpr EntryOp kLockOp{lock_born, lock_decide_shared, lock_apply_exclusive};

// --- waiting ----------------------------------------------------------------

struct WaitCheck {
    core::Micros now;
    bool give_up;            // leave the queue unless already granted
    int64 token;             // out: the token handed over, or 0
    int64 seq;               // out: with the hand-over's sequence number
    core::Micros at;         // out: and its time
    core::Micros lapses_at;  // out: when the current grant ends
    bool found;              // out: the entry exists
};

void wait_check(RegistryEntry* entry, void* ctx) {
    auto* check = static_cast<WaitCheck*>(ctx);
    check->found = true;
    WaiterSlot* me = my_waiter_slot();
    if (me->waiting) {
        hand_over_if_lapsed(entry, check->now);
    }
    LWLockAcquire(registry_waiters_lock(), LW_EXCLUSIVE);
    if (!me->waiting) {
        check->token = me->granted_token;
        check->seq = me->granted_seq;
        check->at = me->granted_at;
        me->granted_token = 0;
    } else if (check->give_up) {
        waiter_dequeue(entry, me);
    }
    LWLockRelease(registry_waiters_lock());
    check->lapses_at = entry->expires_at;
}

// Leaves the queue; a lock handed over meanwhile is passed on, since the
// caller will never learn its token. (Its grant was never journaled: the
// journal still has the name free, or an earlier lease that has ended.)
void abandon_wait(RegistryEntry* entry, void* ctx) {
    WaitCheck check{*static_cast<core::Micros*>(ctx), true, 0, 0, 0, 0, false};
    wait_check(entry, &check);
    if (check.token != 0 && entry->of.lock.token == check.token) {
        hand_over(entry, check.now);
    }
}

// Until the wait's deadline (real time) or the grant's end (on the kind's
// clock, read as `now`), whichever comes first.
long sleep_ms(TimestampTz deadline, core::Micros real, core::Micros now, core::Micros lapses_at) {
    core::Micros sleep_us = deadline - real;
    if (lapses_at != core::kNever && lapses_at - now < sleep_us) {
        sleep_us = lapses_at - now;  // a lease ends: the queue's head takes over then
    }
    return core::sleep_timeout_ms(sleep_us);  // a wait longer than WaitLatch takes loops
}

// Waits in the queue until the lock is handed over or the wait runs out
// (token 0). Only trivially destructible objects here: PG_TRY is sigsetjmp.
WaitCheck wait_in_queue(const RegistryKey& key, core::Micros wait_us, uint32 event) {
    const TimestampTz deadline = core::saturating_add(real_now(), wait_us);
    WaitCheck result{};
    PG_TRY();
    {
        for (;;) {
            // On a Citus cluster a hand-over is decided only while the key's
            // shard is here, and the sleep holds no move back.
            placement_resume();
            fence_reserve_ahead();
            WaitCheck check{now_for(key), real_now() >= deadline, 0, 0, 0, 0, false};
            registry_update_existing(key, wait_check, &check, placement_moved_in_at(key));
            if (!check.found) {
                waiter_forget_mine();  // the entry is gone: stop
                break;
            }
            if (check.token != 0 || check.give_up) {
                result = check;
                break;
            }
            placement_pause();
            (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                            std::min(sleep_ms(deadline, real_now(), check.now, check.lapses_at),
                                     kClientCheckMs),
                            event);
            ResetLatch(MyLatch);
            CHECK_FOR_INTERRUPTS();
            // A client that left is handed nothing (release_at_exit ends the wait).
            raise_if_client_gone();
        }
    }
    PG_CATCH();
    {
        // On a Citus cluster this may run while the shard metadata lock is
        // let go (placement_pause): a hand-over it makes goes to a waiter
        // that checks the placement again before it takes the lock.
        core::Micros now = now_for(key);
        registry_update_existing(key, abandon_wait, &now, placement_moved_in_at(key));
        PG_RE_THROW();
    }
    PG_END_TRY();
    return result;
}

// --- durability -------------------------------------------------------------

struct TokenCall {
    core::Micros now;
    int64 token;
    int64 ttl;  // renew only
    // Who may use the token: for throttle.lock's locks the role holding the
    // lock, a member of it or a superuser, and for a session lock only its
    // session. (Queue groups are checked by the queue.)
    bool check_owner;
    Oid role;         // the caller
    bool vouched;     // the caller was found to have the privileges of:
    Oid vouched_for;  //   this owner (has_privs_of_role: members, superusers)
    bool done;
    bool is_session_lock;
    bool refused;        // out: the token is right, the lock another role's:
    Oid refused_owner;   //   this one's (InvalidOid: owner not known)
    bool journal;        // `record` is to be written
    LeaseRecord record;  // a release (unlock, reset) or the renewed lease
};

TokenCall token_call(const RegistryKey& key, int64 token, int64 ttl) {
    TokenCall call{};
    call.now = now_for(key);
    call.token = token;
    call.ttl = ttl;
    call.check_owner = static_cast<EntryKind>(key.kind) == EntryKind::kLock;
    call.role = GetUserId();
    return call;
}

// Whether `call` holds the current grant of `entry`: its token, and, where
// checked, the right to use it; a refusal is left in `call` to report.
bool holds_grant(const RegistryEntry& entry, TokenCall* call) {
    if (call->token <= 0 || !held(entry, call->now) || entry.of.lock.token != call->token) {
        return false;
    }
    if (!call->check_owner) {
        return true;
    }
    if (entry.of.lock.session && entry.holder_pid != MyProcPid) {
        return false;  // another session's session lock
    }
    if (entry.owner == call->role || (call->vouched && entry.owner == call->vouched_for)) {
        return true;
    }
    call->refused = true;
    call->refused_owner = entry.owner;
    return false;
}

void unlock_update(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<TokenCall*>(ctx);
    if (holds_grant(*entry, call)) {
        call->is_session_lock = entry->of.lock.session;
        end_grant(entry, call->now, &call->record, &call->journal);
        call->done = true;
    }
}

// Runs a token call (unlock, renew) on `key`; when the lock is another
// role's, checks outside the registry's locks whether the caller has that
// role's privileges and, if so, runs it once more as such. A caller without
// them, or another session for a session lock, gets what a stale token
// gets (nothing done, false): an answer that differed when the token was
// right would let a role find other roles' tokens by trying numbers.
void run_token_call(const RegistryKey& key, void (*update)(RegistryEntry* entry, void* ctx),
                    TokenCall* call) {
    const TokenCall initial = *call;
    registry_update_existing(key, update, call, placement_moved_in_at(key));
    if (call->refused && has_privs_of_role(call->role, call->refused_owner)) {
        TokenCall again = initial;
        again.vouched = true;
        again.vouched_for = call->refused_owner;
        *call = again;
        registry_update_existing(key, update, call, placement_moved_in_at(key));
    }
}

// Releases `token` of `key` while an error is being handled: the registry
// and the journal, not WAL (a standby then keeps the lease to its end).
void release_after_error(const RegistryKey& key, int64 token) {
    TokenCall call = token_call(key, token, 0);
    call.check_owner = false;  // this backend's own grant, just made
    registry_update_existing(key, unlock_update, &call, placement_moved_in_at(key));
    if (call.journal) {
        write_release(call.record, false);
    }
}

struct GrantMade {
    const RegistryKey* key;
    int64 token;
};

void release_grant_made(int /*code*/, Datum arg) {
    const auto* made = reinterpret_cast<const GrantMade*>(DatumGetPointer(arg));
    LWLockReleaseAll();
    release_after_error(*made->key, made->token);
}

// Makes a lease just granted durable before its token is returned: the
// journal, fsynced, then WAL and the synchronous standbys. When it cannot
// be made durable the lease is released and an error raised.
void make_grant_durable(const RegistryKey& key, int64 token, const LeaseRecord& record) {
    const XLogRecPtr lsn = lease_journal_write(record, true);
    if (lsn == InvalidXLogRecPtr) {
        const int saved = errno;
        release_after_error(key, token);
        errno = saved;
        ereport(ERROR, (errcode_for_file_access(),
                        errmsg("could not write the pg_throttle lease journal: %m"),
                        errdetail("The lease was not granted.")));
    }
    // A cancel, or a FATAL (pg_terminate_backend) that skips every PG_CATCH,
    // releases the lease nobody will be told of.
    const GrantMade made{&key, token};
    PG_ENSURE_ERROR_CLEANUP(release_grant_made, PointerGetDatum(&made));
    { wait_for_sync_standbys(lsn); }
    PG_END_ENSURE_ERROR_CLEANUP(release_grant_made, PointerGetDatum(&made));
}

// The record of a lease handed to this backend while it waited.
void handed_over_record(const RegistryKey& key, const WaitCheck& check, int64 ttl,
                        const Holder& holder, Oid role, LeaseRecord* record) {
    memset(record, 0, sizeof *record);
    record->seq = check.seq;
    record->token = check.token;
    record->granted_at = check.at;
    record->expires_at = core::saturating_add(check.at, ttl);
    record->dbid = key.dbid;
    record->holder_pid = MyProcPid;
    record->owner = role;
    record->name_len = key.name_len;
    memcpy(record->name, key.name, key.name_len);
    memcpy(record->holder, holder.text, sizeof record->holder);
}

// --- session end ------------------------------------------------------------

void release_if_own_session_lock(RegistryEntry* entry, void* ctx) {
    if (entry->of.lock.token != 0 && entry->expires_at == core::kNever &&
        own_session_lock(*entry)) {
        hand_over(entry, *static_cast<core::Micros*>(ctx));
    }
}

// Releases the session locks this session holds; a waiter gets each.
void release_own_session_locks(core::Micros* now) {
    for (int i = 0; i < session_locks.count; ++i) {
        registry_update_existing(session_locks.keys[i], release_if_own_session_lock, now,
                                 placement_moved_in_at(session_locks.keys[i]));
    }
    session_locks.count = 0;
}

void release_at_exit(int /*code*/, Datum /*arg*/) {
    LWLockReleaseAll();
    core::Micros now = real_now();
    // A FATAL error (pg_terminate_backend) during a wait skips PG_CATCH.
    WaiterSlot* me = my_waiter_slot();
    if (me->waiting || me->granted_token != 0) {
        registry_update_existing(me->key, abandon_wait, &now, placement_moved_in_at(me->key));
    }
    release_own_session_locks(&now);
}

void register_exit_callback() {
    if (!exit_callback_registered) {
        before_shmem_exit(release_at_exit, 0);
        exit_callback_registered = true;
    }
}

void renew_update(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<TokenCall*>(ctx);
    if (!holds_grant(*entry, call)) {
        return;
    }
    if (entry->of.lock.session) {
        call->is_session_lock = true;
        return;
    }
    entry->expires_at = core::saturating_add(call->now, call->ttl);
    entry->of.lock.seq = lease_next_seq();
    call->done = true;
    call->journal = journaled_grant(*entry);
    if (call->journal) {
        lease_record_of(*entry, &call->record);
    }
}

void reset_update(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<TokenCall*>(ctx);
    if (entry->of.lock.token != 0 && (held(*entry, call->now) || entry->of.lock.waiters > 0)) {
        end_grant(entry, call->now, &call->record, &call->journal);
        call->done = true;
    }
}

void refuse_on_standby() {
    if (RecoveryInProgress()) {
        ereport(ERROR, (errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
                        errmsg("cannot change locks during recovery"),
                        errhint("Take, release and renew locks on the primary.")));
    }
}

}  // namespace

int64 lock_take(const RegistryKey& key, int64 ttl, core::Micros wait_us, const Holder& holder) {
    refuse_on_standby();
    waiter_slot_check();  // release_at_exit and a wait both use this backend's slot
    register_exit_callback();
    if (ttl == 0) {
        remember_session_lock(key);  // before it can be granted, even while waiting
    }
    const Oid role = registry_caller_role(static_cast<EntryKind>(key.kind));
    // Before queueing: naming the wait event can raise an error.
    const uint32 event = wait_us > 0 ? wait_event_lock() : 0;
    LockCall call{};
    do {
        fence_reserve_ahead();
        call = LockCall{now_for(key), ttl, wait_us > 0, &holder, role, 0, false, false, false, {}};
        registry_apply(key, kLockOp, &call, placement_moved_in_at(key));
    } while (call.tokens_used_up);
    int64 token = call.token;
    LeaseRecord record = call.granted;
    if (call.queued) {
        const WaitCheck handed = wait_in_queue(key, wait_us, event);
        token = handed.token;
        handed_over_record(key, handed, ttl, holder, role, &record);
        if (token != 0) {
            // Handed over after the wait's last look at its client.
            const GrantMade made{&key, token};
            PG_ENSURE_ERROR_CLEANUP(release_grant_made, PointerGetDatum(&made));
            { raise_if_client_gone(); }
            PG_END_ENSURE_ERROR_CLEANUP(release_grant_made, PointerGetDatum(&made));
        }
    }
    if (token == 0 && ttl == 0 && !call.already_mine) {
        forget_session_lock(key);  // not had: nothing to release at exit
    }
    if (token != 0 && ttl > 0 && static_cast<EntryKind>(key.kind) == EntryKind::kLock) {
        make_grant_durable(key, token, record);
    }
    return token;
}

bool lock_release(const RegistryKey& key, int64 token) {
    refuse_on_standby();
    fence_reserve_ahead();  // the lock may go to a waiter with a new token
    TokenCall call = token_call(key, token, 0);
    run_token_call(key, unlock_update, &call);
    if (call.journal) {
        write_release(call.record, true);
    }
    if (call.done && call.is_session_lock) {
        forget_session_lock(key);
    }
    return call.done;
}

RenewResult lock_renew(const RegistryKey& key, int64 token, int64 ttl) {
    refuse_on_standby();
    TokenCall call = token_call(key, token, ttl);
    run_token_call(key, renew_update, &call);
    if (call.is_session_lock) {
        return RenewResult::kSessionLock;
    }
    if (call.journal) {
        // Until it is durable the holder is not told: after a crash the lease
        // would end at its earlier expiry, which the holder still believes.
        const XLogRecPtr lsn = lease_journal_write(call.record, true);
        if (lsn == InvalidXLogRecPtr) {
            ereport(ERROR, (errcode_for_file_access(),
                            errmsg("could not write the pg_throttle lease journal: %m"),
                            errdetail("The lease was not renewed; it ends when it did before.")));
        }
        wait_for_sync_standbys(lsn);
    }
    return call.done ? RenewResult::kRenewed : RenewResult::kNotHeld;
}

void lock_release_at_transaction_end(const RegistryKey& key, int64 token) {
    release_after_error(key, token);
}

namespace {

struct HeldToken {
    core::Micros now;
    int64 token;
};

void read_held_token(RegistryEntry* entry, void* ctx) {
    auto* read = static_cast<HeldToken*>(ctx);
    read->token = held(*entry, read->now) ? entry->of.lock.token : 0;
}

}  // namespace

int64 lock_token_held(const RegistryKey& key) {
    HeldToken read{now_for(key), 0};
    registry_update_existing(key, read_held_token, &read, placement_moved_in_at(key));
    return read.token;
}

bool lock_reset(const RegistryKey& key) {
    refuse_on_standby();
    fence_reserve_ahead();
    TokenCall call = token_call(key, 0, 0);
    registry_update_existing(key, reset_update, &call, placement_moved_in_at(key));
    if (call.journal) {
        write_release(call.record, true);
    }
    return call.done;
}

void lock_release_session_locks() {
    core::Micros now = real_now();
    release_own_session_locks(&now);
}

}  // namespace pg_throttle::pg
