// How many registry entries each owner (a role, a database) holds: an
// open-addressing table over plain data, so it can live in shared memory.
//
// A slot is free while its owner is 0 (InvalidOid: no owner is counted under
// it). Linear probing; a count that falls to zero frees its slot at once and
// shifts later slots of its run back, so a lookup never needs tombstones.
// The caller sizes the table with owner_table_capacity() for the most owners
// it can have at once and guards it with a lock of its own.
#pragma once
#include "core/cpp_only.hpp"

#include <cstdint>
#include <type_traits>

namespace pg_throttle::core {

struct OwnerCount {
    std::uint32_t owner;  // 0: a free slot
    std::int32_t count;
};
// The table lives in shared memory (registry/quota.cpp): plain data.
static_assert(std::is_trivially_copyable_v<OwnerCount>);

// Slots for a table that must hold `max_owners` owners at once: half as many
// again (and a few), so that even full it is two-thirds used, probes stay
// short and a slot is always free.
std::uint32_t owner_table_capacity(std::int64_t max_owners) noexcept;

// The count of `owner` (0 when it holds nothing).
std::int32_t owner_count_of(const OwnerCount* slots, std::uint32_t capacity,
                            std::uint32_t owner) noexcept;

// Adds `delta` to the count of `owner`; a count that reaches zero or below
// frees the slot. False when `owner` needs a slot and none is free, or owner
// is 0; the table is then unchanged.
bool owner_count_add(OwnerCount* slots, std::uint32_t capacity, std::uint32_t owner,
                     std::int32_t delta) noexcept;

}  // namespace pg_throttle::core
