// How claim_group hands out the groups of a queue (throttle.group_policy),
// read under the policy lock (policy_lock.hpp), which makes a change exact;
// and what of the queue is paused (throttle.queue_pause), read with it.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

struct GroupPolicy {
    int32 workers;             // how many claims may hold one group at once
    bool strict_order;         // events in id order, a failed one holding back the rest
    bool round_robin;          // fairness = 'round_robin': due groups in turn (fair_cursors.hpp)
    bool paused;               // the whole queue is paused: no group is handed out
    ArrayType* paused_groups;  // the groups paused on their own (text[]); nullptr: none
};

// Takes the policy lock shared and reads the policy of `queue` as the last
// committed change left it (also under repeatable read): one worker, no
// strict order and oldest first when the queue is not named. The pauses come from the same
// statement, as the last committed pause or resume left them (no lock: a
// pause that commits while a claim runs binds the claims after it).
// Inside SPI_connect; paused_groups is allocated in the current memory
// context.
GroupPolicy group_policy_for_claim(const text* queue);

// Whether `queue` is paused as the last committed pause or resume left it
// (the latest snapshot, also under repeatable read). Inside SPI_connect.
bool queue_paused_now(const text* queue);

// Whether this database has throttle.queue_pause: not while its SQL is still
// 0.3.0's, on this module, before ALTER EXTENSION ... UPDATE (nor, then,
// throttle.group_policy.fairness, which the update adds with it).
bool pauses_installed();

}  // namespace pg_throttle::pg
