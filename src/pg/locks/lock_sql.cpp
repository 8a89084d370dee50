// throttle.lock, throttle.unlock, throttle.renew: named locks and leases
// with fence tokens (locks.hpp).
#include "pg/locks/locks.hpp"

#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"
#include "pg/scale_out/placement.hpp"

namespace pg_throttle::pg {
namespace {

void lock_key(FunctionCallInfo fcinfo, RegistryKey* key) {
    require_not_null(fcinfo, 0, "name");
    const text* name = PG_GETARG_TEXT_PP(0);
    registry_make_key(EntryKind::kLock, VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name), "lock", key);
    placement_enter(EntryKind::kLock, VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name));
}

// On a Citus cluster a session lock is refused (0A000): taken through the
// coordinator it would be held by the coordinator's cached connection to the
// worker, which every client shares; and it has no end a shard move could
// wait out (the move rule holds a moved name for pg_throttle.max_lease).
void refuse_session_lock_when_distributed() {
    if (!placement_distributed()) {
        return;
    }
    ereport(ERROR,
            (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
             errmsg("session locks cannot be taken on a Citus cluster"),
             errdetail("Through the coordinator the lock would belong to every client of its "
                       "connection to the worker, and a shard move cannot wait out a lock "
                       "with no end."),
             errhint("Take a lease: give throttle.lock a ttl.")));
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
    if (ttl == 0) {
        refuse_session_lock_when_distributed();
    }
    const core::Micros wait_us = optional_wait(fcinfo, 2, "wait");
    const Holder holder = holder_from_argument(fcinfo, 3);
    const int64 token = lock_take(key, ttl, wait_us, holder);
    if (token == 0) {
        PG_RETURN_NULL();
    }
    PG_RETURN_INT64(token);
}

Datum unlock(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    lock_key(fcinfo, &key);
    require_not_null(fcinfo, 1, "token");
    PG_RETURN_BOOL(lock_release(key, PG_GETARG_INT64(1)));
}

Datum renew(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    lock_key(fcinfo, &key);
    require_not_null(fcinfo, 1, "token");
    require_not_null(fcinfo, 2, "ttl");
    const RenewResult result =
        lock_renew(key, PG_GETARG_INT64(1), lease_ttl(PG_GETARG_INTERVAL_P(2)));
    if (result == RenewResult::kSessionLock) {
        ereport(ERROR,
                (errcode(ERRCODE_WRONG_OBJECT_TYPE),
                 errmsg("lock \"%s\" is a session lock", text_to_cstring(PG_GETARG_TEXT_PP(0))),
                 errdetail("Only leases (locks taken with a ttl) can be renewed."),
                 errhint("Take the lock with a ttl to hold it as a lease.")));
    }
    PG_RETURN_BOOL(result == RenewResult::kRenewed);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_lock, pg_throttle::pg::lock)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_unlock, pg_throttle::pg::unlock)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_renew, pg_throttle::pg::renew)
