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
#pragma once

#include "pg/bucket.hpp"

namespace pg_throttle::pg {

struct ClaimLimit {
    bool limited;  // false: no bucket limits the queue
    BucketRequest bucket;
};

// The limit of `queue`'s claims. Inside SPI_connect.
ClaimLimit claim_limit_of(const text* queue);

// How many of `wanted` (> 0) events the bucket has units for at `now`,
// without taking them: `wanted` when the queue is not limited.
int64 claim_limit_available(const ClaimLimit& limit, TimestampTz now, int64 wanted);

// Takes units for up to `wanted` (> 0) events at `now`; how many it took
// (`wanted` when the queue is not limited).
int64 claim_limit_take(const ClaimLimit& limit, TimestampTz now, int64 wanted);

}  // namespace pg_throttle::pg
