// The lock that makes a change of a queue policy (throttle.group_policy,
// throttle.concurrency_policy) exact: every claim that reads a policy holds
// it shared until its transaction ends, and every statement that changes one
// of those tables takes it exclusively first (a trigger), so a change waits
// for the claims in progress and the claims after it read the new policy.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// The classes of pg_throttle's own advisory locks: field 4 of the lock tag,
// which pg_advisory_lock's keys (1 for one bigint, 2 for two integers) never
// use, so no role can take or block these through SQL. pg_locks shows the
// class as objsubid.
//
// The queue policies of a database (this lock): objsubid 28788, "pt".
inline constexpr uint16 kPolicyLockClass = 0x7074;
// A concurrency_key of a queue, while a claim counts and takes its events
// (concurrency_keys.hpp): objsubid 28789, "pu".
inline constexpr uint16 kConcurrencyKeyLockClass = 0x7075;

// Takes the policy lock of the current database in `mode` (ShareLock for a
// claim, ExclusiveLock for a change) until the transaction ends.
void lock_queue_policies(LOCKMODE mode);

// The same, shared, without waiting: false when a change holds it or waits
// for it (a claim that never waits then leaves what the policies govern).
bool try_lock_queue_policies_shared();

}  // namespace pg_throttle::pg
