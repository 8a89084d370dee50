// Reads of the extension's catalog tables (declared configuration).
#pragma once

#include "pg/pg_headers.hpp"

namespace pg_throttle::pg {

// The interval declared for `resource` in throttle.resource; raises 42704
// with a hint when the resource is not declared there.
Interval declared_resource_interval(const text* resource);

}  // namespace pg_throttle::pg
