// throttle.lock, throttle.unlock, throttle.renew: named locks and leases
// with fence tokens.
//
// A lock entry is held while its token is set and expires_at has not passed:
// kNever for a session lock (released by unlock or when the holder's session
// ends), grant + ttl for a lease. Releasing hands the lock straight to the
// earliest queued backend (lock_waiters.hpp) with a new token, so waiters are
// served in arrival order and none of them polls.
#include "core/time_math.hpp"
#include "pg/arguments.hpp"
#include "pg/clock.hpp"
#include "pg/durability/fence.hpp"
#include "pg/holder.hpp"
#include "pg/lock_waiters.hpp"
#include "pg/registry.hpp"

#include "pg/boundary.hpp"

namespace pg_throttle::pg {
namespace {

constexpr core::Micros kFreed = std::numeric_limits<core::Micros>::min();

bool exit_callback_registered = false;
bool may_hold_session_locks = false;  // this backend took or queued for a session lock

bool held(const RegistryEntry& entry, core::Micros now) {
    return entry.of.lock.token != 0 && now < entry.expires_at;
}

bool own_session_lock(const RegistryEntry& entry) {
    return entry.of.lock.session && entry.holder_pid == MyProcPid;
}

void grant(RegistryEntry* entry, core::Micros now, int64 token, int64 ttl, int32 pid,
           const char* holder) {
    entry->of.lock.token = token;
    entry->of.lock.session = ttl == 0;
    entry->granted_at = now;
    entry->expires_at = ttl == 0 ? core::kNever : core::saturating_add(now, ttl);
    entry->holder_pid = pid;
    strlcpy(entry->holder, holder, sizeof entry->holder);
    __atomic_fetch_add(&entry->grants, 1, __ATOMIC_RELAXED);
}

// Gives `entry` to its earliest waiter, or frees it. The caller holds the
// entry's partition lock exclusively and not the waiters lock. When the
// durable block of fence tokens is used up, the lock is freed and the
// earliest waiter woken to take it over itself once it has reserved more.
void hand_over(RegistryEntry* entry, core::Micros now) {
    if (entry->of.lock.waiters > 0) {
        LWLockAcquire(registry_waiters_lock(), LW_EXCLUSIVE);
        WaiterSlot* next = waiter_earliest(entry->key);
        if (next != nullptr) {
            const int64 token = fence_next();
            if (token != 0) {
                next->waiting = false;
                next->granted_token = token;
                entry->of.lock.waiters--;
                grant(entry, now, token, next->ttl, next->pid, next->holder);
            } else {
                entry->expires_at = kFreed;
            }
            SetLatch(&ProcGlobal->allProcs[next->pgprocno].procLatch);
            LWLockRelease(registry_waiters_lock());
            return;
        }
        entry->of.lock.waiters = 0;  // no slot matched: the count was stale
        LWLockRelease(registry_waiters_lock());
    }
    entry->expires_at = kFreed;
}

// An expired lease with a queue goes to the queue first.
void hand_over_if_lapsed(RegistryEntry* entry, core::Micros now) {
    if (!held(*entry, now) && entry->of.lock.waiters > 0) {
        hand_over(entry, now);
    }
}

// --- taking -----------------------------------------------------------------

struct LockCall {
    core::Micros now;
    int64 ttl;  // 0: session lock
    bool may_wait;
    const Holder* holder;
    int64 token;          // out: the grant, or 0
    bool queued;          // out: this backend is now waiting
    bool tokens_used_up;  // out: free, but the durable block of tokens ran out
};

bool lock_decide_shared(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<LockCall*>(ctx);
    if (entry == nullptr || !held(*entry, call->now)) {
        return false;
    }
    if (call->may_wait && !own_session_lock(*entry)) {
        return false;  // queue up: needs the exclusive lock
    }
    __atomic_fetch_add(&entry->denials, 1, __ATOMIC_RELAXED);
    return true;
}

// After a crash, an absent lock counts as leased until the restart plus
// pg_throttle.max_lease, by a holder nobody knows (token -1: no fence token
// is negative, so nobody can unlock or renew it).
constexpr int64 kUnknownHolderToken = -1;

void hold_for_unknown_holder(RegistryEntry* entry, core::Micros restart) {
    entry->of.lock.token = kUnknownHolderToken;
    entry->of.lock.session = false;
    entry->granted_at = restart;
    entry->expires_at = core::saturating_add(restart, registry_max_lease());
    entry->holder_pid = 0;
    strlcpy(entry->holder, "[unknown: granted before a crash]", sizeof entry->holder);
}

void lock_apply_exclusive(RegistryEntry* entry, bool created, void* ctx) {
    auto* call = static_cast<LockCall*>(ctx);
    if (created) {
        if (const auto restart = registry_unknown_since()) {
            hold_for_unknown_holder(entry, *restart);
        }
    } else {
        hand_over_if_lapsed(entry, call->now);
    }
    if (!held(*entry, call->now)) {  // a fresh entry has token 0: free
        call->token = fence_next();
        if (call->token == 0) {
            call->tokens_used_up = true;
            return;
        }
        grant(entry, call->now, call->token, call->ttl, MyProcPid, call->holder->text);
        return;
    }
    if (!call->may_wait || own_session_lock(*entry)) {
        __atomic_fetch_add(&entry->denials, 1, __ATOMIC_RELAXED);
        return;
    }
    waiter_enqueue(entry->key, call->ttl, call->holder->text);
    entry->of.lock.waiters++;
    call->queued = true;
}

constexpr EntryOp kLockOp{lock_decide_shared, lock_apply_exclusive};

// --- waiting ----------------------------------------------------------------

struct WaitCheck {
    core::Micros now;
    bool give_up;            // leave the queue unless already granted
    int64 token;             // out: the token handed over, or 0
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
        me->granted_token = 0;
    } else if (check->give_up) {
        me->waiting = false;
        entry->of.lock.waiters--;
    }
    LWLockRelease(registry_waiters_lock());
    check->lapses_at = entry->expires_at;
}

// Leaves the queue; a lock handed over meanwhile is passed on, since the
// caller will never learn its token.
void abandon_wait(RegistryEntry* entry, void* ctx) {
    WaitCheck check{*static_cast<core::Micros*>(ctx), true, 0, 0, false};
    wait_check(entry, &check);
    if (check.token != 0 && entry->of.lock.token == check.token) {
        hand_over(entry, check.now);
    }
}

long sleep_ms(TimestampTz deadline, core::Micros now, core::Micros lapses_at) {
    const TimestampTz real_now = GetCurrentTimestamp();
    core::Micros sleep_us = deadline - real_now;
    if (lapses_at != core::kNever && lapses_at - now < sleep_us) {
        sleep_us = lapses_at - now;  // a lease ends: the queue's head takes over then
    }
    const long ms = static_cast<long>((sleep_us + 999) / 1000);
    return ms > 0 ? ms : 1;
}

// Waits in the queue until the lock is handed over (its token) or the wait
// runs out (0). Only trivially destructible objects here: PG_TRY is sigsetjmp.
int64 wait_in_queue(const RegistryKey& key, core::Micros wait_us) {
    const TimestampTz deadline = core::saturating_add(GetCurrentTimestamp(), wait_us);
    int64 token = 0;
    PG_TRY();
    {
        for (;;) {
            fence_reserve_ahead();
            WaitCheck check{clock_now(), GetCurrentTimestamp() >= deadline, 0, 0, false};
            registry_update_existing(key, wait_check, &check);
            if (!check.found) {
                my_waiter_slot()->waiting = false;  // the entry is gone (reset): stop
                break;
            }
            if (check.token != 0 || check.give_up) {
                token = check.token;
                break;
            }
            (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                            sleep_ms(deadline, check.now, check.lapses_at), PG_WAIT_EXTENSION);
            ResetLatch(MyLatch);
            CHECK_FOR_INTERRUPTS();
        }
    }
    PG_CATCH();
    {
        core::Micros now = clock_now();
        registry_update_existing(key, abandon_wait, &now);
        PG_RE_THROW();
    }
    PG_END_TRY();
    return token;
}

// --- session end ------------------------------------------------------------

void release_if_own_session_lock(RegistryEntry* entry, void* ctx) {
    if (static_cast<EntryKind>(entry->key.kind) == EntryKind::kLock && entry->of.lock.token != 0 &&
        entry->expires_at == core::kNever && own_session_lock(*entry)) {
        hand_over(entry, *static_cast<core::Micros*>(ctx));
    }
}

void release_at_exit(int /*code*/, Datum /*arg*/) {
    LWLockReleaseAll();
    core::Micros now = clock_now();
    // A FATAL error (pg_terminate_backend) during a wait skips PG_CATCH.
    WaiterSlot* me = my_waiter_slot();
    if (me->waiting || me->granted_token != 0) {
        registry_update_existing(me->key, abandon_wait, &now);
    }
    if (may_hold_session_locks) {
        registry_for_each_exclusive(release_if_own_session_lock, &now);
    }
}

void register_exit_callback() {
    if (!exit_callback_registered) {
        before_shmem_exit(release_at_exit, 0);
        exit_callback_registered = true;
    }
}

// --- SQL --------------------------------------------------------------------

void lock_key(FunctionCallInfo fcinfo, RegistryKey* key) {
    require_not_null(fcinfo, 0, "name");
    const text* name = PG_GETARG_TEXT_PP(0);
    registry_make_key(EntryKind::kLock, VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name), "lock", key);
}

