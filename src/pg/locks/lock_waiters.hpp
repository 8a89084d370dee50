// Backends queued for a named lock: one slot per backend in shared memory.
//
// A slot is changed only under the partition lock of its key and the
// registry's waiters lock, in that order. Releasing a lock hands it to the
// earliest waiter of its key (arrival order) and sets that backend's latch:
// no polling and no thundering herd.
#pragma once

#include "core/names.hpp"
#include "pg/registry.hpp"

namespace pg_throttle::pg {

struct WaiterSlot {
    RegistryKey key;
    uint64 arrival;       // order of arrival; meaningful while waiting
    int64 ttl;            // microseconds; 0 for a session lock
    int64 granted_token;  // set by the backend that handed the lock over, with:
    int64 granted_seq;    //   the entry's lease journal sequence number then
    int64 granted_at;     //   and the time of the hand-over (real clock)
    int32 pid;
    int32 pgprocno;  // whose latch to set
    bool waiting;
    char holder[core::kMaxHolderBytes + 1];
};
static_assert(std::is_trivially_copyable_v<WaiterSlot>);

Size waiters_shmem_size();
void waiters_attach_shmem();

// This backend's slot.
WaiterSlot* my_waiter_slot();

// Queues this backend for `key` (caller holds the key's partition lock
// exclusively; takes the waiters lock itself).
void waiter_enqueue(const RegistryKey& key, int64 ttl, const char* holder);

// The earliest backend waiting for `key`, or null. Caller holds the key's
// partition lock exclusively and the waiters lock; clearing the slot's
// `waiting` takes it out of the queue.
WaiterSlot* waiter_earliest(const RegistryKey& key);

}  // namespace pg_throttle::pg
