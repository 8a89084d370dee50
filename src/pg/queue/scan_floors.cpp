// The scan floors in shared memory, and the notes a transaction's writes
// leave until its commit; see scan_floors.hpp.
#include "pg/queue/scan_floors.hpp"

#include "pg/queue/queue_slots.hpp"

extern "C" {
#include "access/twophase.h"
}

namespace pg_throttle::pg {
namespace {

constexpr int kSlots = 256;
constexpr const char* kTrancheName = "pg_throttle scan floors";
// A count from the start now and then, whatever the floor says: a write
// that went unreported (a prepared transaction's, a table written with its
// triggers disabled) waits no longer than this.
constexpr int64 kRecountAfter = 60 * USECS_PER_SEC;

struct FloorLevel {
    bool used;
    int32 priority;
    uint32 generation;  // bumped when the level is cleared or given to another priority
    core::ScanFloor floor;
};

struct FloorSlot {
    QueueSlotHead head;
    uint32 generation;  // bumped when the slot is given to another queue
    FloorLevel levels[kFloorLevels];
    // The claims without a group_key, by (lease_until, id): where the look-up
    // of expired claims starts.
    FloorLevel leases;
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

// The slot of (MyDatabaseId, queue), or -1. Under the lock.
int find(const QueueName& name) {
    return shared == nullptr ? -1 : find_queue_slot(shared->slots, name);
}

void clear(FloorLevel* level) {
    level->generation++;
    core::scan_floor_clear(&level->floor);
}

// The level of `slot` that tracks `priority`, or nullptr.
FloorLevel* level_of(FloorSlot* slot, int32 priority) {
    for (FloorLevel& level : slot->levels) {
        if (level.used && level.priority == priority) {
            return &level;
        }
    }
    return nullptr;
}

// What this transaction's writes left to report at its commit: the lowest
// position per (queue, priority), for a few; more, and the commit clears
// every floor of the database instead.
constexpr int kNotes = 8;
struct WriteNote {
    bool claimed;  // a claim's lease (leases), else a pending event (of `priority`)
    int32 priority;
    int32 queue_length;
    char queue[kQueueNameBytes];
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
            if (slot.head.dbid == MyDatabaseId) {
                for (FloorLevel& level : slot.levels) {
                    clear(&level);
                }
                clear(&slot.leases);
            }
        }
    } else {
        for (int i = 0; i < note_count; i++) {
            const WriteNote& note = notes[i];
            const int found = find(queue_name_of(note.queue, note.queue_length));
            FloorLevel* level = found < 0      ? nullptr
                                : note.claimed ? &shared->slots[found].leases
                                               : level_of(&shared->slots[found], note.priority);
            if (level != nullptr) {
                core::scan_floor_note_write(&level->floor, note.lowest);
            }
        }
    }
    LWLockRelease(lock);
}

void abandon_open_count() {
    LWLockAcquire(lock, LW_EXCLUSIVE);
    FloorSlot& slot = shared->slots[open_count_slot];
    if (slot.generation == open_count_generation) {
        for (FloorLevel& level : slot.levels) {
            core::scan_floor_abandon(&level.floor, MyProcPid);
        }
        core::scan_floor_abandon(&slot.leases.floor, MyProcPid);
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
                // At PREPARE the rows are not visible yet, and the commit
                // comes elsewhere (floors are off with prepared
                // transactions on: there are no notes then).
                const bool committed =
                    event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT;
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

// This transaction's note of (queue, claimed, priority; 0 for claims), or
// nullptr.
WriteNote* note_of(const char* queue, int length, bool claimed, int32 priority) {
    for (int i = 0; i < note_count; i++) {
        WriteNote& note = notes[i];
        if (note.claimed == claimed && note.priority == priority && note.queue_length == length &&
            memcmp(note.queue, queue, static_cast<size_t>(length)) == 0) {
            return &note;
        }
    }
    return nullptr;
}

// `from`, lowered to the lowest position this transaction wrote to (queue,
// claimed, priority) and has not reported yet.
core::QueuePosition below_own_notes(core::QueuePosition from, const char* queue, int length,
                                    bool claimed, int32 priority) {
    if (notes_overflowed) {
        return core::kQueueStart;
    }
    const WriteNote* note = note_of(queue, length, claimed, priority);
    return note != nullptr && note->lowest < from ? note->lowest : from;
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

namespace {

// Begins (or, to `peek`, looks at) the count of `level`, the slot's level
// `index` (-1: its leases). Returns whether it took a place. Under the lock.
bool begin_level(FloorLevel* level, int index, bool peek, TimestampTz now, LevelCount* count) {
    count->tracked = true;
    count->priority = level->priority;
    count->level = index;
    count->generation = level->generation;
    count->count = peek ? core::scan_floor_peek(level->floor, now, kRecountAfter)
                        : core::scan_floor_begin(&level->floor, MyProcPid, now, kRecountAfter);
    return count->count.reader >= 0;
}

// Ends the count of `level` (under the lock): where a scan may start.
core::QueuePosition end_level(FloorLevel* level, const LevelCount& count, core::QueuePosition first,
                              TimestampTz now) {
    if (level->generation != count.generation) {
        return core::kQueueStart;
    }
    return core::scan_floor_end(&level->floor, count.count, MyProcPid, first, now);
}

}  // namespace

FloorCountOf scan_floor_count_begin(const text* queue) {
    FloorCountOf of{};
    of.slot = -1;
    of.off = true;
    for (LevelCount& count : of.levels) {
        count.count.from = core::kQueueStart;
    }
    of.leases.count.from = core::kQueueStart;
    const QueueName name = queue_name_of(queue);
    // A statement of REPEATABLE READ or SERIALIZABLE counts in the
    // transaction's snapshot, which may be older than the floor (and a
    // serializable scan must read, and lock, what a scan from the start
    // reads): it goes without.
    if (!floors_on() || name.length < 0 || IsolationUsesXactSnapshot()) {
        return of;
    }
    of.off = false;
    register_callback();
    if (open_count_slot >= 0) {
        abandon_open_count();  // an error ended a claim between its count's begin and end
    }
    // A transaction that wrote sees its own changes, which a rollback may
    // undo (a claim's marks): its counts use the floor, publish nothing.
    const bool peek =
        GetTopTransactionIdIfAny() != InvalidTransactionId || note_count > 0 || notes_overflowed;
    const TimestampTz now = GetCurrentTimestamp();
    bool registered = false;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    const int found = find(name);
    if (found >= 0) {
        FloorSlot& slot = shared->slots[found];
        slot.head.last_used = ++shared->uses;
        of.slot = found;
        of.generation = slot.generation;
        for (int i = 0; i < kFloorLevels; i++) {
            FloorLevel& level = slot.levels[i];
            if (!level.used) {
                continue;
            }
            registered = begin_level(&level, i, peek, now, &of.levels[i]) || registered;
        }
        registered = begin_level(&slot.leases, -1, peek, now, &of.leases) || registered;
    }
    LWLockRelease(lock);
    if (registered) {
        open_count_slot = of.slot;
        open_count_generation = of.generation;
    }
    for (LevelCount& count : of.levels) {
        if (count.tracked) {
            count.count.from =
                below_own_notes(count.count.from, name.bytes, name.length, false, count.priority);
        }
    }
    if (of.leases.tracked) {
        of.leases.count.from =
            below_own_notes(of.leases.count.from, name.bytes, name.length, true, 0);
    }
    // The higher priority first.
    if (of.levels[1].tracked &&
        (!of.levels[0].tracked || of.levels[1].priority > of.levels[0].priority)) {
        std::swap(of.levels[0], of.levels[1]);
    }
    return of;
}

ScanStarts scan_floor_count_end(const FloorCountOf& of, const FloorFirsts& first) {
    ScanStarts starts{};
    FloorFirsts* floors = &starts.floors;
    for (int i = 0; i < kFloorLevels; i++) {
        starts.tracked[i] = of.levels[i].tracked;
        starts.priority[i] = of.levels[i].priority;
        floors->levels[i] = core::kQueueStart;
    }
    floors->leases = core::kQueueStart;
    if (of.slot < 0) {
        return starts;
    }
    const TimestampTz now = GetCurrentTimestamp();
    LWLockAcquire(lock, LW_EXCLUSIVE);
    FloorSlot& slot = shared->slots[of.slot];
    if (slot.generation == of.generation) {
        for (int i = 0; i < kFloorLevels; i++) {
            const LevelCount& count = of.levels[i];
            if (count.tracked) {
                floors->levels[i] =
                    end_level(&slot.levels[count.level], count, first.levels[i], now);
            }
        }
        if (of.leases.tracked) {
            floors->leases = end_level(&slot.leases, of.leases, first.leases, now);
        }
    }
    LWLockRelease(lock);
    open_count_slot = -1;
    return starts;
}

void scan_floor_track(const text* queue, int32 priority) {
    const QueueName name = queue_name_of(queue);
    if (!floors_on() || name.length < 0) {
        return;
    }
    LWLockAcquire(lock, LW_EXCLUSIVE);
    int found = find(name);
    if (found < 0) {
        found = free_or_oldest_slot(shared->slots);
        FloorSlot& slot = shared->slots[found];
        slot.generation++;
        take_for(&slot.head, name);
        for (FloorLevel& level : slot.levels) {
            clear(&level);
            level.used = false;
        }
        clear(&slot.leases);
        slot.leases.used = true;
    }
    FloorSlot& slot = shared->slots[found];
    slot.head.last_used = ++shared->uses;
    if (level_of(&slot, priority) == nullptr) {
        // A free level, else the one of the lower priority.
        FloorLevel* replaced = &slot.levels[0];
        for (FloorLevel& level : slot.levels) {
            if (!level.used || (replaced->used && level.priority < replaced->priority)) {
                replaced = &level;
            }
        }
        clear(replaced);
        replaced->used = true;
        replaced->priority = priority;
    }
    LWLockRelease(lock);
}

namespace {

void remember_write(const text* queue, bool claimed, int32 priority, core::QueuePosition at) {
    register_callback();
    // Per row written: the name only, no hash (report_notes hashes it once).
    const int whole = static_cast<int>(VARSIZE_ANY_EXHDR(queue));
    const int length = whole < kQueueNameBytes ? whole : -1;
    const char* bytes = VARDATA_ANY(queue);
    WriteNote* noted = length < 0 ? nullptr : note_of(bytes, length, claimed, priority);
    if (noted != nullptr) {
        if (at < noted->lowest) {
            noted->lowest = at;
        }
        return;
    }
    if (length < 0 || note_count == kNotes) {
        notes_overflowed = true;
        return;
    }
    WriteNote& note = notes[note_count++];
    note.claimed = claimed;
    note.priority = priority;
    note.queue_length = length;
    memcpy(note.queue, bytes, static_cast<size_t>(length));
    note.lowest = at;
}

}  // namespace

void scan_floor_note_pending(const text* queue, int32 priority, core::QueuePosition at) {
    if (floors_on()) {
        remember_write(queue, false, priority, at);
    }
}

void scan_floor_note_claimed(const text* queue, core::QueuePosition lease) {
    if (floors_on()) {
        remember_write(queue, true, 0, lease);
    }
}

}  // namespace pg_throttle::pg
