// The lease that holds a group of the event queue: one registry entry of its
// own kind per (queue, group_key), taken by claim_group and released when
// the group's claim ends (group_lease_xact.hpp ties it to transactions).
#pragma once

#include "pg/holder.hpp"
#include "pg/registry.hpp"

namespace pg_throttle::pg {

// The registry key of the lease of group `group_key` of `queue`.
void group_lease_key(const text* queue, const text* group_key, RegistryKey* key);

// Takes the group's lease for `lease_us` microseconds for `holder`, recorded
// for this transaction (released if it rolls back); its fence token, or 0
// when another claim holds it.
int64 group_lease_take(const RegistryKey& key, int64 lease_us, const Holder& holder);

}  // namespace pg_throttle::pg
