// throttle.extend(ids, token, lease): lengthens the claim `token` on the
// events to `lease` from now, natively (kept plans, kept_plan.hpp), while
// its lease holds: a claim whose lease has ended is not revived, since
// another worker may be claiming its events at this moment.
//
//  1. The key locks of the claim's concurrency_keys, shared (extends of one
//     key never wait for each other; a claim in progress holds the lock
//     exclusively, concurrency_keys.hpp), in key order;
//  2. the claim's events (claim_lock.hpp);
//  3. the clock, read after both waits, so that no claim in progress has
//     counted this one as ended;
//  4. lease_until moved to now + lease on the events the claim still holds
//     and the caller may act for, in a transaction whose commit is durable
//     (durable_commit.hpp): an extended lease is a promise;
//  5. the group leases of their group claims renewed to lease from now;
//  6. when the token did not hold every event given with a lease in force,
//     a NOTICE says so (claim_not_held.hpp).
#include "pg/registry/standby.hpp"
#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"
#include "pg/server/clock.hpp"
#include "pg/server/kept_plan.hpp"
#include "pg/queue/claim_lock.hpp"
#include "pg/queue/claim_not_held.hpp"
#include "pg/queue/durable_commit.hpp"
#include "pg/queue/group_lease.hpp"
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {
namespace {

// Step 1. Keys never change, so the events need no lock to be read for them.
KeptPlan lock_keys{
    "SELECT throttle._lock_concurrency_key(k.queue, k.concurrency_key)"
    " FROM (SELECT DISTINCT e.queue, e.concurrency_key FROM throttle.event e"
    "       WHERE e.id = ANY ($1) AND e.claim_token = $2 AND e.concurrency_key IS NOT NULL"
    "         AND upper(e.state) = 'CLAIMED' AND throttle._acts_as(e.claimed_role)"
    "       ORDER BY e.queue, e.concurrency_key) AS k",
    2,
    {INT8ARRAYOID, INT8OID},
    nullptr};

// Step 4: the (queue, group_key) of the extended events, each once (NULL
// for the ungrouped ones), and how many were extended.
KeptPlan extended_groups{
    "WITH extended AS ("
    "  UPDATE throttle.event e SET lease_until = $3 + $4"
    "  WHERE e.id = ANY ($1) AND upper(e.state) = 'CLAIMED' AND e.claim_token = $2"
    "    AND e.lease_until > $3 AND throttle._acts_as(e.claimed_role)"
    "  RETURNING e.queue, e.group_key)"
    " SELECT x.queue, x.group_key, (SELECT count(*) FROM extended)"
    " FROM (SELECT DISTINCT g.queue, g.group_key FROM extended g) AS x",
    4,
    {INT8ARRAYOID, INT8OID, TIMESTAMPTZOID, INTERVALOID},
    nullptr};

// (ids bigint[], token bigint, lease interval) -> integer, how many were
// extended.
Datum extend(FunctionCallInfo fcinfo) {
    standby_refuse("throttle.extend");
    require_not_null(fcinfo, 0, "ids");
    require_not_null(fcinfo, 1, "token");
    require_not_null(fcinfo, 2, "lease");
    const Interval* lease = PG_GETARG_INTERVAL_P(2);
    require_positive_interval(lease, "lease");
    require_ends_after(clock_now(), lease, "lease");
    registry_require();
    // Detoasted once: the statements and the NOTICE read this copy.
    const Datum ids = PointerGetDatum(PG_GETARG_ARRAYTYPE_P(0));
    const Datum token = PG_GETARG_DATUM(1);

    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    Datum key_args[2] = {ids, token};
    run_kept_plan(&lock_keys, key_args, nullptr, SPI_OK_SELECT);
    lock_claim_events(ids, token);
    const TimestampTz now = clock_now();
    require_ends_after(now, lease, "lease");

    Datum args[4] = {ids, token, TimestampTzGetDatum(now), PointerGetDatum(lease)};
    run_kept_plan(&extended_groups, args, nullptr, SPI_OK_SELECT);
    const uint64 rows = SPI_processed;
    bool is_null = false;
    const int64 extended = rows == 0
                               ? 0
                               : DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
                                                             SPI_tuptable->tupdesc, 3, &is_null));
    if (extended > 0) {
        require_durable_commit();
    }
    int64 lease_us = 0;  // in microseconds, once a group claim needs it
    for (uint64 i = 0; i < rows; i++) {
        const Datum group =
            SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &is_null);
        if (is_null) {
            continue;  // the ungrouped events
        }
        const Datum queue =
            SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &is_null);
        if (lease_us == 0) {
            lease_us = positive_interval(lease, "lease");
        }
        (void)group_lease_renew(DatumGetTextPP(queue), DatumGetTextPP(group), DatumGetInt64(token),
                                lease_us);
    }
    SPI_finish();
    notice_claim_not_held("throttle.extend", ids, static_cast<uint64>(extended), kClaimExtendHint);
    PG_RETURN_INT32(static_cast<int32>(extended));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_extend, pg_throttle::pg::extend)
