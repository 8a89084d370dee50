#include "core/scan_floor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace pg_throttle::core {
namespace {

constexpr std::int64_t kRecount = 1000;

QueuePosition at(std::int64_t run_at, std::int64_t id) {
    return QueuePosition{run_at, id};
}

TEST(ScanFloor, PositionsCompareByRunAtThenId) {
    EXPECT_TRUE(at(1, 9) < at(2, 1));
    EXPECT_TRUE(at(2, 1) < at(2, 2));
    EXPECT_FALSE(at(2, 2) < at(2, 2));
    EXPECT_TRUE(kQueueStart < at(std::numeric_limits<std::int64_t>::min(), 0));
    EXPECT_TRUE(at(std::numeric_limits<std::int64_t>::max(), 0) < kQueueEnd);
}

TEST(ScanFloor, FirstCountStartsAtTheStartAndPublishes) {
    ScanFloor floor{};
    scan_floor_clear(&floor);
    const FloorCount count = scan_floor_begin(&floor, 7, 10, kRecount);
    EXPECT_TRUE(count.from_start);
    EXPECT_EQ(count.from, kQueueStart);
    ASSERT_GE(count.reader, 0);
    EXPECT_EQ(scan_floor_end(&floor, count, 7, at(5, 50), 10), at(5, 50));
    const FloorCount next = scan_floor_begin(&floor, 7, 11, kRecount);
    EXPECT_FALSE(next.from_start);
    EXPECT_EQ(next.from, at(5, 50));
}

TEST(ScanFloor, CountsFromTheStartAgainWhenTheLastSuchCountIsOld) {
    ScanFloor floor{};
    scan_floor_clear(&floor);
    FloorCount count = scan_floor_begin(&floor, 1, 100, kRecount);
    scan_floor_end(&floor, count, 1, at(5, 5), 100);
    count = scan_floor_begin(&floor, 1, 100 + kRecount - 1, kRecount);
    EXPECT_FALSE(count.from_start);
    scan_floor_end(&floor, count, 1, at(6, 6), 100 + kRecount - 1);
    count = scan_floor_begin(&floor, 1, 100 + kRecount, kRecount);
    EXPECT_TRUE(count.from_start);
    scan_floor_end(&floor, count, 1, at(7, 7), 100 + kRecount);
    // A clock that went back counts from the start too.
    count = scan_floor_begin(&floor, 1, 50, kRecount);
    EXPECT_TRUE(count.from_start);
}

TEST(ScanFloor, AWriteBelowTheFloorLowersIt) {
    ScanFloor floor{};
    scan_floor_clear(&floor);
    const FloorCount count = scan_floor_begin(&floor, 1, 0, kRecount);
    scan_floor_end(&floor, count, 1, at(10, 10), 0);
    scan_floor_note_write(&floor, at(20, 1));
    EXPECT_EQ(floor.floor, at(10, 10));
    scan_floor_note_write(&floor, at(3, 99));
    EXPECT_EQ(floor.floor, at(3, 99));
}

TEST(ScanFloor, AWriteDuringACountLowersWhatItPublishes) {
    ScanFloor floor{};
    scan_floor_clear(&floor);
    const FloorCount count = scan_floor_begin(&floor, 1, 0, kRecount);
    // Committed after the count's snapshot: the count does not see it.
    scan_floor_note_write(&floor, at(4, 4));
    EXPECT_EQ(scan_floor_end(&floor, count, 1, at(9, 9), 0), at(4, 4));
}

TEST(ScanFloor, ACountThatFoundNothingPublishesTheEnd) {
    ScanFloor floor{};
    scan_floor_clear(&floor);
    const FloorCount count = scan_floor_begin(&floor, 1, 0, kRecount);
    EXPECT_EQ(scan_floor_end(&floor, count, 1, kQueueEnd, 0), kQueueEnd);
    scan_floor_note_write(&floor, at(1, 1));
    EXPECT_EQ(floor.floor, at(1, 1));
}

TEST(ScanFloor, ACountClearedMeanwhilePublishesNothing) {
    ScanFloor floor{};
    scan_floor_clear(&floor);
    const FloorCount count = scan_floor_begin(&floor, 1, 0, kRecount);
    scan_floor_clear(&floor);
    const FloorCount other = scan_floor_begin(&floor, 2, 0, kRecount);
    EXPECT_EQ(other.reader, count.reader);  // the same place, another ticket
    EXPECT_EQ(scan_floor_end(&floor, count, 1, at(9, 9), 0), kQueueStart);
    EXPECT_EQ(scan_floor_end(&floor, other, 2, at(8, 8), 0), at(8, 8));
}

TEST(ScanFloor, APeekRegistersNothing) {
    ScanFloor floor{};
    scan_floor_clear(&floor);
    const FloorCount count = scan_floor_begin(&floor, 1, 0, kRecount);
    scan_floor_end(&floor, count, 1, at(5, 5), 0);
    const FloorCount peek = scan_floor_peek(floor, 1, kRecount);
    EXPECT_LT(peek.reader, 0);
    EXPECT_EQ(peek.from, at(5, 5));
    EXPECT_EQ(scan_floor_end(&floor, peek, 1, at(9, 9), 1), at(5, 5));
    for (const FloorReader& reader : floor.readers) {
        EXPECT_EQ(reader.owner, 0);
    }
}

TEST(ScanFloor, ReadersBeyondThePlacesPublishNothing) {
    ScanFloor floor{};
    scan_floor_clear(&floor);
    std::vector<FloorCount> counts;
    for (int owner = 1; owner <= kFloorReaders; owner++) {
        counts.push_back(scan_floor_begin(&floor, owner, 0, kRecount));
        ASSERT_GE(counts.back().reader, 0);
    }
    const FloorCount extra = scan_floor_begin(&floor, 99, 0, kRecount);
    EXPECT_LT(extra.reader, 0);
    EXPECT_EQ(scan_floor_end(&floor, extra, 99, at(1, 1), 0), kQueueStart);
    scan_floor_abandon(&floor, 3);
    EXPECT_GE(scan_floor_begin(&floor, 99, 0, kRecount).reader, 0);
    EXPECT_EQ(scan_floor_end(&floor, counts[2], 3, at(1, 1), 0), kQueueStart);
}

// A model of the protocol: writers commit pending events and report them
// some steps later; claims take pending events; readers begin, take a
// snapshot some steps later, and end some steps after that, all interleaved
// at random. Whenever no write is unreported, every pending event is at or
// after the floor; and where a reader's end says a scan may start is at or
// before every event its snapshot showed pending that was reported before
// it began.
TEST(ScanFloor, NoPendingEventIsEverBelowTheFloor) {
    std::mt19937_64 random(42);
    constexpr std::int64_t kUnreported = std::numeric_limits<std::int64_t>::max();
    for (int round = 0; round < 300; round++) {
        ScanFloor floor{};
        scan_floor_clear(&floor);
        std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> pending;  // -> reported at
        std::vector<QueuePosition> unreported;
        struct Reader {
            std::int32_t owner;
            FloorCount count;
            std::int64_t began;
            bool snapped;
            QueuePosition first;
            QueuePosition bound;  // the lowest event seen pending, reported before `began`
        };
        std::vector<Reader> readers;
        std::int64_t next_id = 1;
        std::int64_t now = 0;
        for (int step = 0; step < 2000; step++) {
            now++;
            switch (random() % 7) {
                case 0: {  // a write commits (run_at anywhere, often in the past)
                    const QueuePosition p =
                        at(static_cast<std::int64_t>(random() % 500), next_id++);
                    pending[{p.run_at, p.id}] = kUnreported;
                    unreported.push_back(p);
                    break;
                }
                case 1:  // a committed write reports itself
                    if (!unreported.empty()) {
                        const size_t i = random() % unreported.size();
                        scan_floor_note_write(&floor, unreported[i]);
                        auto it = pending.find({unreported[i].run_at, unreported[i].id});
                        if (it != pending.end()) {
                            it->second = now;
                        }
                        unreported.erase(unreported.begin() + static_cast<long>(i));
                    }
                    break;
                case 2:  // a claim takes a pending event at or after the floor
                    if (!pending.empty()) {
                        auto it = pending.lower_bound({floor.floor.run_at, floor.floor.id});
                        if (it != pending.end()) {
                            pending.erase(it);
                        }
                    }
                    break;
                case 3:  // a cancel takes any pending event
                    if (!pending.empty()) {
                        auto it = pending.begin();
                        std::advance(it, static_cast<long>(random() % pending.size()));
                        pending.erase(it);
                    }
                    break;
                case 4: {  // a reader begins, or peeks
                    const auto owner = static_cast<std::int32_t>(1 + random() % 20);
                    const FloorCount count = random() % 5 == 0
                                                 ? scan_floor_peek(floor, now, 300)
                                                 : scan_floor_begin(&floor, owner, now, 300);
                    readers.push_back(Reader{owner, count, now, false, kQueueEnd, kQueueEnd});
                    break;
                }
                case 5:  // a reader takes its snapshot and counts
                    if (!readers.empty()) {
                        Reader& reader = readers[random() % readers.size()];
                        if (reader.snapped) {
                            break;
                        }
                        auto it =
                            pending.lower_bound({reader.count.from.run_at, reader.count.from.id});
                        reader.first =
                            it == pending.end() ? kQueueEnd : at(it->first.first, it->first.second);
                        for (const auto& [position, reported] : pending) {
                            if (reported < reader.began) {
                                reader.bound = at(position.first, position.second);
                                break;
                            }
                        }
                        reader.snapped = true;
                    }
                    break;
                case 6:  // a reader ends, in any order
                    if (!readers.empty()) {
                        const size_t i = random() % readers.size();
                        const Reader reader = readers[i];
                        if (!reader.snapped) {
                            break;
                        }
                        readers.erase(readers.begin() + static_cast<long>(i));
                        const QueuePosition start =
                            scan_floor_end(&floor, reader.count, reader.owner, reader.first, now);
                        ASSERT_FALSE(reader.bound < start) << "round " << round << " step " << step;
                    }
                    break;
            }
            if (unreported.empty() && !pending.empty()) {
                const auto& lowest = pending.begin()->first;
                ASSERT_FALSE(at(lowest.first, lowest.second) < floor.floor)
                    << "round " << round << " step " << step;
            }
        }
    }
}

}  // namespace
}  // namespace pg_throttle::core
