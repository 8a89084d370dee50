// The round-robin cursors in shared memory; see fair_cursors.hpp.
#include "pg/queue/fair_cursors.hpp"

namespace pg_throttle::pg {
namespace {

constexpr int kSlots = 256;
constexpr int kQueueBytes = 64;  // a queue name is at most 63 bytes (event_queue_check)
constexpr int kKeyBytes = 1024;  // a group_key or concurrency_key: at most 1024 bytes (schedule)
constexpr const char* kTrancheName = "pg_throttle fair cursors";

struct CursorSlot {
    Oid dbid;     // InvalidOid: free
    int32 turns;  // FairTurns
    uint32 hash;
    uint64 last_used;
    int32 queue_length;
    int32 key_length;
    bool has_hint;  // FairTurns::kConcurrencyKeys: `hint` holds
    NoKeyHint hint;
    char queue[kQueueBytes];
    char key[kKeyBytes];
};

struct CursorsShared {
    uint64 uses;
    CursorSlot slots[kSlots];
};
static_assert(std::is_trivially_copyable_v<CursorsShared>);

CursorsShared* shared = nullptr;
LWLock* lock = nullptr;

// The slot of (MyDatabaseId, turns, queue), or -1. Under the lock.
int find(FairTurns turns, const char* queue, int length, uint32 hash) {
    for (int i = 0; i < kSlots; i++) {
        const CursorSlot& slot = shared->slots[i];
        if (slot.dbid == MyDatabaseId && slot.turns == static_cast<int32>(turns) &&
            slot.hash == hash && slot.queue_length == length &&
            memcmp(slot.queue, queue, static_cast<size_t>(length)) == 0) {
            return i;
        }
    }
    return -1;
}

// A free slot, or the one used longest ago. Under the lock, exclusive.
int take_slot() {
    int oldest = 0;
    for (int i = 0; i < kSlots; i++) {
        if (shared->slots[i].dbid == InvalidOid) {
            return i;
        }
        if (shared->slots[i].last_used < shared->slots[oldest].last_used) {
            oldest = i;
        }
    }
    return oldest;
}

uint32 hash_of(const char* bytes, int length) {
    return hash_bytes(reinterpret_cast<const unsigned char*>(bytes), length);
}

}  // namespace

void fair_cursors_request_shmem() {
    RequestAddinShmemSpace(MAXALIGN(sizeof(CursorsShared)));
    RequestNamedLWLockTranche(kTrancheName, 1);
}

void fair_cursors_attach_shmem() {
    bool found = false;
    shared = static_cast<CursorsShared*>(
        ShmemInitStruct("pg_throttle fair cursors", sizeof(CursorsShared), &found));
    if (!found) {
        memset(shared, 0, sizeof(CursorsShared));
    }
    lock = &GetNamedLWLockTranche(kTrancheName)[0].lock;
}

text* fair_cursor_of(FairTurns turns, const text* queue) {
    const int length = static_cast<int>(VARSIZE_ANY_EXHDR(queue));
    if (shared == nullptr || length >= kQueueBytes) {
        return nullptr;
    }
    const char* bytes = VARDATA_ANY(queue);
    const uint32 hash = hash_of(bytes, length);
    char key[kKeyBytes];
    int key_length = -1;
    LWLockAcquire(lock, LW_SHARED);
    const int found = find(turns, bytes, length, hash);
    if (found >= 0) {
        key_length = shared->slots[found].key_length;
        memcpy(key, shared->slots[found].key, static_cast<size_t>(key_length));
    }
    LWLockRelease(lock);
    return key_length < 0 ? nullptr : cstring_to_text_with_len(key, key_length);
}

void fair_cursor_store(FairTurns turns, const text* queue, const text* key) {
    const int length = static_cast<int>(VARSIZE_ANY_EXHDR(queue));
    const int key_length = static_cast<int>(VARSIZE_ANY_EXHDR(key));
    if (shared == nullptr || length >= kQueueBytes || key_length > kKeyBytes) {
        return;  // (schedule refuses longer keys)
    }
    const char* bytes = VARDATA_ANY(queue);
    const uint32 hash = hash_of(bytes, length);
    LWLockAcquire(lock, LW_EXCLUSIVE);
    int found = find(turns, bytes, length, hash);
    if (found < 0) {
        found = take_slot();
        CursorSlot& slot = shared->slots[found];
        slot.dbid = MyDatabaseId;
        slot.turns = static_cast<int32>(turns);
        slot.has_hint = false;
        slot.hash = hash;
        slot.queue_length = length;
        memcpy(slot.queue, bytes, static_cast<size_t>(length));
    }
    CursorSlot& slot = shared->slots[found];
    slot.last_used = ++shared->uses;
    slot.key_length = key_length;
    memcpy(slot.key, VARDATA_ANY(key), static_cast<size_t>(key_length));
    LWLockRelease(lock);
}

bool fair_cursor_no_key_hint(const text* queue, NoKeyHint* hint) {
    const int length = static_cast<int>(VARSIZE_ANY_EXHDR(queue));
    if (shared == nullptr || length >= kQueueBytes) {
        return false;
    }
    const char* bytes = VARDATA_ANY(queue);
    bool found_hint = false;
    LWLockAcquire(lock, LW_SHARED);
    const int found = find(FairTurns::kConcurrencyKeys, bytes, length, hash_of(bytes, length));
    if (found >= 0 && shared->slots[found].has_hint) {
        *hint = shared->slots[found].hint;
        found_hint = true;
    }
    LWLockRelease(lock);
    return found_hint;
}

void fair_cursor_store_no_key_hint(const text* queue, const NoKeyHint& hint) {
    const int length = static_cast<int>(VARSIZE_ANY_EXHDR(queue));
    if (shared == nullptr || length >= kQueueBytes) {
        return;
    }
    const char* bytes = VARDATA_ANY(queue);
    LWLockAcquire(lock, LW_EXCLUSIVE);
    const int found = find(FairTurns::kConcurrencyKeys, bytes, length, hash_of(bytes, length));
    if (found >= 0) {
        shared->slots[found].has_hint = true;
        shared->slots[found].hint = hint;
    }
    LWLockRelease(lock);
}

}  // namespace pg_throttle::pg
