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

// The bucket that limits the claims of `queue` (throttle.queue_bucket):
// false when none does; otherwise its name (in the memory context current at
// the call) and shape.
bool queue_bucket(const text* queue, text** name, DeclaredBucket* bucket);

// The shape of the bucket that each group of `queue` has for itself
// (throttle.group_bucket): false when the queue's groups have none.
bool group_bucket(const text* queue, DeclaredBucket* bucket);

}  // namespace pg_throttle::pg
