// How complete, fail and extend lock a claim's events before they change
// them: in id order, the events given (one statement when they are all
// ungrouped events of the claim) and, when their group claims hold
// others, every other event of those claims. One order for all three, so they never deadlock on one
// claim, and two transactions that each finish part of a group claim see each other's end (the last
// one releases the group).
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// Locks (FOR UPDATE) the events `ids` (bigint[]) that the claim `token`
// (bigint) holds and that the caller may act for, and the other events of
// their group claims when there are any. Inside SPI_connect, with
// enable_seqscan off (claim_lock.cpp says why).
void lock_claim_events(Datum ids, Datum token);

}  // namespace pg_throttle::pg
