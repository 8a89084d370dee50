// Round robin between concurrency keys; see claim_key_turns.hpp.
#include "pg/queue/claim_key_turns.hpp"

#include "pg/queue/event_rows.hpp"
#include "pg/server/kept_plan.hpp"

namespace pg_throttle::pg {
namespace {

// The first key after $2 with a pending event, and whether it comes after
// $3 (NULL: no bound). One descent of event_pending_concurrency.
KeptPlan next_key{
    "SELECT e.concurrency_key, e.concurrency_key > $3 FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'pending' AND e.concurrency_key IS NOT NULL"
    "   AND e.concurrency_key > $2"
    " ORDER BY e.concurrency_key LIMIT 1",
    3,
    {TEXTOID, TEXTOID, TEXTOID},
    nullptr};

// The oldest due event of key $2 (event_pending_concurrency: run_at <= $3
// bounds the scan, so events scheduled for later cost nothing), but for the
// ones this claim took ($4: its own locks, which SKIP LOCKED does not
// skip). An event whose item_key has a claimed run waits for it, as in
// claim's other scans.
KeptPlan key_next_event{
    "SELECT e.id FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'pending' AND e.concurrency_key = $2"
    "   AND e.concurrency_key IS NOT NULL AND e.run_at <= $3"
    "   AND e.id <> ALL ($4::bigint[])"
    "   AND NOT EXISTS (SELECT 1 FROM throttle.event c"  // event_claimed_key
    "                   WHERE c.queue = e.queue AND c.item_key = e.item_key"
    "                     AND c.state = 'claimed' OFFSET 0)"
    " ORDER BY e.run_at LIMIT 1 FOR UPDATE OF e SKIP LOCKED",
    4,
    {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT8ARRAYOID},
    nullptr};

// One participant of the turn: a key, or the events without one.
struct Participant {
    const text* key;  // nullptr: the events without a key
    Ids of_key;       // what this claim took of it
};

struct Turns {
    const KeyTurnsClaim* claim;
    Ids* taken;
    const text* no_key;   // '': taken->last_key for the events without a key
    Participant* served;  // those that gave an event this round
    int served_count;
    int served_capacity;
};

// Takes one event of `p`; false when it has none for this claim.
bool serve(Turns* turns, Participant* p) {
    const KeyTurnsClaim& claim = *turns->claim;
    if (p->key == nullptr) {
        if (!claim.unkeyed.take_next(claim.unkeyed.context, turns->taken)) {
            return false;
        }
        turns->taken->last_key = turns->no_key;
        return true;
    }
    if (concurrency_key_known_full(*claim.keys, p->key)) {
        return false;
    }
    // The event first, then the key: a key with no due event is passed
    // without its lock, so it takes none of the claim's kMaxKeysPerClaim.
    // An event whose key has no room stays locked until the claim ends, as
    // in claim's other scans.
    Datum args[4] = {claim.queue, PointerGetDatum(p->key), claim.now,
                     PointerGetDatum(ids_array(p->of_key.values, p->of_key.count))};
    run_kept_plan(&key_next_event, args, nullptr, SPI_OK_SELECT, 1);
    if (SPI_processed == 0) {
        return false;
    }
    bool is_null = false;
    const Datum id = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null);
    if (!concurrency_key_admit(claim.keys, p->key)) {
        return false;
    }
    append(turns->taken, id);
    append(&p->of_key, id);
    turns->taken->last_key = p->key;
    return true;
}

bool full(const Turns& turns) {
    return turns.taken->count >= turns.claim->max;
}

// Serves `p` in the first round, and keeps it for the next when it gave one.
void first_round(Turns* turns, Participant p) {
    if (!serve(turns, &p)) {
        return;
    }
    if (turns->served_count == turns->served_capacity) {
        turns->served_capacity *= 2;
        turns->served = static_cast<Participant*>(repalloc(
            turns->served, sizeof(Participant) * static_cast<size_t>(turns->served_capacity)));
    }
    turns->served[turns->served_count++] = p;
}

// The first round over the keys after `after` (and up to `upto`, unless
// nullptr), one descent each.
void keys_round(Turns* turns, const text* after, const text* upto) {
    const KeyTurnsClaim& claim = *turns->claim;
    while (!full(*turns) && concurrency_keys_may_meet_more(*claim.keys)) {
        Datum args[3] = {claim.queue, PointerGetDatum(after), PointerGetDatum(upto)};
        const char nulls[3] = {' ', ' ', upto == nullptr ? 'n' : ' '};
        run_kept_plan(&next_key, args, nulls, SPI_OK_SELECT, 1);
        if (SPI_processed == 0) {
            return;
        }
        bool is_null = false;
        bool past_null = true;
        const text* key = DatumGetTextPCopy(
            SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
        const bool past = DatumGetBool(
            SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &past_null));
        if (!past_null && past) {
            return;
        }
        first_round(turns, Participant{key, Ids{}});
        after = key;
    }
}

}  // namespace

void take_in_turns(const KeyTurnsClaim& claim, const text* cursor, Ids* taken) {
    Turns turns{&claim, taken, cstring_to_text(""), nullptr, 0, 8};
    turns.served = static_cast<Participant*>(palloc(sizeof(Participant) * 8));
    // The first round: the keys after the cursor, the events without a key,
    // the keys up to the cursor (none when it is the events without a key).
    keys_round(&turns, cursor, nullptr);
    if (!full(turns)) {
        first_round(&turns, Participant{nullptr, Ids{}});
    }
    if (!full(turns) && VARSIZE_ANY_EXHDR(cursor) > 0) {
        keys_round(&turns, turns.no_key, cursor);
    }
    // The next rounds, over those that gave one, while the claim wants more.
    while (!full(turns) && turns.served_count > 0) {
        int kept = 0;
        for (int i = 0; i < turns.served_count && !full(turns); i++) {
            if (serve(&turns, &turns.served[i])) {
                turns.served[kept++] = turns.served[i];
            }
        }
        if (full(turns)) {
            return;
        }
        turns.served_count = kept;
    }
}

}  // namespace pg_throttle::pg
