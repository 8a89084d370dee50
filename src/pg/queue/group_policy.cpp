// throttle.group_policy as claim_group reads it (group_policy.hpp).
#include "pg/queue/group_policy.hpp"

#include "pg/server/kept_plan.hpp"
#include "pg/queue/policy_lock.hpp"

namespace pg_throttle::pg {
namespace {

KeptPlan policy_query{"SELECT workers, strict_order FROM throttle.group_policy WHERE queue = $1",
                      1,
                      {TEXTOID},
                      nullptr};

}  // namespace

GroupPolicy group_policy_for_claim(const text* queue) {
    lock_queue_policies(ShareLock);
    // The latest snapshot, not the transaction's: under repeatable read a
    // claim whose snapshot predates a change must still apply the change.
    Datum args[1] = {PointerGetDatum(queue)};
    run_kept_plan_latest(&policy_query, args, nullptr, SPI_OK_SELECT, 1);
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
