#include "pg/queue/claim_lock.hpp"

#include "pg/server/kept_plan.hpp"

namespace pg_throttle::pg {
namespace {

// The statements reach the events given ($1) by `id = ANY ($1)` and the
// other events of their claims by `id = ANY (ARRAY(...))`: scans of the
// primary key, linear in the ids, as long as the planner cannot read the
// whole table instead and test each row against the array (half of a
// 10 000-event claim took 6 s through a plan made while the table was
// small, 10 s when statistics saw no claim at all and a join put the table
// first). So the callers, complete, fail and extend, run with enable_seqscan off
// (their SQL declarations), and no statement joins the table to the ids.
//
// The groups of the events that the claim $2 holds, each once: the
// statements below join a group's events to each group, never to each
// event (a group of 10 000 events would cost 10 000 times 10 000 rows).
#define CLAIM_GROUPS_OF_IDS                                      \
    "SELECT DISTINCT e.queue, e.group_key FROM throttle.event e" \
    " WHERE e.id = ANY ($1) AND e.group_key IS NOT NULL AND e.claim_token = $2"

// The events that the claim $2 holds in the group of c (a row of
// CLAIM_GROUPS_OF_IDS), found by event_groups: a subquery of its own
// (OFFSET 0 keeps the planner from joining it any other way), looked up
// once per group whatever the plan's statistics said of the table.
#define CLAIMED_IN_GROUP_OF_C                                                       \
    "SELECT x.id FROM throttle.event x"                                             \
    " WHERE x.queue = c.queue AND x.group_key = c.group_key AND x.claim_token = $2" \
    "   AND x.state IN ('pending', 'claimed') AND upper(x.state) = 'CLAIMED'"       \
    "   AND x.group_key IS NOT NULL OFFSET 0"

// The first step, one statement: the events given, in id order, if each is
// an ungrouped event of the claim (throttle.claim's claims; a claim's
// events are all grouped or all ungrouped): then nothing else needs a lock,
// and the result is NULL. Otherwise (grouped events, ids of no event of the
// claim, an id twice or NULL) it has locked no grouped event, so the steps
// below keep the one id order, and the result says whether the group
// claims of the events hold events besides them: more events claimed with
// the token in their groups than the events given (counts, not a test of
// each against $1: linear in the group's size, and NULL elements of $1
// change neither side). A claim's events are fixed when it is made and can
// only leave it, so a snapshot that shows none besides them stays right
// until the commit: then locking the events alone, in id order, is the next
// step, and lock_claim's group join (for a whole group, twice the cost of
// the rest of the lock) is not needed.
KeptPlan lock_start{
    "SELECT CASE"
    " WHEN (SELECT count(*) FROM (SELECT 1 FROM throttle.event g"
    "                             WHERE g.id = ANY ($1) AND upper(g.state) = 'CLAIMED'"
    "                               AND g.claim_token = $2 AND g.group_key IS NULL"
    "                               AND throttle._acts_as(g.claimed_role)"
    "                             ORDER BY g.id"
    "                             FOR UPDATE OF g) AS locked)"
    "      = cardinality($1) THEN NULL"
    " ELSE (SELECT count(*) FROM (" CLAIM_GROUPS_OF_IDS
    ") AS c"
    "       CROSS JOIN LATERAL (" CLAIMED_IN_GROUP_OF_C
    ") AS x)"
    "    > (SELECT count(*) FROM throttle.event e"
    "       WHERE e.id = ANY ($1) AND e.group_key IS NOT NULL AND e.claim_token = $2"
    "         AND upper(e.state) = 'CLAIMED')"
    " END",
    2,
    {INT8ARRAYOID, INT8OID},
    nullptr};

// The events of the claim, in id order: ungrouped events, or grouped ones
// whose group claims hold nothing else.
KeptPlan lock_events{
    "SELECT 1 FROM throttle.event g"
    " WHERE g.id = ANY ($1) AND upper(g.state) = 'CLAIMED' AND g.claim_token = $2"
    "   AND throttle._acts_as(g.claimed_role)"
    " ORDER BY g.id"
    " FOR UPDATE OF g",
    2,
    {INT8ARRAYOID, INT8OID},
    nullptr};

// With grouped events whose claims hold others: the events and the other
// events of their group claims (one id order for all). The group's events
// are found by event_groups, never through the partial indexes on
// state = 'claimed', which statistics of an idle moment count as nearly
// empty and which under churn hold many dead entries.
KeptPlan lock_claim{
    "SELECT 1 FROM throttle.event g"
    " WHERE g.id = ANY (ARRAY(SELECT unnest($1)"
    "                         UNION"
    "                         SELECT x.id FROM (" CLAIM_GROUPS_OF_IDS
    ") AS c"
    "                         CROSS JOIN LATERAL (" CLAIMED_IN_GROUP_OF_C
    ") AS x))"
    "   AND upper(g.state) = 'CLAIMED' AND g.claim_token = $2"
    "   AND throttle._acts_as(g.claimed_role)"
    " ORDER BY g.id"
    " FOR UPDATE OF g",
    2,
    {INT8ARRAYOID, INT8OID},
    nullptr};

#undef CLAIMED_IN_GROUP_OF_C
#undef CLAIM_GROUPS_OF_IDS

}  // namespace

void lock_claim_events(Datum ids, Datum token) {
    Datum args[2] = {ids, token};
    run_kept_plan(&lock_start, args, nullptr, SPI_OK_SELECT, 1);
    bool done = false;
    const Datum holds_others =
        SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &done);
    if (done) {
        return;
    }
    run_kept_plan(DatumGetBool(holds_others) ? &lock_claim : &lock_events, args, nullptr,
                  SPI_OK_SELECT);
}

}  // namespace pg_throttle::pg