// A lease's ttl: positive and at most pg_throttle.max_lease (22023).
int64 lease_ttl(const Interval* interval) {
    const int64 ttl = positive_interval(interval, "ttl");
    if (ttl > registry_max_lease()) {
        ereport(
            ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("ttl exceeds pg_throttle.max_lease"),
             errdetail("ttl is %lld seconds; pg_throttle.max_lease is %lld seconds.",
                       static_cast<long long>(ttl / core::kUsPerSecond),
                       static_cast<long long>(registry_max_lease() / core::kUsPerSecond)),
             errhint("Take a shorter lease and renew it, or raise pg_throttle.max_lease.")));
    }
    return ttl;
}

Datum lock(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    lock_key(fcinfo, &key);
    const int64 ttl = PG_ARGISNULL(1) ? 0 : lease_ttl(PG_GETARG_INTERVAL_P(1));
    const core::Micros wait_us = optional_wait(fcinfo, 2, "wait");
    const Holder holder = holder_from_argument(fcinfo, 3);

    register_exit_callback();
    if (ttl == 0) {
        may_hold_session_locks = true;
    }
    LockCall call{};
    do {
        fence_reserve_ahead();
        call = LockCall{clock_now(), ttl, wait_us > 0, &holder, 0, false, false};
        if (registry_apply(key, call.now, kLockOp, &call) == ApplyResult::kFull) {
            registry_raise_full();
        }
    } while (call.tokens_used_up);
    const int64 token = call.queued ? wait_in_queue(key, wait_us) : call.token;
    if (token == 0) {
        PG_RETURN_NULL();
    }
    PG_RETURN_INT64(token);
}

