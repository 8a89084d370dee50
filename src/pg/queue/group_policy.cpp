// throttle.group_policy as claim_group reads it (group_policy.hpp), and the
// trigger that makes its writers wait for the claims in progress.
//
// The lock is an advisory lock of a class of its own (field 4 of the tag,
// which pg_advisory_lock's keys never use), one per database: claims share
// it, a change takes it exclusively. It costs a claim one lock-manager
// round trip and writes nothing (no transaction id, no WAL), unlike a row
// lock on the policy, which would make every empty poll write.
#include "pg/queue/group_policy.hpp"

#include "pg/boundary.hpp"
#include "pg/kept_plan.hpp"

extern "C" {
#include "commands/trigger.h"
#include "storage/lmgr.h"
#include "utils/snapmgr.h"
}

namespace pg_throttle::pg {
namespace {

// pg_locks shows it as an advisory lock with objsubid 28788 ("pt").
constexpr uint16 kPolicyLockClass = 0x7074;

void lock_policy(LOCKMODE mode) {
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, kPolicyLockClass);
    (void)LockAcquire(&tag, mode, false, false);
}

KeptPlan policy_query{"SELECT workers, strict_order FROM throttle.group_policy WHERE queue = $1",
                      1,
                      {TEXTOID},
                      nullptr};

// () -> trigger: FOR EACH STATEMENT on throttle.group_policy.
Datum group_policy_changes(FunctionCallInfo fcinfo) {
    if (!CALLED_AS_TRIGGER(fcinfo)) {
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("throttle._group_policy_changes is a trigger")));
    }
    lock_policy(ExclusiveLock);
    return PointerGetDatum(nullptr);
}

}  // namespace

GroupPolicy group_policy_for_claim(const text* queue) {
    lock_policy(ShareLock);
    // The latest snapshot, not the transaction's: under repeatable read a
    // claim whose snapshot predates a change must still apply the change.
    Datum args[1] = {PointerGetDatum(queue)};
    const int rc = SPI_execute_snapshot(kept_plan(&policy_query), args, nullptr,
                                        GetLatestSnapshot(), InvalidSnapshot, true, false, 1);
    if (rc != SPI_OK_SELECT) {
        elog(ERROR, "SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
    }
    GroupPolicy policy{1, false};
    if (SPI_processed == 1) {
        bool is_null = false;
        policy.workers =
            DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
        policy.strict_order =
            DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &is_null));
    }
    SPI_freetuptable(SPI_tuptable);
    return policy;
}

}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_policy_changes, pg_throttle::pg::group_policy_changes)
