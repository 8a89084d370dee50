// The lease that holds a group of the event queue (throttle.claim_group):
// throttle._group_take, _group_release, _group_renew. Internal: called by
// the queue's SECURITY DEFINER functions, not granted to PUBLIC.
//
// Groups have a kind of their own (EntryKind::kQueueGroup), so no name given
// to throttle.lock can reach them. They are not journaled: the claimed rows
// of throttle.event, with their lease_until, are the durable truth of a group
// claim (the queue checks them before it hands a group out), so after a
// crash a group no claim holds is free at once.
#include "pg/locks/locks.hpp"

#include "pg/arguments.hpp"
#include "pg/boundary.hpp"

#include <cstdio>

namespace pg_throttle::pg {
namespace {

// The group's key: "<bytes of queue>:<queue>:<group_key>".
void group_key(FunctionCallInfo fcinfo, RegistryKey* key) {
    require_not_null(fcinfo, 0, "queue");
    require_not_null(fcinfo, 1, "group_key");
    const text* queue = PG_GETARG_TEXT_PP(0);
    const text* group = PG_GETARG_TEXT_PP(1);
    const size_t queue_len = VARSIZE_ANY_EXHDR(queue);
    const size_t group_len = VARSIZE_ANY_EXHDR(group);
    char name[core::kMaxNameBytes + 1];
    const int prefix = std::snprintf(name, sizeof name, "%zu:", queue_len);
    const size_t len = static_cast<size_t>(prefix) + queue_len + 1 + group_len;
    if (len > core::kMaxNameBytes) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("group_key is too long"),
                        errdetail("Queue name and group_key together take %zu bytes; the limit "
                                  "is %zu bytes.",
                                  len, core::kMaxNameBytes)));
    }
    char* pos = name + prefix;
    memcpy(pos, VARDATA_ANY(queue), queue_len);
    pos[queue_len] = ':';
    memcpy(pos + queue_len + 1, VARDATA_ANY(group), group_len);
    registry_make_key(EntryKind::kQueueGroup, name, len, "group", key);
}

// (queue, group_key, worker, lease) -> the claim's fence token, or NULL.
Datum group_take(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    group_key(fcinfo, &key);
    require_not_null(fcinfo, 3, "lease");
    const int64 lease = positive_interval(PG_GETARG_INTERVAL_P(3), "lease");
    const Holder holder = holder_from_argument(fcinfo, 2);
    const int64 token = lock_take(key, lease, 0, holder);
    if (token == 0) {
        PG_RETURN_NULL();
    }
    PG_RETURN_INT64(token);
}

// (queue, group_key, token) -> released.
Datum group_release(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    group_key(fcinfo, &key);
    require_not_null(fcinfo, 2, "token");
    PG_RETURN_BOOL(lock_release(key, PG_GETARG_INT64(2)));
}

// (queue, group_key, token, lease) -> renewed.
Datum group_renew(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    group_key(fcinfo, &key);
    require_not_null(fcinfo, 2, "token");
    require_not_null(fcinfo, 3, "lease");
    const int64 lease = positive_interval(PG_GETARG_INTERVAL_P(3), "lease");
    PG_RETURN_BOOL(lock_renew(key, PG_GETARG_INT64(2), lease) == RenewResult::kRenewed);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_take, pg_throttle::pg::group_take)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_release, pg_throttle::pg::group_release)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_renew, pg_throttle::pg::group_renew)
