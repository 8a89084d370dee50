#include "pg/locks/lock_waiters.hpp"

#include "pg/server/compat.hpp"

namespace pg_throttle::pg {
namespace {

WaiterSlot* slots = nullptr;
int slot_count = 0;
uint64* arrivals = nullptr;  // shared arrival counter, right after the slots

bool same_key(const RegistryKey& a, const RegistryKey& b) {
    return a.dbid == b.dbid && a.kind == b.kind && a.name_len == b.name_len &&
           memcmp(a.name, b.name, a.name_len) == 0;
}

}  // namespace

Size waiters_shmem_size() {
    return add_size(mul_size(MaxBackends + 1, sizeof(WaiterSlot)), sizeof(uint64));
}

void waiters_attach_shmem() {
    bool found = false;
    slot_count = MaxBackends + 1;
    slots = static_cast<WaiterSlot*>(
        ShmemInitStruct("pg_throttle lock waiters", waiters_shmem_size(), &found));
    arrivals = reinterpret_cast<uint64*>(slots + slot_count);
    if (!found) {
        memset(static_cast<void*>(slots), 0, waiters_shmem_size());
    }
}

WaiterSlot* my_waiter_slot() {
    const int slot = compat_my_backend_slot();
    Assert(slot > 0 && slot < slot_count);
    return &slots[slot];
}

void waiter_slot_check() {
    const int slot = compat_my_backend_slot();
    if (slot <= 0 || slot >= slot_count) {
        ereport(
            ERROR,
            (errcode(ERRCODE_INTERNAL_ERROR), errmsg("this process has no pg_throttle waiter slot"),
             errdetail("Its backend slot %d is outside 1 .. %d.", slot, slot_count - 1)));
    }
}

void waiter_enqueue(RegistryEntry* entry, int64 ttl, const char* holder, Oid role) {
    WaiterSlot* slot = my_waiter_slot();
    LWLockAcquire(registry_waiters_lock(), LW_EXCLUSIVE);
    slot->key = entry->key;
    slot->arrival = ++*arrivals;
    slot->ttl = ttl;
    slot->granted_token = 0;
    slot->pid = MyProcPid;
    slot->pgprocno = compat_my_pgprocno();
    slot->role = role;
    strlcpy(slot->holder, holder, sizeof slot->holder);
    slot->waiting = true;
    entry->of.lock.waiters++;
    LWLockRelease(registry_waiters_lock());
}

void waiter_dequeue(RegistryEntry* entry, WaiterSlot* slot) {
    Assert(slot->waiting && same_key(slot->key, entry->key));
    slot->waiting = false;
    entry->of.lock.waiters--;
}

void waiter_forget_mine() {
    LWLockAcquire(registry_waiters_lock(), LW_EXCLUSIVE);
    my_waiter_slot()->waiting = false;
    LWLockRelease(registry_waiters_lock());
}

WaiterSlot* waiter_earliest(const RegistryEntry& entry) {
    const RegistryKey& key = entry.key;
    WaiterSlot* earliest = nullptr;
    for (int i = 1; i < slot_count; i++) {
        WaiterSlot* slot = &slots[i];
        if (slot->waiting && same_key(slot->key, key) &&
            (earliest == nullptr || slot->arrival < earliest->arrival)) {
            earliest = slot;
        }
    }
    return earliest;
}

}  // namespace pg_throttle::pg
