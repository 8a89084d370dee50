// Where a key lives when throttle.distribute() has spread the database over
// a Citus cluster (docs/operations.md, "Scale-out with Citus").
//
// Every key-taking function (acquire, take, allow, wait, lock, unlock, renew,
// reset) is then a Citus distributed function, colocated with the anchor
// table throttle.key_shard: Citus runs each call on the node that holds the
// shard of its key. Before such a call touches the registry it checks that
// this node holds that shard, under Citus's own shard metadata lock, so that
// a shard move waits for the calls in progress on its old node and no call
// runs there once the move has committed. A key whose shard arrived here by a
// move is treated by the crash rules, as if granted at the arrival
// (arrivals.hpp): the move rule.
#pragma once

#include "core/time_math.hpp"
#include "pg/server/pg_headers.hpp"
#include "pg/registry/registry.hpp"
#include "pg/scale_out/arrivals.hpp"

namespace pg_throttle::pg {

// For a key of `kind` named `name` in the current database: when the
// database is distributed, checks that this node holds the key's shard and
// notes when that shard arrived, for placement_moved_in_at. Does nothing on
// a database throttle.distribute() has not touched. Raises 55000 when the
// shard is on another node (a call Citus did not delegate, or one that lost
// a race with a shard move: a retry through the coordinator finds the new
// node). Holds Citus's shard metadata lock until the transaction ends
// (placement_pause releases it early for a sleep).
void placement_enter(EntryKind kind, const char* name, size_t len);

// For a call about to sleep (throttle.wait, a lock waiter): releases the
// shard metadata lock placement_enter took, so that a move of the shard need
// not wait for the sleep, nor every call of the shard queue behind that move.
// placement_resume takes it again and raises 55000 when the shard has left
// this node meanwhile (also when it left and came back). No-ops when the
// database is not distributed.
void placement_pause();
void placement_resume();

// Whether the last placement_enter of this backend found the database
// distributed (a session lock is then refused).
bool placement_distributed();

// When the shard of `key` moved to this node (kNeverMoved if it never did,
// or the key is not distributed): entries granted before then are stale and
// a key nobody has asked for since is born as granted then. Raises nothing.
core::Micros placement_moved_in_at(const RegistryKey& key);

// Whether `kind` is spread by key over a Citus cluster.
bool placement_kind_distributed(EntryKind kind);

}  // namespace pg_throttle::pg
