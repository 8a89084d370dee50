// How claim_group hands out the groups of a queue (throttle.group_policy),
// and the lock that makes a change of it exact: every claim_group holds the
// policy lock of its database shared until its transaction ends, and every
// statement that changes the table takes it exclusively first (a trigger),
// so a change waits for the claims in progress and the claims after it read
// the new policy.
#pragma once

#include "pg/pg_headers.hpp"

namespace pg_throttle::pg {

struct GroupPolicy {
    int32 workers;      // how many claims may hold one group at once
    bool strict_order;  // events in id order, a failed one holding back the rest
};

// Takes the policy lock shared and reads the policy of `queue` as the last
// committed change left it (also under repeatable read): one worker and no
// strict order when the queue is not named. Inside SPI_connect.
GroupPolicy group_policy_for_claim(const text* queue);

}  // namespace pg_throttle::pg
