// Reads of the extension's catalog tables (declared configuration).
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// The interval declared for `resource` in throttle.resource; raises 42704
// with a hint when the resource is not declared there.
Interval declared_resource_interval(const text* resource);

struct DeclaredBucket {
    int32 rate;
    Interval per;
    bool burst_is_null;
    int32 burst;
};

// The bucket declared for `key` in throttle.bucket; raises 42704 with a hint
// when it is not declared there.
DeclaredBucket declared_bucket(const text* key);

// The buckets that limit the claims of a queue, read in one statement: its
// own (throttle.queue_bucket; the name in the memory context current at the
// call) and the shape of each group's (throttle.group_bucket).
struct QueueBuckets {
    bool queue_limited;
    text* queue_bucket_name;
    DeclaredBucket queue_bucket;
    bool groups_limited;
    DeclaredBucket group_bucket;
};
QueueBuckets queue_buckets(const text* queue);

// A queue's own bucket read by a statement with other things: its columns
// (rate, per, burst, name; NULLs when the queue has none) and the FROM clause
// that finds them for the queue $1.
#define PG_THROTTLE_QUEUE_BUCKET_COLUMNS "qb.rate, qb.per, qb.burst, qb.name"
#define PG_THROTTLE_QUEUE_BUCKET_FROM                             \
    " FROM (SELECT $1::text AS queue) x"                          \
    " LEFT JOIN (throttle.queue_bucket q JOIN throttle.bucket qb" \
    "            ON qb.name = q.bucket) ON q.queue = x.queue"

// The queue's bucket in PG_THROTTLE_QUEUE_BUCKET_COLUMNS at column `first`
// of `row`: false when the queue has none; else its shape and its name (in
// the current memory context).
bool queue_bucket_in_row(HeapTuple row, TupleDesc desc, int first, DeclaredBucket* bucket,
                         text** name);

}  // namespace pg_throttle::pg
