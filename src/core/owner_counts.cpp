#include "core/owner_counts.hpp"

namespace pg_throttle::core {
namespace {

std::uint32_t home_slot(std::uint32_t owner, std::uint32_t capacity) noexcept {
    // Fibonacci hashing: OIDs are handed out in sequence, so spread them.
    return static_cast<std::uint32_t>((owner * 2654435769U) & (capacity - 1));
}

// Frees slot `hole` and moves back the later slots of its run whose home
// is not between the hole and them (backward-shift deletion).
void free_slot(OwnerCount* slots, std::uint32_t capacity, std::uint32_t hole) noexcept {
    const std::uint32_t mask = capacity - 1;
    std::uint32_t next = (hole + 1) & mask;
    while (slots[next].owner != 0) {
        const std::uint32_t home = home_slot(slots[next].owner, capacity);
        // Distance from home to where the slot sits, and from home to the hole.
        if (((next - home) & mask) >= ((next - hole) & mask)) {
            slots[hole] = slots[next];
            hole = next;
        }
        next = (next + 1) & mask;
    }
    slots[hole] = OwnerCount{0, 0};
}

}  // namespace

std::uint32_t owner_table_capacity(std::int64_t max_owners) noexcept {
    std::uint32_t capacity = 16;
    while (capacity < (1U << 31) && static_cast<std::int64_t>(capacity) < 2 * max_owners) {
        capacity <<= 1;
    }
    return capacity;
}

std::int32_t owner_count_of(const OwnerCount* slots, std::uint32_t capacity,
                            std::uint32_t owner) noexcept {
    if (owner == 0) {
        return 0;
    }
    const std::uint32_t mask = capacity - 1;
    for (std::uint32_t i = home_slot(owner, capacity), probes = 0; probes < capacity;
         i = (i + 1) & mask, probes++) {
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
    const std::uint32_t mask = capacity - 1;
    for (std::uint32_t i = home_slot(owner, capacity), probes = 0; probes < capacity;
         i = (i + 1) & mask, probes++) {
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
