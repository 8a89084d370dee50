// When each shard placement of a Citus cluster arrived on this node.
//
// A key's state lives in the shared memory of the node that holds its shard
// (placement.hpp). When Citus moves a shard here, the keys of that shard
// arrive with no record of what their old node granted: they are treated by
// the crash rules, as if granted at the arrival (the move rule). This table
// remembers, per (database, shard), the placement this node holds (the
// OID of the shard's relation here: a new one at each arrival) and when it
// arrived. A placement created with the shard (by throttle.distribute)
// arrived at no time: its keys were never anywhere else.
#pragma once

#include "core/time_math.hpp"
#include "pg/registry/registry.hpp"

#include <limits>
#include <optional>

namespace pg_throttle::pg {

void arrivals_request_shmem();
void arrivals_attach_shmem();

// When the placement of `shard_id` whose relation is `relid` arrived in the current database, if
// this node has noted it. Takes a shared LWLock; raises nothing.
std::optional<core::Micros> arrival_of(int64 shard_id, Oid relid);

// Notes that `relid` of `shard_id` arrived at `arrived_at`, replacing
// what an earlier placement of the shard left, and returns the arrival in
// force (an arrival another backend noted first wins). Raises 53200 when the
// table is full.
core::Micros arrival_note(int64 shard_id, Oid relid, core::Micros arrived_at);

}  // namespace pg_throttle::pg
