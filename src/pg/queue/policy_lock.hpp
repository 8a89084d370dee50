// The lock that makes a change of a queue policy (throttle.group_policy,
// throttle.concurrency_policy) exact: every claim that reads a policy holds
// it shared until its transaction ends, and every statement that changes one
// of those tables takes it exclusively first (a trigger), so a change waits
// for the claims in progress and the claims after it read the new policy.
#pragma once

#include "pg/pg_headers.hpp"

namespace pg_throttle::pg {

// Takes the policy lock of the current database in `mode` (ShareLock for a
// claim, ExclusiveLock for a change) until the transaction ends.
void lock_queue_policies(LOCKMODE mode);

// The same, shared, without waiting: false when a change holds it or waits
// for it (a claim that never waits then leaves what the policies govern).
bool try_lock_queue_policies_shared();

}  // namespace pg_throttle::pg
