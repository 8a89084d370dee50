// Named locks and leases with fence tokens, for the registry's two lock
// kinds: kLock (throttle.lock, unlock, renew) and kQueueGroup (the lease that
// holds a group of the event queue).
//
// A lock entry is held while its token is set and expires_at has not passed,
// in real time: kNever for a session lock (released by unlock or when the
// holder's session ends), grant + ttl for a lease. Releasing hands the lock
// straight to the earliest queued backend (lock_waiters.hpp) with a new
// token, so waiters are served in arrival order and none of them polls.
//
// Leases of kind kLock are durable: their grant and every renew are written
// to the lease journal (and WAL, and the synchronous standbys) before the
// token or the answer is returned (lease_journal.hpp). Session locks die with
// their sessions and queue groups live in the event table, so neither is
// journaled: after a crash they are free at once.
#pragma once

#include "pg/registry/holder.hpp"
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {

// Takes the lock of `key`: a session lock when `ttl` is 0, else a lease of
// `ttl` microseconds. Waits up to `wait_us` (0: not at all; kNever: without
// limit) in arrival order. Returns the fence token, or 0 when the lock could
// not be had. Raises 53200 when the registry is full, 25006 on a standby.
int64 lock_take(const RegistryKey& key, int64 ttl, core::Micros wait_us, const Holder& holder);

// Releases the lock of `key` if `token` is its current token; the earliest
// waiter gets it. Raises 25006 on a standby.
bool lock_release(const RegistryKey& key, int64 token);

enum class RenewResult { kRenewed, kNotHeld, kSessionLock };

// Extends the lease of `key` held with `token` to `ttl` from now.
RenewResult lock_renew(const RegistryKey& key, int64 token, int64 ttl);

// Releases `key` held with `token` by this backend while its transaction
// commits or aborts, where nothing may fail: raises no error, writes no WAL
// and hands out no token (for queue group leases, which have no waiters).
void lock_release_at_transaction_end(const RegistryKey& key, int64 token);

// The token of the grant that holds the lock of `key` now, or 0 when it is
// free. Reads only.
int64 lock_token_held(const RegistryKey& key);

// Releases every session lock this session holds, as the session's end
// would: for DISCARD ALL, which releases advisory locks too, so that a
// connection pooler's reset between clients leaves none behind.
void lock_release_session_locks();

// Ends whatever grant holds the lock of `key` (throttle.reset): the earliest
// waiter gets it, or it is free. Returns whether it was held.
bool lock_reset(const RegistryKey& key);

}  // namespace pg_throttle::pg
