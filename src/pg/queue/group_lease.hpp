// The leases that hold a group of the event queue: registry entries of their
// own kind, one per (queue, group_key, slot), taken by claim_group and
// released when the group's claim ends (group_lease_xact.hpp ties them to
// transactions). A queue whose groups may have up to N workers at once
// (throttle.group_policy) uses slots 0 to N - 1, one per claim.
#pragma once

#include "pg/registry/holder.hpp"
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {

// The most workers throttle.group_policy lets hold one group.
inline constexpr int kMaxGroupWorkers = 64;
// The most bytes of a queue's name, which is also its NOTIFY channel
// (NAMEDATALEN - 1).
inline constexpr size_t kMaxQueueBytes = 63;

// The registry key of lease `slot` (0 to kMaxGroupWorkers - 1) of group
// `group_key` of `queue`.
void group_lease_key(const text* queue, const text* group_key, int slot, RegistryKey* key);

// The same name for an entry of another `kind` that belongs to a group
// (a group's bucket, EntryKind::kQueueGroupBucket, with slot 0).
void queue_group_key(EntryKind kind, const text* queue, const text* group_key, int slot,
                     RegistryKey* key);

// The key of the slot of the group that a lease held with `token` holds;
// false when none does (it ended, or another claim took its slot).
bool group_lease_find(const text* queue, const text* group_key, int64 token, RegistryKey* key);

// Renews the slot of the group that a lease held with `token` holds, to
// `lease_us` microseconds from now; false when none does.
bool group_lease_renew(const text* queue, const text* group_key, int64 token, int64 lease_us);

// Takes the group's lease for `lease_us` microseconds for `holder`, recorded
// for this transaction (released if it rolls back); its fence token, or 0
// when another claim holds it.
int64 group_lease_take(const RegistryKey& key, int64 lease_us, const Holder& holder);

}  // namespace pg_throttle::pg
