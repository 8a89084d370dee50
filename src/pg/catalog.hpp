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

}  // namespace pg_throttle::pg
