// Expired claims of the other claimer that hold back a newer run
// (blocking_claims.hpp): found and locked by one statement, ended by
// throttle._fence_claims (which cancels them, superseded by the newer run)
// only when there are some.
#include "pg/queue/blocking_claims.hpp"

#include "pg/server/kept_plan.hpp"

namespace pg_throttle::pg {
namespace {

// The expired claims of queue $1 at $2 whose item_key has a due pending run
// of the other kind, locked: found along the partial index of the queue's
// claims by lease end (event_leases_grouped, event_leases_single: their
// order, whatever the statistics said), the runs by event_pending_key, one
// lookup each. Then the ids to end, as an array (NULL: none), and those
// among them that never ran (uncharged).
#define BLOCKING_CLAIMS(claim_grouped, run_grouped) \
    "  SELECT c.id, c.queue, c.group_key, c.claim_token"                   \
    "  FROM throttle.event c"                                              \
    "  WHERE c.queue = $1 AND c.state = 'claimed' AND c.lease_until <= $2" \
    "    AND c.group_key " claim_grouped                                   \
    "    AND " PG_THROTTLE_DUE_RUN_OF_C(run_grouped)                       \
    "  ORDER BY c.lease_until, c.id"                                       \
    "  FOR UPDATE OF c SKIP LOCKED"

// For claim: claim_group's expired claims. In a group kept in strict order
// the events of such a claim after the one ended never ran (they waited
// behind it): they are ended too, as long as their own lease has ended as
// well (one the worker extended is still its), or a takeover of the group
// would charge the first of them as the one that ran. Of the events ended,
// those of a strict group with an earlier claimed event of the same claim
// never ran, and get their attempt back (uncharged).
KeptPlan blocking_group_claims{
    "WITH blocking AS (" BLOCKING_CLAIMS("IS NOT NULL", "IS NULL") "),"
    " later AS ("
    "  SELECT l.id, l.queue, l.group_key, l.claim_token FROM throttle.event l"
    "  WHERE l.id = ANY (ARRAY("
    "          SELECT x.id FROM blocking b"
    "          CROSS JOIN LATERAL (SELECT x.id FROM throttle.event x"  // event_claimed_groups
    "                              WHERE x.queue = b.queue AND x.group_key = b.group_key"
    "                                AND x.group_key IS NOT NULL AND x.state = 'claimed'"
    "                                AND x.claim_token = b.claim_token AND x.id > b.id"
    "                                AND x.lease_until <= $2"
    "                              OFFSET 0) AS x"
    "          WHERE EXISTS (SELECT 1 FROM throttle.group_policy p"
    "                        WHERE p.queue = b.queue AND p.strict_order)))"
    "    AND upper(l.state) = 'CLAIMED' AND l.lease_until <= $2"
    "  FOR UPDATE OF l SKIP LOCKED),"
    " ended AS (SELECT b.id, b.queue, b.group_key, b.claim_token FROM blocking b"
    "           UNION SELECT l.id, l.queue, l.group_key, l.claim_token FROM later l)"
    " SELECT (SELECT array_agg(n.id) FROM ended n),"
    "        ARRAY(SELECT n.id FROM ended n"
    "              WHERE EXISTS (SELECT 1 FROM throttle.group_policy p"
    "                            WHERE p.queue = n.queue AND p.strict_order)"
    "                AND EXISTS (SELECT 1 FROM throttle.event x"  // event_claimed_groups
    "                            WHERE x.queue = n.queue AND x.group_key = n.group_key"
    "                              AND x.group_key IS NOT NULL AND x.state = 'claimed'"
    "                              AND x.claim_token = n.claim_token AND x.id < n.id))",
    2,
    {TEXTOID, TIMESTAMPTZOID},
    nullptr};

// For claim_group: claim's (no group, no order: every one ran).
KeptPlan blocking_single_claims{
    "SELECT array_agg(b.id), '{}'::bigint[]"
    " FROM (" BLOCKING_CLAIMS("IS NULL", "IS NOT NULL") ") AS b",
    2,
    {TEXTOID, TIMESTAMPTZOID},
    nullptr};

#undef BLOCKING_CLAIMS

// Ends the claims $1 (locked) at $2, those in $3 uncharged, and NOTIFYs the
// runs they held back.
KeptPlan end_claims{
    "SELECT count(*), throttle._notify_successors(array_agg(f))"
    " FROM throttle._fence_claims($1, $2, $3) AS f",
    3,
    {INT8ARRAYOID, TIMESTAMPTZOID, INT8ARRAYOID},
    nullptr};

}  // namespace

uint64 end_blocking_claims(Datum queue, TimestampTz now, Claimer claimer) {
    Datum args[2] = {queue, TimestampTzGetDatum(now)};
    run_kept_plan(claimer == Claimer::kClaim ? &blocking_group_claims : &blocking_single_claims,
                  args, nullptr, SPI_OK_SELECT, 1);
    bool none = true;
    bool is_null = true;
    const Datum ids = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &none);
    if (none) {
        return 0;
    }
    const Datum uncharged =
        SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &is_null);
    Datum end_args[3] = {ids, TimestampTzGetDatum(now), uncharged};
    run_kept_plan(&end_claims, end_args, nullptr, SPI_OK_SELECT, 1);
    return static_cast<uint64>(
        DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null)));
}

}  // namespace pg_throttle::pg
