#include "core/scan_floor.hpp"

namespace pg_throttle::core {

void scan_floor_clear(ScanFloor* floor) noexcept {
    floor->floor = kQueueStart;
    floor->counted_at = 0;
    for (FloorReader& reader : floor->readers) {
        reader.owner = 0;
    }
}

void scan_floor_note_write(ScanFloor* floor, QueuePosition at) noexcept {
    if (at < floor->floor) {
        floor->floor = at;
    }
    for (FloorReader& reader : floor->readers) {
        if (reader.owner != 0 && at < reader.lowest_write) {
            reader.lowest_write = at;
        }
    }
}

FloorCount scan_floor_peek(const ScanFloor& floor, std::int64_t now,
                           std::int64_t recount_after) noexcept {
    FloorCount count{};
    count.from_start = floor.floor == kQueueStart || now - floor.counted_at >= recount_after ||
                       now < floor.counted_at;
    count.from = count.from_start ? kQueueStart : floor.floor;
    count.reader = -1;
    return count;
}

FloorCount scan_floor_begin(ScanFloor* floor, std::int32_t owner, std::int64_t now,
                            std::int64_t recount_after) noexcept {
    FloorCount count = scan_floor_peek(*floor, now, recount_after);
    for (int i = 0; i < kFloorReaders; i++) {
        FloorReader& reader = floor->readers[i];
        if (reader.owner == 0) {
            reader.owner = owner;
            reader.ticket = ++floor->tickets;
            reader.lowest_write = kQueueEnd;
            count.reader = i;
            count.ticket = reader.ticket;
            break;
        }
    }
    return count;
}

QueuePosition scan_floor_end(ScanFloor* floor, const FloorCount& count, std::int32_t owner,
                             QueuePosition first, std::int64_t now) noexcept {
    // Without publishing, a scan starts where the count did, or lower.
    const QueuePosition unpublished = count.from < floor->floor ? count.from : floor->floor;
    if (count.reader < 0 || count.reader >= kFloorReaders) {
        return unpublished;
    }
    FloorReader& reader = floor->readers[count.reader];
    if (reader.owner != owner || reader.ticket != count.ticket) {
        return unpublished;  // cleared meanwhile: the count says nothing of the new floor
    }
    reader.owner = 0;
    floor->floor = reader.lowest_write < first ? reader.lowest_write : first;
    if (count.from_start) {
        floor->counted_at = now;
    }
    return floor->floor;
}

void scan_floor_abandon(ScanFloor* floor, std::int32_t owner) noexcept {
    for (FloorReader& reader : floor->readers) {
        if (reader.owner == owner) {
            reader.owner = 0;
        }
    }
}

}  // namespace pg_throttle::core
