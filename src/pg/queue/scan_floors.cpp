// The scan floors in shared memory, and the notes a transaction's writes
// leave until its commit; see scan_floors.hpp.
#include "pg/queue/scan_floors.hpp"

extern "C" {
#include "access/twophase.h"
}

namespace pg_throttle::pg {
namespace {

constexpr int kSlots = 256;
constexpr int kQueueBytes = 64;  // a queue name is at most 63 bytes (event_queue_check)
constexpr const char* kTrancheName = "pg_throttle scan floors";
// A count from the start now and then, whatever the floor says: a write
// that went unreported (a prepared transaction's, a table written with its
// triggers disabled) waits no longer than this.
constexpr int64 kRecountAfter = 60 * USECS_PER_SEC;

struct FloorSlot {
    Oid dbid;  // InvalidOid: free
    uint32 hash;
    uint32 generation;  // bumped when the slot is cleared or given to another queue
    int32 priority;
    uint64 last_used;
    int32 queue_length;
    char queue[kQueueBytes];
    core::ScanFloor floor;
};

struct FloorsShared {
    uint64 uses;
    FloorSlot slots[kSlots];
};
static_assert(std::is_trivially_copyable_v<FloorsShared>);

FloorsShared* shared = nullptr;
LWLock* lock = nullptr;

bool floors_on() {
    return shared != nullptr && max_prepared_xacts == 0;
}

uint32 hash_of(const char* bytes, int length) {
    return hash_bytes(reinterpret_cast<const unsigned char*>(bytes), length);
}

// The slot of (MyDatabaseId, queue), or -1. Under the lock.
int find(const char* queue, int length, uint32 hash) {
    for (int i = 0; i < kSlots; i++) {
        const FloorSlot& slot = shared->slots[i];
        if (slot.dbid == MyDatabaseId && slot.hash == hash && slot.queue_length == length &&
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

void clear(FloorSlot* slot) {
    slot->generation++;
    core::scan_floor_clear(&slot->floor);
}

int queue_length_of(const text* queue) {
    const int length = static_cast<int>(VARSIZE_ANY_EXHDR(queue));
    return length < kQueueBytes ? length : -1;
}

// What this transaction's writes left to report at its commit: the lowest
// position per (queue, priority), for a few; more, and the commit clears
// every floor of the database instead.
constexpr int kNotes = 8;
struct WriteNote {
    int32 priority;
    int32 queue_length;
    char queue[kQueueBytes];
    core::QueuePosition lowest;
};
WriteNote notes[kNotes];
int note_count = 0;
bool notes_overflowed = false;

// A count this backend began and has not ended (an error in between):
// its place is freed when the transaction ends.
int open_count_slot = -1;
uint32 open_count_generation = 0;
bool callback_registered = false;

void report_notes() {
    LWLockAcquire(lock, LW_EXCLUSIVE);
    if (notes_overflowed) {
        for (FloorSlot& slot : shared->slots) {
            if (slot.dbid == MyDatabaseId) {
                clear(&slot);
            }
        }
    } else {
        for (int i = 0; i < note_count; i++) {
            const WriteNote& note = notes[i];
            const int found =
                find(note.queue, note.queue_length, hash_of(note.queue, note.queue_length));
            if (found >= 0 && shared->slots[found].priority == note.priority) {
                core::scan_floor_note_write(&shared->slots[found].floor, note.lowest);
            }
        }
    }
    LWLockRelease(lock);
}

void abandon_open_count() {
    LWLockAcquire(lock, LW_EXCLUSIVE);
    FloorSlot& slot = shared->slots[open_count_slot];
    if (slot.generation == open_count_generation) {
        core::scan_floor_abandon(&slot.floor, MyProcPid);
    }
    LWLockRelease(lock);
    open_count_slot = -1;
}

// Nothing here raises: the commit has happened.
void on_transaction(XactEvent event, void* /*arg*/) {
    switch (event) {
        case XACT_EVENT_COMMIT:
        case XACT_EVENT_PARALLEL_COMMIT:
        case XACT_EVENT_PREPARE:
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PARALLEL_ABORT:
            if (shared != nullptr) {
                const bool committed =
                    event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT;
                if (committed && (note_count > 0 || notes_overflowed)) {
                    report_notes();
                }
                if (open_count_slot >= 0) {
                    abandon_open_count();
                }
            }
            note_count = 0;
            notes_overflowed = false;
            break;
        case XACT_EVENT_PRE_COMMIT:
        case XACT_EVENT_PARALLEL_PRE_COMMIT:
        case XACT_EVENT_PRE_PREPARE:
            break;
    }
}

void register_callback() {
    if (!callback_registered) {
        RegisterXactCallback(on_transaction, nullptr);
        callback_registered = true;
    }
}

}  // namespace

void scan_floors_request_shmem() {
    RequestAddinShmemSpace(MAXALIGN(sizeof(FloorsShared)));
    RequestNamedLWLockTranche(kTrancheName, 1);
}

void scan_floors_attach_shmem() {
    bool found = false;
    shared = static_cast<FloorsShared*>(
        ShmemInitStruct("pg_throttle scan floors", sizeof(FloorsShared), &found));
    if (!found) {
        memset(shared, 0, sizeof(FloorsShared));
    }
    lock = &GetNamedLWLockTranche(kTrancheName)[0].lock;
}

FloorCountOf scan_floor_count_begin(const text* queue) {
    FloorCountOf of{};
    const int length = queue_length_of(queue);
    if (!floors_on() || length < 0) {
        return of;
    }
    register_callback();
    const char* bytes = VARDATA_ANY(queue);
    const uint32 hash = hash_of(bytes, length);
    LWLockAcquire(lock, LW_EXCLUSIVE);
    const int found = find(bytes, length, hash);
    if (found >= 0) {
        FloorSlot& slot = shared->slots[found];
        slot.last_used = ++shared->uses;
        of.tracked = true;
        of.priority = slot.priority;
        of.slot = found;
        of.generation = slot.generation;
        of.count =
            core::scan_floor_begin(&slot.floor, MyProcPid, GetCurrentTimestamp(), kRecountAfter);
    }
    LWLockRelease(lock);
    if (of.tracked && of.count.reader >= 0) {
        open_count_slot = of.slot;
        open_count_generation = of.generation;
    }
    return of;
}

core::QueuePosition scan_floor_count_end(const FloorCountOf& of, core::QueuePosition first) {
    if (!of.tracked) {
        return core::kQueueStart;
    }
    core::QueuePosition floor = core::kQueueStart;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    FloorSlot& slot = shared->slots[of.slot];
    if (slot.generation == of.generation) {
        floor =
            core::scan_floor_end(&slot.floor, of.count, MyProcPid, first, GetCurrentTimestamp());
    }
    LWLockRelease(lock);
    open_count_slot = -1;
    return floor;
}

void scan_floor_track(const text* queue, int32 priority) {
    const int length = queue_length_of(queue);
    if (!floors_on() || length < 0) {
        return;
    }
    const char* bytes = VARDATA_ANY(queue);
    const uint32 hash = hash_of(bytes, length);
    LWLockAcquire(lock, LW_EXCLUSIVE);
    int found = find(bytes, length, hash);
    if (found < 0 || shared->slots[found].priority != priority) {
        if (found < 0) {
            found = take_slot();
        }
        FloorSlot& slot = shared->slots[found];
        clear(&slot);
        slot.dbid = MyDatabaseId;
        slot.hash = hash;
        slot.priority = priority;
        slot.queue_length = length;
        memcpy(slot.queue, bytes, static_cast<size_t>(length));
        slot.last_used = ++shared->uses;
    }
    LWLockRelease(lock);
}

void scan_floor_note_pending(const text* queue, int32 priority, core::QueuePosition at) {
    if (!floors_on()) {
        return;
    }
    register_callback();
    const int length = queue_length_of(queue);
    const char* bytes = VARDATA_ANY(queue);
    for (int i = 0; i < note_count; i++) {
        WriteNote& note = notes[i];
        if (note.priority == priority && note.queue_length == length &&
            memcmp(note.queue, bytes, static_cast<size_t>(length)) == 0) {
            if (at < note.lowest) {
                note.lowest = at;
            }
            return;
        }
    }
    if (length < 0 || note_count == kNotes) {
        notes_overflowed = true;
        return;
    }
    WriteNote& note = notes[note_count++];
    note.priority = priority;
    note.queue_length = length;
    memcpy(note.queue, bytes, static_cast<size_t>(length));
    note.lowest = at;
}

}  // namespace pg_throttle::pg
