// Rate-limited claims: a queue named in throttle.queue_bucket hands out at
// most as many events as its bucket allows, one unit per event. claim and
// claim_group look the bucket up once per call, peek at its units before
// they lock events (so that they lock no more than they may claim), take
// units for the events they locked, and claim only as many of them, in their
// order, as the bucket gave units for.
//
// The units are the queue's own: a registry entry of kind kQueueBucket,
// named after the bucket, with its shape from throttle.bucket, that no
// throttle.take reaches. They are taken in shared memory at once, not at
// commit: a claim that rolls back has used them. The bucket errs on the side
// of fewer events, never more, also after a crash (it is empty at the
// restart).
//
// A queue named in throttle.group_bucket also gives each group a bucket of
// its own, of the declared shape: an entry of kind kQueueGroupBucket named
// after the queue and the group (as the group's lease is, group_lease.hpp).
// claim_group passes over a group whose bucket is empty, and takes the
// queue's units for no more than the group's bucket has, then the group's.
#pragma once

#include "pg/rate/bucket.hpp"

namespace pg_throttle::pg {

struct ClaimLimit {
    bool limited;  // false: no bucket limits the queue
    BucketRequest bucket;
};

// How many of `wanted` (> 0) events the bucket has units for at `now`,
// without taking them: `wanted` when the queue is not limited.
int64 claim_limit_available(const ClaimLimit& limit, TimestampTz now, int64 wanted);

// Takes units for up to `wanted` (> 0) events at `now`; how many it took
// (`wanted` when the queue is not limited).
int64 claim_limit_take(const ClaimLimit& limit, TimestampTz now, int64 wanted);

struct GroupLimit {
    bool limited;  // false: the queue's groups have no bucket of their own
    DeclaredBucket declared;
};

struct ClaimLimits {
    ClaimLimit queue;
    GroupLimit groups;
};

// The limit of a queue whose bucket (throttle.queue_bucket) is `declared`,
// named `name`; not limited when `declared` is nullptr.
ClaimLimit claim_limit_declared(const text* name, const DeclaredBucket* declared);

// The limits of `queue`'s claims and of each of its groups, from one
// catalog statement. Inside SPI_connect.
ClaimLimits claim_limits_of(const text* queue);

// As claim_limit_available and claim_limit_take, for the bucket of the group
// `group_key` of `queue`.
int64 group_limit_available(const GroupLimit& limit, const text* queue, const text* group_key,
                            TimestampTz now, int64 wanted);
int64 group_limit_take(const GroupLimit& limit, const text* queue, const text* group_key,
                       TimestampTz now, int64 wanted);

}  // namespace pg_throttle::pg
