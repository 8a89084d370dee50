// Backends queued for a named lock: one slot per backend in shared memory.
//
// The slots are the one source of truth for who waits; the entry's
// of.lock.waiters is their count, changed only here, in the same critical
// section as the slot's `waiting` flag: under the partition lock of the key
// and the registry's waiters lock, in that order. Releasing a lock hands it
// to the earliest waiter of its key (arrival order) and sets that backend's
// latch: no polling and no thundering herd.
#pragma once

#include "core/names.hpp"
#include "pg/registry/registry.hpp"

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
    Oid role;        // the role the lock is granted to
    bool waiting;
    char holder[core::kMaxHolderBytes + 1];
};
static_assert(std::is_trivially_copyable_v<WaiterSlot>);

Size waiters_shmem_size();
void waiters_attach_shmem();

// This backend's slot.
WaiterSlot* my_waiter_slot();

// Raises an error unless this process has a waiter slot (every process that
// runs SQL has one). Call before taking any LWLock.
void waiter_slot_check();

// Queues this backend for `entry` and counts it (caller holds the entry's
// partition lock exclusively; takes the waiters lock itself).
void waiter_enqueue(RegistryEntry* entry, int64 ttl, const char* holder, Oid role);

// The earliest backend waiting for `entry`, or null. Caller holds the
// entry's partition lock exclusively and the waiters lock.
WaiterSlot* waiter_earliest(const RegistryEntry& entry);

// Takes `slot` out of the queue of `entry` and uncounts it. Caller holds the
// entry's partition lock exclusively and the waiters lock.
void waiter_dequeue(RegistryEntry* entry, WaiterSlot* slot);

// This backend's slot, when the entry it waited for is gone (nothing counts
// it any more): out of every queue. Takes the waiters lock itself.
void waiter_forget_mine();

}  // namespace pg_throttle::pg
