#include "core/owner_counts.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace pg_throttle::core {
namespace {

TEST(OwnerTableCapacity, HasRoomForHalfAsManyAgain) {
    EXPECT_EQ(owner_table_capacity(0), 16U);
    EXPECT_EQ(owner_table_capacity(8), 28U);
    EXPECT_EQ(owner_table_capacity(100000), 150016U);
}

// A table as full as the registry can make it: every entry a different owner.
TEST(OwnerCounts, HoldsAsManyOwnersAsItWasSizedFor) {
    const std::uint32_t capacity = owner_table_capacity(1000);
    std::vector<OwnerCount> slots(capacity);
    for (std::uint32_t owner = 1; owner <= 1000; owner++) {
        ASSERT_TRUE(owner_count_add(slots.data(), capacity, owner * 7919, 1));
    }
    for (std::uint32_t owner = 1; owner <= 1000; owner += 2) {
        ASSERT_TRUE(owner_count_add(slots.data(), capacity, owner * 7919, -1));
    }
    for (std::uint32_t owner = 1; owner <= 1000; owner++) {
        ASSERT_EQ(owner_count_of(slots.data(), capacity, owner * 7919), owner % 2 == 0 ? 1 : 0);
    }
}

TEST(OwnerCounts, CountsAndFreesSlots) {
    std::vector<OwnerCount> slots(owner_table_capacity(4));
    const auto capacity = static_cast<std::uint32_t>(slots.size());
    EXPECT_EQ(owner_count_of(slots.data(), capacity, 10), 0);
    EXPECT_TRUE(owner_count_add(slots.data(), capacity, 10, 1));
    EXPECT_TRUE(owner_count_add(slots.data(), capacity, 10, 1));
    EXPECT_TRUE(owner_count_add(slots.data(), capacity, 11, 1));
    EXPECT_EQ(owner_count_of(slots.data(), capacity, 10), 2);
    EXPECT_EQ(owner_count_of(slots.data(), capacity, 11), 1);
    EXPECT_TRUE(owner_count_add(slots.data(), capacity, 10, -2));
    EXPECT_EQ(owner_count_of(slots.data(), capacity, 10), 0);
    int used = 0;
    for (const OwnerCount& slot : slots) {
        used += slot.owner != 0 ? 1 : 0;
    }
    EXPECT_EQ(used, 1) << "a count that reaches zero frees its slot";
}

TEST(OwnerCounts, OwnerZeroIsNeverCounted) {
    std::vector<OwnerCount> slots(16);
    EXPECT_FALSE(owner_count_add(slots.data(), 16, 0, 1));
    EXPECT_EQ(owner_count_of(slots.data(), 16, 0), 0);
}

TEST(OwnerCounts, TakingFromAnAbsentOwnerChangesNothing) {
    std::vector<OwnerCount> slots(16);
    EXPECT_TRUE(owner_count_add(slots.data(), 16, 5, -1));
    EXPECT_EQ(owner_count_of(slots.data(), 16, 5), 0);
}

TEST(OwnerCounts, AFullTableRefusesANewOwner) {
    std::vector<OwnerCount> slots(16);
    for (std::uint32_t owner = 1; owner <= 16; owner++) {
        EXPECT_TRUE(owner_count_add(slots.data(), 16, owner, 1));
    }
    EXPECT_FALSE(owner_count_add(slots.data(), 16, 17, 1));
    EXPECT_TRUE(owner_count_add(slots.data(), 16, 16, 1)) << "a known owner still counts";
    EXPECT_EQ(owner_count_of(slots.data(), 16, 17), 0);
}

// Random adds and removals against a std::map: every count stays right
// through the backward shifts of colliding runs.
TEST(OwnerCounts, MatchesAReferenceUnderChurn) {
    const std::uint32_t capacity = owner_table_capacity(64);
    std::vector<OwnerCount> slots(capacity);
    std::map<std::uint32_t, std::int32_t> reference;
    std::mt19937 random(42);
    // Few distinct owners in a narrow range and in a wide one: many collisions.
    std::uniform_int_distribution<std::uint32_t> narrow(1, 64);
    std::uniform_int_distribution<std::uint32_t> wide(1, 4'000'000'000U);
    std::vector<std::uint32_t> owners;
    for (int i = 0; i < 32; i++) {
        owners.push_back(narrow(random));
        owners.push_back(wide(random));
    }
    std::uniform_int_distribution<std::size_t> pick(0, owners.size() - 1);
    for (int step = 0; step < 200000; step++) {
        const std::uint32_t owner = owners[pick(random)];
        const bool add = reference[owner] == 0 || random() % 2 == 0;
        ASSERT_TRUE(owner_count_add(slots.data(), capacity, owner, add ? 1 : -1));
        reference[owner] += add ? 1 : -1;
        if (step % 997 == 0) {
            for (const auto& [known, count] : reference) {
                ASSERT_EQ(owner_count_of(slots.data(), capacity, known), count) << known;
            }
        }
    }
}

}  // namespace
}  // namespace pg_throttle::core