struct TokenCall {
    core::Micros now;
    int64 token;
    int64 ttl;  // renew only
    bool done;
    bool is_session_lock;
};

void unlock_update(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<TokenCall*>(ctx);
    if (call->token > 0 && held(*entry, call->now) && entry->of.lock.token == call->token) {
        hand_over(entry, call->now);
        call->done = true;
    }
}

void renew_update(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<TokenCall*>(ctx);
    if (call->token <= 0 || !held(*entry, call->now) || entry->of.lock.token != call->token) {
        return;
    }
    if (entry->of.lock.session) {
        call->is_session_lock = true;
        return;
    }
    entry->expires_at = core::saturating_add(call->now, call->ttl);
    call->done = true;
}

Datum unlock(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    lock_key(fcinfo, &key);
    require_not_null(fcinfo, 1, "token");
    TokenCall call{clock_now(), PG_GETARG_INT64(1), 0, false, false};
    fence_reserve_ahead();  // the lock may go to a waiter with a new token
    registry_update_existing(key, unlock_update, &call);
    PG_RETURN_BOOL(call.done);
}

Datum renew(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    lock_key(fcinfo, &key);
    require_not_null(fcinfo, 1, "token");
    require_not_null(fcinfo, 2, "ttl");
    TokenCall call{clock_now(), PG_GETARG_INT64(1), lease_ttl(PG_GETARG_INTERVAL_P(2)), false,
                   false};
    registry_update_existing(key, renew_update, &call);
    if (call.is_session_lock) {
        ereport(ERROR,
                (errcode(ERRCODE_WRONG_OBJECT_TYPE),
                 errmsg("lock \"%s\" is a session lock", text_to_cstring(PG_GETARG_TEXT_PP(0))),
                 errdetail("Only leases (locks taken with a ttl) can be renewed."),
                 errhint("Take the lock with a ttl to hold it as a lease.")));
    }
    PG_RETURN_BOOL(call.done);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_lock, pg_throttle::pg::lock)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_unlock, pg_throttle::pg::unlock)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_renew, pg_throttle::pg::renew)
