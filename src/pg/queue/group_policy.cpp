// throttle.group_policy as claim_group reads it, with the queue's pauses
// (group_policy.hpp).
#include "pg/queue/group_policy.hpp"

#include "pg/server/kept_plan.hpp"
#include "pg/queue/policy_lock.hpp"

namespace pg_throttle::pg {
namespace {

// One row whether or not the queue is named in throttle.group_policy (the
// aggregate of the queue's pauses always gives one): one scan of
// queue_pause_key for the queue's pauses, one probe of the policy.
KeptPlan policy_query{
    "SELECT p.workers, p.strict_order, coalesce(q.paused, false), q.groups,"
    "       p.fairness = 'round_robin'"
    " FROM (SELECT bool_or(q.group_key IS NULL) AS paused,"
    "              array_agg(q.group_key) FILTER (WHERE q.group_key IS NOT NULL) AS groups"
    "       FROM throttle.queue_pause q WHERE q.queue = $1) q"
    " LEFT JOIN throttle.group_policy p ON p.queue = $1",
    1,
    {TEXTOID},
    nullptr};
// On a database whose SQL is still 0.3.0's: no pauses, and no fairness
// column (the update to 0.4.0 adds both): oldest first.
KeptPlan policy_query_without_pauses{
    "SELECT p.workers, p.strict_order, false, NULL::text[], false"
    " FROM (SELECT 1) o LEFT JOIN throttle.group_policy p ON p.queue = $1",
    1,
    {TEXTOID},
    nullptr};

}  // namespace

bool queue_paused_now(const text* queue) {
    static KeptPlan paused_query{
        "SELECT EXISTS (SELECT 1 FROM throttle.queue_pause p"
        "               WHERE p.queue = $1 AND p.group_key IS NULL)",
        1,
        {TEXTOID},
        nullptr};
    Datum args[1] = {PointerGetDatum(queue)};
    run_kept_plan_latest(&paused_query, args, nullptr, SPI_OK_SELECT, 1);
    bool is_null = true;
    const bool paused =
        DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
    SPI_freetuptable(SPI_tuptable);
    return paused;
}

bool pauses_installed() {
    const Oid schema = get_namespace_oid("throttle", true);
    return schema != InvalidOid && get_relname_relid("queue_pause", schema) != InvalidOid;
}

GroupPolicy group_policy_for_claim(const text* queue) {
    lock_queue_policies(ShareLock);
    // The latest snapshot, not the transaction's: under repeatable read a
    // claim whose snapshot predates a change must still apply the change.
    Datum args[1] = {PointerGetDatum(queue)};
    run_kept_plan_latest(pauses_installed() ? &policy_query : &policy_query_without_pauses, args,
                         nullptr, SPI_OK_SELECT, 1);
    GroupPolicy policy{1, false, false, false, nullptr};
    const HeapTuple row = SPI_tuptable->vals[0];
    const TupleDesc desc = SPI_tuptable->tupdesc;
    bool is_null = true;
    const Datum workers = SPI_getbinval(row, desc, 1, &is_null);
    if (!is_null) {
        policy.workers = DatumGetInt32(workers);
        policy.strict_order = DatumGetBool(SPI_getbinval(row, desc, 2, &is_null));
        policy.round_robin = DatumGetBool(SPI_getbinval(row, desc, 5, &is_null));
    }
    policy.paused = DatumGetBool(SPI_getbinval(row, desc, 3, &is_null));
    const Datum groups = SPI_getbinval(row, desc, 4, &is_null);
    if (!is_null) {
        policy.paused_groups = DatumGetArrayTypePCopy(groups);
    }
    SPI_freetuptable(SPI_tuptable);
    return policy;
}

}  // namespace pg_throttle::pg
