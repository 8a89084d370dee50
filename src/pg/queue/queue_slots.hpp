// The head of a slot in a fixed shared-memory table kept per (database,
// queue): the scan floors' (scan_floors.hpp) and the round-robin cursors'
// (fair_cursors.hpp). It says whose the slot is and when it was used last;
// a table is found by name and, when full, gives up the slot used longest
// ago. Plain data; the functions run under the table's own LWLock and raise
// nothing.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

inline constexpr int kQueueNameBytes = 64;  // a queue name is at most 63 bytes (event_queue_check)

struct QueueSlotHead {
    Oid dbid;  // InvalidOid: free
    uint32 hash;
    uint64 last_used;
    int32 queue_length;
    char queue[kQueueNameBytes];
};

// A queue's name as the slots compare it, in the current database.
struct QueueName {
    const char* bytes;
    int length;  // -1: too long for a slot (no event has such a queue)
    uint32 hash;
};

inline QueueName queue_name_of(const char* bytes, int length) {
    if (length >= kQueueNameBytes) {
        return QueueName{bytes, -1, 0};
    }
    return QueueName{bytes, length,
                     hash_bytes(reinterpret_cast<const unsigned char*>(bytes), length)};
}

inline QueueName queue_name_of(const text* queue) {
    return queue_name_of(VARDATA_ANY(queue), static_cast<int>(VARSIZE_ANY_EXHDR(queue)));
}

// Whether `head` is the slot of `name` in the current database.
inline bool holds(const QueueSlotHead& head, const QueueName& name) {
    return head.dbid == MyDatabaseId && head.hash == name.hash &&
           head.queue_length == name.length &&
           memcmp(head.queue, name.bytes, static_cast<size_t>(name.length)) == 0;
}

// Makes `head` the slot of `name` in the current database.
inline void take_for(QueueSlotHead* head, const QueueName& name) {
    head->dbid = MyDatabaseId;
    head->hash = name.hash;
    head->queue_length = name.length;
    memcpy(head->queue, name.bytes, static_cast<size_t>(name.length));
}

// The index of the slot of `slots` (whose member `head` is a QueueSlotHead)
// that holds `name` and that `also` accepts, or -1.
template <typename Slot, size_t N, typename Also>
int find_queue_slot(const Slot (&slots)[N], const QueueName& name, Also also) {
    for (size_t i = 0; i < N; i++) {
        if (holds(slots[i].head, name) && also(slots[i])) {
            return static_cast<int>(i);
        }
    }
    return -1;
}

template <typename Slot, size_t N>
int find_queue_slot(const Slot (&slots)[N], const QueueName& name) {
    return find_queue_slot(slots, name, [](const Slot&) { return true; });
}

// A free slot of `slots`, or the one used longest ago.
template <typename Slot, size_t N>
int free_or_oldest_slot(const Slot (&slots)[N]) {
    size_t oldest = 0;
    for (size_t i = 0; i < N; i++) {
        if (slots[i].head.dbid == InvalidOid) {
            return static_cast<int>(i);
        }
        if (slots[i].head.last_used < slots[oldest].head.last_used) {
            oldest = i;
        }
    }
    return static_cast<int>(oldest);
}

}  // namespace pg_throttle::pg
