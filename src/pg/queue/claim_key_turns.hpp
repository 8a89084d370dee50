// Round robin between concurrency keys (throttle.concurrency_policy.fairness
// = 'round_robin'): throttle.claim's step 2 in turns instead of oldest first.
//
// A claim walks the queue's concurrency keys with pending events in key
// order, starting after the key served last in the queue (fair_cursors.hpp),
// then the events without a key (one participant, after the last key), then
// the keys from the first up to the one served last. Of each it takes one
// due event, if the key has room (concurrency_keys.hpp): the key's oldest.
// While the claim wants more, it goes round again over those that gave
// one, one event each per round. The keys come from a loose scan of
// event_pending_concurrency (one descent per key, however many events it
// has), so a key with 100 000 due events costs the others one look-up.
// The turn orders the keys and run_at a key's events; priority orders only
// the events without a key.
#pragma once

#include "pg/queue/claimed_ids.hpp"
#include "pg/queue/concurrency_keys.hpp"
#include "pg/queue/fair_cursors.hpp"

namespace pg_throttle::pg {

// The events without a concurrency_key, one participant of the turn: takes
// the next of its due events into `taken` (claim's order: the highest
// priority, then oldest), or answers false when none is left. Inside
// SPI_connect.
struct UnkeyedTurn {
    bool (*take_next)(void* context, Ids* taken);
    void* context;
};

struct KeyTurnsClaim {
    Datum queue;  // text
    Datum now;    // timestamptz
    ConcurrencyKeys* keys;
    UnkeyedTurn unkeyed;
    int32 max;  // taken->count stops there
};

// Takes due events into `taken`, in turns after `cursor` (known), until it
// holds `max` or no participant has one left. Rows are locked FOR UPDATE
// SKIP LOCKED. Inside SPI_connect.
void take_in_turns(const KeyTurnsClaim& claim, const KeyCursor& cursor, Ids* taken);

}  // namespace pg_throttle::pg
