// How claim_group hands out the groups of a queue (throttle.group_policy),
// read under the policy lock (policy_lock.hpp), which makes a change exact.
#pragma once

#include "pg/server/pg_headers.hpp"

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
