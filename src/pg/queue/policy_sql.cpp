// SQL entries the queue's install script calls for its policies: the
// trigger that takes the policy lock on a change of throttle.group_policy or
// throttle.concurrency_policy (policy_lock.hpp), and extend's key lock
// (concurrency_keys.hpp).
#include "pg/queue/concurrency_keys.hpp"
#include "pg/queue/policy_lock.hpp"

#include "pg/server/boundary.hpp"

extern "C" {
#include "commands/trigger.h"
#include "storage/lmgr.h"
}

namespace pg_throttle::pg {
namespace {

// () -> trigger: FOR EACH STATEMENT on throttle.group_policy and
// throttle.concurrency_policy.
Datum policy_changes(FunctionCallInfo fcinfo) {
    if (!CALLED_AS_TRIGGER(fcinfo)) {
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("throttle._policy_changes is a trigger")));
    }
    lock_queue_policies(ExclusiveLock);
    return PointerGetDatum(nullptr);
}

// (queue text, concurrency_key text) -> void: extend's key lock, shared
// (extends of one key never wait for each other), waited for.
Datum lock_concurrency_key(FunctionCallInfo fcinfo) {
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1)) {
        PG_RETURN_VOID();
    }
    LOCKTAG tag = concurrency_key_lock_tag(PG_GETARG_DATUM(0), PG_GETARG_TEXT_PP(1));
    (void)LockAcquire(&tag, ShareLock, false, false);
    PG_RETURN_VOID();
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_policy_changes, pg_throttle::pg::policy_changes)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_lock_concurrency_key, pg_throttle::pg::lock_concurrency_key)
