#include "core/scan_floor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
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
// snapshot some steps later, and publish some steps after that, all
// interleaved at random. Whenever no write is unreported, every pending
// event is at or after the floor.
TEST(ScanFloor, NoPendingEventIsEverBelowTheFloor) {
    std::mt19937_64 random(42);
    for (int round = 0; round < 200; round++) {
        ScanFloor floor{};
        scan_floor_clear(&floor);
        std::set<std::pair<std::int64_t, std::int64_t>> pending;
        std::vector<QueuePosition> unreported;
        struct Reader {
            std::int32_t owner;
            FloorCount count;
            bool snapped;
            QueuePosition first;
        };
        std::vector<Reader> readers;
        std::int64_t next_id = 1;
        std::int64_t now = 0;
        for (int step = 0; step < 2000; step++) {
            now++;
            switch (random() % 6) {
                case 0: {  // a write commits (run_at anywhere, often in the past)
                    const QueuePosition p =
                        at(static_cast<std::int64_t>(random() % 500), next_id++);
                    pending.insert({p.run_at, p.id});
                    unreported.push_back(p);
                    break;
                }
                case 1:  // a committed write reports itself
                    if (!unreported.empty()) {
                        const size_t i = random() % unreported.size();
                        scan_floor_note_write(&floor, unreported[i]);
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
                case 3: {  // a reader begins
                    const auto owner = static_cast<std::int32_t>(1 + random() % 20);
                    readers.push_back(
                        Reader{owner, scan_floor_begin(&floor, owner, now, 300), false, kQueueEnd});
                    break;
                }
                case 4:  // a reader takes its snapshot and counts
                    for (Reader& reader : readers) {
                        if (!reader.snapped) {
                            auto it = pending.lower_bound(
                                {reader.count.from.run_at, reader.count.from.id});
                            reader.first =
                                it == pending.end() ? kQueueEnd : at(it->first, it->second);
                            reader.snapped = true;
                            break;
                        }
                    }
                    break;
                case 5:  // a reader publishes
                    if (!readers.empty() && readers.front().snapped) {
                        const Reader reader = readers.front();
                        readers.erase(readers.begin());
                        scan_floor_end(&floor, reader.count, reader.owner, reader.first, now);
                    }
                    break;
            }
            if (unreported.empty() && !pending.empty()) {
                const QueuePosition lowest = at(pending.begin()->first, pending.begin()->second);
                ASSERT_FALSE(lowest < floor.floor) << "round " << round << " step " << step;
            }
        }
    }
}

}  // namespace
}  // namespace pg_throttle::core
