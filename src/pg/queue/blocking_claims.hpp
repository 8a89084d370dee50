// Expired claims of the other claimer that hold back a newer run.
//
// No claimer takes a pending event whose item_key has a claimed run: it
// waits for that run to end. Each claimer takes over the expired claims of
// its own kind (claim: events without a group_key; claim_group: grouped
// ones), and an expired claim that a newer pending run supersedes then ends
// cancelled. A newer run of the other kind (a grouped run behind an expired
// claim of throttle.claim, or an ungrouped one behind an expired group
// claim) would wait for a claimer of the other kind, and forever in a queue
// that has none. So each claimer also ends the expired claims of the other
// kind whose item_key has a due pending run of its own kind, as the other
// claimer would have: cancelled, superseded by that run, their attempt
// expired in throttle.event_attempt (throttle._fence_claims). In a group
// kept in strict order, the later events of such a claim end with it, their
// attempt given back (they waited behind it). A claim whose lease holds is
// never touched: a claimed event and its pending successor never run at
// once while its lease holds.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// Whether the pending run of c's item_key, if any, is due at $2 and of the
// kind `grouped` ("IS NULL": without a group_key, "IS NOT NULL": with one).
// The run is found by event_pending_key (one per item_key), and tested
// outside the lookup's WHERE: there, a test of group_key would let the
// planner walk a partial index of due events instead (event_due_single,
// event_due_grouped), every due event of the queue for each claim.
#define PG_THROTTLE_DUE_RUN_OF_C(grouped)                   \
    "(SELECT u.run_at <= $2 AND u.group_key " grouped       \
    "   FROM throttle.event u"                              \
    "  WHERE u.queue = c.queue AND u.item_key = c.item_key" \
    "    AND u.state = 'pending' LIMIT 1) IS TRUE"

// Whether queue $1 has such claims at $2 for throttle.claim: expired claims
// of claim_group whose item_key has a due pending run without a group_key
// (a boolean expression). Along event_leases_grouped, which holds the
// queue's group claims by lease end, so it reads the expired ones only
// (ORDER BY its order keeps the generic plan on it, whatever the statistics
// said), and one probe of event_pending_key for each.
#define PG_THROTTLE_ANY_BLOCKING_GROUP_CLAIM                               \
    "(SELECT 1 FROM throttle.event c"                                      \
    "  WHERE c.queue = $1 AND c.state = 'claimed' AND c.lease_until <= $2" \
    "    AND c.group_key IS NOT NULL AND " PG_THROTTLE_DUE_RUN_OF_C(       \
        "IS NULL") "  ORDER BY c.lease_until, c.id LIMIT 1) IS NOT NULL"

// The claimer that ends them.
enum class Claimer : int { kClaim, kClaimGroup };

// Ends, for `claimer`, the expired claims of the other kind in `queue`
// (text) whose item_key has a due pending run of its kind at `now`, those
// it can lock without waiting (SKIP LOCKED: one that another transaction
// is changing is left for later), and NOTIFYs those runs. Returns how many
// it ended. Inside SPI_connect; replaces SPI_tuptable.
uint64 end_blocking_claims(Datum queue, TimestampTz now, Claimer claimer);

}  // namespace pg_throttle::pg
