// The policy lock (policy_lock.hpp); policy_sql.cpp has the trigger that takes it.
//
// It is an advisory lock of a class of its own (field 4 of the tag, which
// pg_advisory_lock's keys never use), one per database. It costs a claim one
// lock-manager round trip and writes nothing (no transaction id, no WAL),
// unlike a row lock on the policy, which would make every empty poll write.
#include "pg/queue/policy_lock.hpp"

extern "C" {
#include "storage/lmgr.h"
}

namespace pg_throttle::pg {

namespace {

// Until the transaction ends; false when `dont_wait` and it is not free.
bool acquire_policy_lock(LOCKMODE mode, bool dont_wait) {
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, kPolicyLockClass);
    return LockAcquire(&tag, mode, false, dont_wait) != LOCKACQUIRE_NOT_AVAIL;
}

}  // namespace

void lock_queue_policies(LOCKMODE mode) {
    (void)acquire_policy_lock(mode, false);
}

bool try_lock_queue_policies_shared() {
    return acquire_policy_lock(ShareLock, true);
}

}  // namespace pg_throttle::pg
