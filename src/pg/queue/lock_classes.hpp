// The classes of pg_throttle's own advisory locks: field 4 of the lock tag,
// which pg_advisory_lock's keys (1 for one bigint, 2 for two integers) never
// use, so no role can take or block these through SQL. pg_locks shows the
// class as objsubid.
#pragma once

#include "pg/pg_headers.hpp"

namespace pg_throttle::pg {

// The queue policies of a database (policy_lock.hpp): objsubid 28788, "pt".
inline constexpr uint16 kPolicyLockClass = 0x7074;

// A concurrency_key of a queue, while a claim counts and takes its events
// (concurrency_keys.hpp): objsubid 28789, "pu".
inline constexpr uint16 kConcurrencyKeyLockClass = 0x7075;

}  // namespace pg_throttle::pg
