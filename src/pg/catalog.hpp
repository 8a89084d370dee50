// Reads of the extension's catalog tables (declared configuration).
#pragma once

#include "pg/pg_headers.hpp"

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

}  // namespace pg_throttle::pg
