#include "core/owner_counts.hpp"

namespace pg_throttle::core {
namespace {

std::uint32_t home_slot(std::uint32_t owner, std::uint32_t capacity) noexcept {
    // OIDs are handed out in sequence: spread them (Fibonacci hashing), then
    // map the 32-bit hash onto [0, capacity) without a division.
    const std::uint32_t spread = owner * 2654435769U;
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(spread) * capacity) >> 32);
}

std::uint32_t next_slot(std::uint32_t slot, std::uint32_t capacity) noexcept {
    return slot + 1 == capacity ? 0 : slot + 1;
}

// How far `to` is after `from`, going round the table.
std::uint32_t distance(std::uint32_t from, std::uint32_t to, std::uint32_t capacity) noexcept {
    return to >= from ? to - from : to + capacity - from;
}

// Frees slot `hole` and moves back the later slots of its run whose home
// is not between the hole and them (backward-shift deletion).
void free_slot(OwnerCount* slots, std::uint32_t capacity, std::uint32_t hole) noexcept {
    std::uint32_t next = next_slot(hole, capacity);
    while (slots[next].owner != 0) {
        const std::uint32_t home = home_slot(slots[next].owner, capacity);
        // Moved back when its home is no nearer to it than the hole is.
        if (distance(home, next, capacity) >= distance(hole, next, capacity)) {
            slots[hole] = slots[next];
            hole = next;
        }
        next = next_slot(next, capacity);
    }
    slots[hole] = OwnerCount{0, 0};
}

}  // namespace

std::uint32_t owner_table_capacity(std::int64_t max_owners) noexcept {
    const std::int64_t wanted = max_owners + max_owners / 2 + 16;
    return static_cast<std::uint32_t>(wanted < (std::int64_t{1} << 31) ? wanted : (1U << 31));
}

std::int32_t owner_count_of(const OwnerCount* slots, std::uint32_t capacity,
                            std::uint32_t owner) noexcept {
    if (owner == 0) {
        return 0;
    }
    for (std::uint32_t i = home_slot(owner, capacity), probes = 0; probes < capacity;
         i = next_slot(i, capacity), probes++) {
        if (slots[i].owner == owner) {
            return slots[i].count;
        }
        if (slots[i].owner == 0) {
            return 0;
        }
    }
    return 0;
}

bool owner_count_add(OwnerCount* slots, std::uint32_t capacity, std::uint32_t owner,
                     std::int32_t delta) noexcept {
    if (owner == 0) {
        return false;
    }
    for (std::uint32_t i = home_slot(owner, capacity), probes = 0; probes < capacity;
         i = next_slot(i, capacity), probes++) {
        if (slots[i].owner == owner) {
            slots[i].count += delta;
            if (slots[i].count <= 0) {
                free_slot(slots, capacity, i);
            }
            return true;
        }
        if (slots[i].owner == 0) {
            if (delta <= 0) {
                return true;  // nothing counted, nothing to take away
            }
            slots[i] = OwnerCount{owner, delta};
            return true;
        }
    }
    return false;
}

}  // namespace pg_throttle::core
