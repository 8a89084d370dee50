// Round robin between concurrency keys; see claim_key_turns.hpp.
#include "pg/queue/claim_key_turns.hpp"

#include "pg/queue/event_rows.hpp"
#include "pg/server/kept_plan.hpp"

namespace pg_throttle::pg {
namespace {

// The first key with a pending event (after $2), and whether it comes
// after $3 (NULL: no bound). One descent of event_pending_concurrency.
#define FIRST_KEY(after)                                                                  \
    "SELECT e.concurrency_key, e.concurrency_key > $3 FROM throttle.event e"              \
    " WHERE e.queue = $1 AND e.state = 'pending' AND e.concurrency_key IS NOT NULL" after \
    " ORDER BY e.concurrency_key LIMIT 1"
KeptPlan first_key{FIRST_KEY(" AND $2::text IS NULL"), 3, {TEXTOID, TEXTOID, TEXTOID}, nullptr};
KeptPlan next_key{
    FIRST_KEY(" AND e.concurrency_key > $2"), 3, {TEXTOID, TEXTOID, TEXTOID}, nullptr};
#undef FIRST_KEY

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
    Participant* served;  // those that gave an event this round
    int served_count;
    int served_capacity;
};

// Takes one event of `p`; false when it has none for this claim.
bool serve(Turns* turns, Participant* p) {
    const KeyTurnsClaim& claim = *turns->claim;
    if (p->key == nullptr) {
        return claim.unkeyed.take_next(claim.unkeyed.context, turns->taken);
    }
    // The key first (its lock, the count of its claims): a key another
    // claim is taking, or full, is passed without reading its events.
    if (!concurrency_key_has_room(claim.keys, p->key)) {
        return false;
    }
    Datum args[4] = {claim.queue, PointerGetDatum(p->key), claim.now,
                     PointerGetDatum(ids_array(p->of_key.values, p->of_key.count))};
    run_kept_plan(&key_next_event, args, nullptr, SPI_OK_SELECT, 1);
    if (SPI_processed == 0) {
        // None due (or all held back): its lock goes, so that keys with
        // nothing due do not use up the claim's kMaxKeysPerClaim.
        concurrency_key_pass(claim.keys, p->key);
        return false;
    }
    bool is_null = false;
    const Datum id = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null);
    (void)concurrency_key_admit(claim.keys, p->key);  // it has room: counts the event
    append(turns->taken, id, p->key);
    append(&p->of_key, id, p->key);
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

// Whether `key` is a key longer than `prefix` that starts with it: the key
// a truncated cursor stands for (or one that shares its first bytes).
bool extends(const text* key, const text* prefix) {
    const size_t length = VARSIZE_ANY_EXHDR(prefix);
    return VARSIZE_ANY_EXHDR(key) > length &&
           memcmp(VARDATA_ANY(key), VARDATA_ANY(prefix), length) == 0;
}

// The first round over the keys after `after` (nullptr: from the first)
// and up to `upto` (nullptr: to the last), one descent each; keys that
// extend `served` (a truncated cursor) are passed.
void keys_round(Turns* turns, const text* after, const text* upto, const text* served) {
    const KeyTurnsClaim& claim = *turns->claim;
    while (!full(*turns) && concurrency_keys_may_meet_more(*claim.keys)) {
        Datum args[3] = {claim.queue, PointerGetDatum(after), PointerGetDatum(upto)};
        const char nulls[3] = {' ', after == nullptr ? 'n' : ' ', upto == nullptr ? 'n' : ' '};
        run_kept_plan(after == nullptr ? &first_key : &next_key, args, nulls, SPI_OK_SELECT, 1);
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
        if (served == nullptr || !extends(key, served)) {
            first_round(turns, Participant{key, Ids{}});
        }
        after = key;
    }
}

}  // namespace

void take_in_turns(const KeyTurnsClaim& claim, const KeyCursor& cursor, Ids* taken) {
    Turns turns{&claim, taken, nullptr, 0, 8};
    turns.served = static_cast<Participant*>(palloc(sizeof(Participant) * 8));
    // The first round: the keys after the cursor (all of them after the
    // events without a key), the events without a key, the keys up to the
    // cursor.
    // A truncated cursor stands for a key longer than a slot keeps: the
    // keys that extend it come again in the next round, not now.
    keys_round(&turns, cursor.no_key ? nullptr : cursor.key, nullptr,
               cursor.truncated ? cursor.key : nullptr);
    if (!full(turns)) {
        first_round(&turns, Participant{nullptr, Ids{}});
    }
    if (!full(turns) && !cursor.no_key) {
        keys_round(&turns, nullptr, cursor.key, nullptr);
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
