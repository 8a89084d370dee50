// Rate-limited claims: a queue named in throttle.queue_bucket hands out at
// most as many events as its bucket allows, one unit per event. claim and
// claim_group ask once they have locked the events they could claim, and
// claim only as many of them, in their order, as the bucket gave units for.
//
// The units are taken in shared memory at once, not at commit: a claim that
// rolls back has used them. The bucket errs on the side of fewer events,
// never more, also after a crash (a bucket is empty at the restart).
#pragma once

#include "pg/pg_headers.hpp"

namespace pg_throttle::pg {

// How many of `wanted` (> 0) events of `queue` the claim may have at `now`:
// `wanted` when no bucket limits the queue. Inside SPI_connect.
int64 claim_limit(const text* queue, int64 wanted, TimestampTz now);

// The first `count` ids of `ids` (0 < count <= its length), in the current
// memory context.
ArrayType* first_ids(ArrayType* ids, int count);

}  // namespace pg_throttle::pg
