// Where a claim's scan of a queue's due events may start: the scan floor.
//
// A claim finds due events by walking the due index in (run_at, id) order.
// Every event claimed leaves its index entry behind, pointing at a row
// version that vacuum removes later; while an old snapshot is open it cannot,
// and a scan that starts at the front walks every entry left since the
// snapshot opened. The floor is a position at or before every pending event
// of one priority of a queue whose commit has been reported (below), so a
// scan that starts there misses none of them and skips those entries.
//
// It stays true by two rules (the protocol, for the code that keeps a floor
// in shared memory under a lock of its own):
//  - A writer: every transaction that commits a pending event reports its
//    position after its commit is visible to others (scan_floor_note_write).
//    Below the floor it lowers it, and each counting reader keeps it.
//  - A counting reader registers (scan_floor_begin) before it takes the
//    snapshot of its count, counts the first pending event at or after the
//    floor it read, and publishes (scan_floor_end) the lower of that and of
//    every write reported meanwhile. A write its snapshot did not show was
//    committed after the reader registered, so it was reported to it or will
//    lower the floor published.
// A count from the start of the queue comes now and then whatever the
// floor says, so no event waits long if a write ever went unreported.
#pragma once
#include "core/cpp_only.hpp"

#include <cstdint>
#include <limits>

namespace pg_throttle::core {

// An event's place in the due index of its priority: (run_at, id), compared
// in that order; run_at in microseconds as the server stores it.
struct QueuePosition {
    std::int64_t run_at;
    std::int64_t id;
};

constexpr bool operator<(const QueuePosition& a, const QueuePosition& b) noexcept {
    return a.run_at < b.run_at || (a.run_at == b.run_at && a.id < b.id);
}
constexpr bool operator==(const QueuePosition& a, const QueuePosition& b) noexcept {
    return a.run_at == b.run_at && a.id == b.id;
}

// Before every event: a scan from here is a scan from the start.
inline constexpr QueuePosition kQueueStart{std::numeric_limits<std::int64_t>::min(),
                                           std::numeric_limits<std::int64_t>::min()};
// After every event: what a count publishes when it found none pending.
inline constexpr QueuePosition kQueueEnd{std::numeric_limits<std::int64_t>::max(),
                                         std::numeric_limits<std::int64_t>::max()};

inline constexpr int kFloorReaders = 16;

struct FloorReader {
    std::int32_t owner;          // 0: a free place
    std::uint32_t ticket;        // which registration this is
    QueuePosition lowest_write;  // the lowest write reported since it registered
};

// Plain data: it lives in shared memory.
struct ScanFloor {
    QueuePosition floor;      // kQueueStart while not known
    std::int64_t counted_at;  // when a count from the start last published
    std::uint32_t tickets;    // registrations so far
    FloorReader readers[kFloorReaders];
};

// A floor not known yet, no reader.
void scan_floor_clear(ScanFloor* floor) noexcept;

// A pending event committed at `at`.
void scan_floor_note_write(ScanFloor* floor, QueuePosition at) noexcept;

// A count begun: where it counts from, and its registration (reader < 0:
// no place was free; it may use `from` but publishes nothing).
struct FloorCount {
    QueuePosition from;
    int reader;
    std::uint32_t ticket;
    bool from_start;
};

// Registers `owner` (not 0) to count. The count starts at the start when
// the floor is not known or no count from the start published in the last
// `recount_after` (whatever unit `now` has), else at the floor.
FloorCount scan_floor_begin(ScanFloor* floor, std::int32_t owner, std::int64_t now,
                            std::int64_t recount_after) noexcept;

// Where a count would start, without registering (reader -1): for a scan
// whose snapshot may be older than now, which must not publish.
FloorCount scan_floor_peek(const ScanFloor& floor, std::int64_t now,
                           std::int64_t recount_after) noexcept;

// Ends the count `count` of `owner` that found `first` (the first pending
// event at or after count.from, or kQueueEnd): publishes it, lowered by the
// writes reported meanwhile, and frees the place. Returns where a scan may
// start: the floor published, or, when the count had no place (a peek, or
// one cleared meanwhile), the lower of count.from and the floor.
QueuePosition scan_floor_end(ScanFloor* floor, const FloorCount& count, std::int32_t owner,
                             QueuePosition first, std::int64_t now) noexcept;

// Frees every place of `owner` (its transaction ended without publishing).
void scan_floor_abandon(ScanFloor* floor, std::int32_t owner) noexcept;

}  // namespace pg_throttle::core
