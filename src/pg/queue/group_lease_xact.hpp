// Group leases follow the transaction that claims or finishes the group.
//
// A group's lease lives in shared memory and takes effect at once, so that a
// concurrent claim_group skips the group without waiting for any row. The
// rows it stands for are transactional, so the lease follows them:
//
// - a lease taken by a transaction (claim_group) that rolls back, whole or to
//   a savepoint, is released at that rollback: the events stay pending and
//   the group is free again;
// - a release asked for by complete or fail happens when their transaction
//   has committed, not before: until then the rows still say "claimed" to
//   every other session, and the lease keeps other workers off the group
//   instead of leaving them to wait on its row locks. (A commit that fails,
//   a serialization failure, keeps the lease.)
//
// At PREPARE TRANSACTION neither happens: a lease taken stays until it
// expires or is released, and a release asked for is dropped, so the group
// stays held until its lease expires. Both err on the side of holding.
#pragma once

#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {

// Makes room to record one more lease, before it is taken: recording it
// then cannot fail.
void group_lease_make_room();

// Records that this transaction took the group lease `key` with `token`.
void group_lease_taken_in_transaction(const RegistryKey& key, int64 token);

// Releases the group lease `key` held with `token` when this transaction
// (or the savepoint it runs in, with its parents) commits.
void group_lease_release_at_commit(const RegistryKey& key, int64 token);

}  // namespace pg_throttle::pg
