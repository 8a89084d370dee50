// The round-robin cursors in shared memory; see fair_cursors.hpp.
#include "pg/queue/fair_cursors.hpp"

#include "pg/queue/queue_slots.hpp"

namespace pg_throttle::pg {
namespace {

constexpr int kSlots = 256;
constexpr int kKeyBytes = 1024;  // a group_key or concurrency_key: at most 1024 bytes (schedule)
constexpr const char* kTrancheName = "pg_throttle fair cursors";

// Whose turn a cursor keeps.
enum class FairTurns : int32 {
    kGroups = 1,           // claim_group's groups, by group_key
    kConcurrencyKeys = 2,  // claim's concurrency keys
};

struct CursorSlot {
    QueueSlotHead head;
    int32 turns;     // FairTurns
    bool no_key;     // kConcurrencyKeys: the events without a key were served last
    bool truncated;  // kConcurrencyKeys: `key` is the first bytes of the key served last
    int32 key_length;
    bool has_hint;  // FairTurns::kConcurrencyKeys: `hint` holds
    NoKeyHint hint;
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
int find(FairTurns turns, const QueueName& name) {
    if (shared == nullptr) {
        return -1;
    }
    return find_queue_slot(shared->slots, name, [turns](const CursorSlot& slot) {
        return slot.turns == static_cast<int32>(turns);
    });
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

namespace {

// The cursor of (turns, queue): its key copied into the current memory
// context (nullptr: none known), and the slot's other fields.
text* cursor_of(FairTurns turns, const text* queue, KeyCursor* fields) {
    const QueueName name = queue_name_of(queue);
    if (shared == nullptr || name.length < 0) {
        return nullptr;
    }
    char key[kKeyBytes];
    int key_length = -1;
    LWLockAcquire(lock, LW_SHARED);
    const int found = find(turns, name);
    if (found >= 0) {
        const CursorSlot& slot = shared->slots[found];
        key_length = slot.key_length;
        fields->no_key = slot.no_key;
        fields->truncated = slot.truncated;
        fields->has_hint = slot.has_hint;
        fields->hint = slot.hint;
        memcpy(key, slot.key, static_cast<size_t>(key_length));
    }
    LWLockRelease(lock);
    return key_length < 0 ? nullptr : cstring_to_text_with_len(key, key_length);
}

// Records `key` (nullptr: none) for (turns, queue); of a key longer than a
// slot keeps, its first bytes (FairTurns::kGroups: the slot is emptied
// instead, and the next claim knows no cursor).
void store(FairTurns turns, const text* queue, const text* key) {
    const QueueName name = queue_name_of(queue);
    if (shared == nullptr || name.length < 0) {
        return;
    }
    int key_length = key == nullptr ? 0 : static_cast<int>(VARSIZE_ANY_EXHDR(key));
    const bool too_long = key_length > kKeyBytes;
    if (too_long) {  // whole characters (before the lock: it reads the encoding)
        key_length = pg_mbcliplen(VARDATA_ANY(key), key_length, kKeyBytes);
    }
    LWLockAcquire(lock, LW_EXCLUSIVE);
    int found = find(turns, name);
    if (too_long && turns == FairTurns::kGroups) {
        if (found >= 0) {
            shared->slots[found].head.dbid = InvalidOid;
        }
        LWLockRelease(lock);
        return;
    }
    if (found < 0) {
        found = free_or_oldest_slot(shared->slots);
        CursorSlot& slot = shared->slots[found];
        take_for(&slot.head, name);
        slot.turns = static_cast<int32>(turns);
        slot.has_hint = false;
    }
    CursorSlot& slot = shared->slots[found];
    slot.head.last_used = ++shared->uses;
    slot.no_key = key == nullptr;
    slot.truncated = too_long;
    slot.key_length = slot.no_key ? 0 : key_length;
    memcpy(slot.key, slot.no_key ? "" : VARDATA_ANY(key), static_cast<size_t>(slot.key_length));
    LWLockRelease(lock);
}

}  // namespace

text* fair_group_cursor_of(const text* queue) {
    KeyCursor fields{};
    return cursor_of(FairTurns::kGroups, queue, &fields);
}

void fair_group_cursor_store(const text* queue, const text* group_key) {
    store(FairTurns::kGroups, queue, group_key);
}

KeyCursor fair_key_cursor_of(const text* queue) {
    KeyCursor cursor{};
    cursor.key = cursor_of(FairTurns::kConcurrencyKeys, queue, &cursor);
    cursor.known = cursor.key != nullptr;
    return cursor;
}

void fair_key_cursor_store(const text* queue, const text* key) {
    store(FairTurns::kConcurrencyKeys, queue, key);
}

void fair_cursor_store_no_key_hint(const text* queue, const NoKeyHint& hint) {
    const QueueName name = queue_name_of(queue);
    if (shared == nullptr || name.length < 0) {
        return;
    }
    LWLockAcquire(lock, LW_EXCLUSIVE);
    const int found = find(FairTurns::kConcurrencyKeys, name);
    if (found >= 0) {
        shared->slots[found].has_hint = true;
        shared->slots[found].hint = hint;
    }
    LWLockRelease(lock);
}

}  // namespace pg_throttle::pg
