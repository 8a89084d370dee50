// throttle._group_release, _group_release_at_commit, _group_reset, and the
// 0.1.0 symbols _group_take and _group_renew: the SQL entries of a group's
// lease (group_lease.hpp). Internal: called by the queue's SECURITY DEFINER
// functions, not granted to PUBLIC.
#include "pg/queue/group_lease.hpp"

#include "pg/locks/locks.hpp"
#include "pg/queue/group_lease_xact.hpp"

#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"

namespace pg_throttle::pg {
namespace {

// The queue and group_key of arguments 0 and 1.
void group_arguments(FunctionCallInfo fcinfo, const text** queue, const text** group) {
    require_not_null(fcinfo, 0, "queue");
    require_not_null(fcinfo, 1, "group_key");
    *queue = PG_GETARG_TEXT_PP(0);
    *group = PG_GETARG_TEXT_PP(1);
}

// The key of the slot held with the token of argument 2; false when none is.
bool held_slot(FunctionCallInfo fcinfo, RegistryKey* key) {
    const text* queue = nullptr;
    const text* group = nullptr;
    group_arguments(fcinfo, &queue, &group);
    require_not_null(fcinfo, 2, "token");
    return group_lease_find(queue, group, PG_GETARG_INT64(2), key);
}

// (queue, group_key, worker, lease) -> the claim's fence token, or NULL.
// 0.2.0 has no SQL function for it (claim_group takes the lease natively);
// the symbol stays for 0.1.0's throttle._group_take, which that version's
// claim_group calls until ALTER EXTENSION pg_throttle UPDATE has run.
Datum group_take(FunctionCallInfo fcinfo) {
    registry_require();
    const text* queue = nullptr;
    const text* group = nullptr;
    group_arguments(fcinfo, &queue, &group);
    RegistryKey key;
    group_lease_key(queue, group, 0, &key);
    require_not_null(fcinfo, 3, "lease");
    const int64 lease = positive_interval(PG_GETARG_INTERVAL_P(3), "lease");
    const int64 token = group_lease_take(key, lease, holder_from_argument(fcinfo, 2));
    if (token == 0) {
        PG_RETURN_NULL();
    }
    PG_RETURN_INT64(token);
}

// (queue, group_key, token) -> released.
Datum group_release(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    PG_RETURN_BOOL(held_slot(fcinfo, &key) && lock_release(key, PG_GETARG_INT64(2)));
}

// (queue, group_key, token): the lease is released when this transaction
// commits.
Datum group_release_at_commit(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    if (held_slot(fcinfo, &key)) {
        group_lease_release_at_commit(key, PG_GETARG_INT64(2));
    }
    PG_RETURN_VOID();
}

// (queue, group_key) -> whether a lease held the group (throttle.release_group):
// every slot.
Datum group_reset(FunctionCallInfo fcinfo) {
    registry_require();
    const text* queue = nullptr;
    const text* group = nullptr;
    group_arguments(fcinfo, &queue, &group);
    bool held = false;
    for (int slot = 0; slot < kMaxGroupWorkers; slot++) {
        RegistryKey key;
        group_lease_key(queue, group, slot, &key);
        held = lock_reset(key) || held;
    }
    PG_RETURN_BOOL(held);
}

// (queue, group_key, token, lease) -> renewed. 0.2.0 has no SQL function for
// it (extend renews natively); the symbol stays for 0.1.0's
// throttle._group_renew, which that version's extend calls until ALTER
// EXTENSION pg_throttle UPDATE has run.
Datum group_renew(FunctionCallInfo fcinfo) {
    registry_require();
    const text* queue = nullptr;
    const text* group = nullptr;
    group_arguments(fcinfo, &queue, &group);
    require_not_null(fcinfo, 2, "token");
    require_not_null(fcinfo, 3, "lease");
    const int64 lease = positive_interval(PG_GETARG_INTERVAL_P(3), "lease");
    PG_RETURN_BOOL(group_lease_renew(queue, group, PG_GETARG_INT64(2), lease));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_take, pg_throttle::pg::group_take)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_release, pg_throttle::pg::group_release)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_release_at_commit,
                         pg_throttle::pg::group_release_at_commit)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_reset, pg_throttle::pg::group_reset)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_renew, pg_throttle::pg::group_renew)
