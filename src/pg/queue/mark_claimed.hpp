// The last step of a claim (claim and claim_group): the events whose rows
// the claim has locked become claimed by it, or dead when their attempts are
// used up, or cancelled when they are expired claims that a newer run of
// their item_key supersedes (throttle._mark_claimed's rules).
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// The order in which a claim returns its events.
enum class ClaimOrder : int32 {
    kRunAt = 0,     // claim_group: the group's events oldest first
    kPriority = 1,  // claim: higher priority first, then the oldest
    kId = 2,        // claim_group of a strict group: in the order they were scheduled
};

struct ClaimRequest {
    ArrayType* ids;    // locked by the caller
    bool any_expired;  // whether some of them are claims whose lease expired
    Datum worker;      // text
    Datum lease;       // Interval*
    int64 token;
    TimestampTz now;
    ClaimOrder order;
    ArrayType* uncharged;  // expired claims among ids not charged an attempt; nullptr: none
};

// Marks the events; the rows claimed (whole rows of throttle.event, in
// `order`) are in SPI_tuptable-like `*rows`, kept until SPI_finish; returns
// how many. Inside SPI_connect.
uint64 mark_claimed(const ClaimRequest& request, const SPITupleTable** rows);

}  // namespace pg_throttle::pg
