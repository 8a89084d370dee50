// throttle.claim_group(queue, worker, lease, max): the due events of one
// group (every one, or up to max), for one worker, natively: each step is
// one statement whose plan this backend prepared once (kept_plan.hpp).
//
// Candidates come in two passes, each read in batches of 64 along an index
// (keyset, so a call reads only as far as the first free group): groups left
// behind by a claim whose lease expired, then groups with due events, oldest
// first; or, in a queue whose throttle.group_policy.fairness is
// 'round_robin', the groups with due events in turn by group_key, after the
// one served last (fair_cursors.hpp), read by a loose index scan of
// event_groups (one descent per group, however many events it has), once
// around: a group with 100 000 due events costs the others one look-up, not
// a walk past its events, and is served once per turn like them. A group
// already tried in this call is skipped by a hash lookup, and so is a paused
// group (throttle.pause), entered in the hash before the passes; a paused
// queue gives no group (both read with the policy). Before them, expired
// claims of throttle.claim that hold back a due grouped run of their
// item_key are ended (blocking_claims.hpp).
//
// No row of a group is locked before the group is chosen, and then only the
// rows the claim writes: a row lock lasts until the transaction ends, so a
// claim left in an open transaction (its worker works before COMMIT) would
// otherwise keep other workers and schedule off the rows of every group it
// looked at and passed over. For each new candidate:
//  0. when the queue's groups have buckets of their own (throttle.
//     group_bucket), the group's units: a group whose bucket is empty is
//     passed over at the cost of one look-up;
//  1. a lease slot in shared memory (group_lease.hpp): slot 0, or the first
//     free one of the N that throttle.group_policy gives the queue. A
//     group whose slots other workers hold costs N lookups;
//  2. the group's due events and the claims whose lease holds on it, read
//     in one statement (one snapshot) without locking anything: the table
//     is the durable truth, so a claim from before a restart counts even
//     though shared memory forgot it. The group is skipped when those
//     claims, the other slots' holders and this claim would be more than N.
//     A pending event whose item_key has a claimed run waits for it. In a
//     group kept in strict order only the events before the first one that
//     is not ready count. Of the due events (expired claims first, then by
//     run_at; in strict order by id), up to max, no more than the group's
//     own bucket and a bucket that limits the queue (claim_limit.hpp) have
//     units for now; none in the queue's: the call ends;
//  3. in a subtransaction (subtransaction.hpp), those events and the
//     group's expired claims locked, never waiting and never locking another
//     claim's events: when another transaction is changing one of them
//     (cancel, reschedule, schedule, or a claim or complete not committed
//     yet), fewer are locked than asked for, and the group is busy: the
//     subtransaction is rolled back, which unlocks the others, and the group
//     skipped. The holders the lock's snapshot shows are counted again. Then
//     the units taken for them, the queue's for no more than the group's
//     bucket had, then the group's; when they are fewer than the events
//     locked, the lock is rolled back and taken again for as many events as
//     units. Expired claims left out are ended for their old worker:
//     pending again, or dead when that claim was their last attempt; in a
//     strict group those after the old claim's first never ran, and get
//     their attempt back;
//  4. the events are marked claimed (mark_claimed.hpp) in the same
//     subtransaction (an UPDATE of rows another subtransaction locked would
//     make a MultiXact per row), which is then kept: the rows the claim
//     writes stay locked, and no others. The transaction's commit is durable
//     (durable_commit.hpp). A group whose due events all had their attempts
//     used up is released, and the next one tried.
#include "pg/registry/standby.hpp"
#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"
#include "pg/server/clock.hpp"
#include "pg/registry/holder.hpp"
#include "pg/server/kept_plan.hpp"
#include "pg/locks/locks.hpp"
#include "pg/queue/blocking_claims.hpp"
#include "pg/queue/claim_limit.hpp"
#include "pg/queue/durable_commit.hpp"
#include "pg/queue/event_rows.hpp"
#include "pg/queue/fair_cursors.hpp"
#include "pg/queue/group_lease.hpp"
#include "pg/queue/group_policy.hpp"
#include "pg/queue/mark_claimed.hpp"
#include "pg/queue/subtransaction.hpp"
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {
namespace {

constexpr long kCandidateBatch = 64;

// Pass 1: expired group claims, by lease end. Pass 2: due grouped events.
KeptPlan expired_group_claims{
    "SELECT e.group_key, e.lease_until, e.id FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'claimed' AND e.group_key IS NOT NULL"
    "   AND e.lease_until <= $2 AND (e.lease_until, e.id) > ($3, $4)"
    " ORDER BY e.lease_until, e.id LIMIT 64",
    4,
    {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID},
    nullptr};

KeptPlan due_grouped_events{
    "SELECT e.group_key, e.run_at, e.id FROM throttle.event e"
    " WHERE e.queue = $1 AND e.state = 'pending' AND e.group_key IS NOT NULL"
    "   AND e.run_at <= $2 AND (e.run_at, e.id) > ($3, $4)"
    " ORDER BY e.run_at, e.id LIMIT 64",
    4,
    {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID},
    nullptr};

// Round robin: the group keys of the queue ($1) with a pending event due at
// $2, in key order, after $3 (due_groups_first: from the first key), up to
// $4 (NULL: to the last). A recursive walk that finds each next key by one
// descent of event_groups (a loose index scan), evaluated only as far as the
// batch asks; each key's first due pending event looked up along
// event_groups in run_at order (a scalar subquery, not EXISTS: a look-up
// that stops at the first, not a join or a bitmap of every due event of the
// group; upper(state): not event_due_grouped, which has no group_key).
#define NEXT_KEY(bound)                               \
    "(SELECT e.group_key FROM throttle.event e"       \
    " WHERE e.queue = $1 AND e.group_key IS NOT NULL" \
    "   AND e.state IN ('pending', 'claimed') " bound " ORDER BY e.group_key LIMIT 1)"
#define DUE_GROUPS(anchor) \
    "WITH RECURSIVE k(group_key) AS ("                                                       \
    "  SELECT " anchor " UNION ALL"                                                          \
    "  SELECT " NEXT_KEY("AND e.group_key > k.group_key")                                    \
    "  FROM k WHERE k.group_key IS NOT NULL AND ($4::text IS NULL OR k.group_key < $4))"     \
    " SELECT k.group_key FROM k"                                                             \
    " WHERE k.group_key IS NOT NULL AND ($4::text IS NULL OR k.group_key <= $4)"             \
    "   AND (SELECT true FROM throttle.event e"                                              \
    "        WHERE e.queue = $1 AND e.group_key = k.group_key"                               \
    "          AND e.group_key IS NOT NULL AND e.state IN ('pending', 'claimed')"            \
    "          AND e.run_at <= $2 AND upper(e.state) = 'PENDING'"                            \
    "        ORDER BY e.run_at LIMIT 1) IS TRUE"

KeptPlan due_groups_after{DUE_GROUPS(NEXT_KEY("AND e.group_key > $3")),
                          4,
                          {TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID},
                          nullptr};

KeptPlan due_groups_first{DUE_GROUPS(NEXT_KEY("AND $3::text IS NULL")),
                          4,
                          {TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID},
                          nullptr};

#undef DUE_GROUPS
#undef NEXT_KEY

// Fragments of the statements below, with e the event and $1, $2, $3 the
// queue, the group_key and now. GROUP_EVENTS: the group's events that are
// not finished, along event_groups. HOLDS: another claim's, whose lease
// holds. DUE_PENDING: a pending event due now whose item_key has no claimed
// run (event_claimed_key; one lookup per row, as claim_sql.cpp's due_events
// says): one that has waits for it. LOCKABLE: what a claim may take,
// rechecked on the row it locks (an event that turned into a claim whose
// lease holds after the snapshot fails it). upper(state) keeps the generic
// plan from reading every claimed event of the queue through the partial
// indexes on state = 'claimed' instead of event_groups.
#define GROUP_EVENTS                                                \
    "e.queue = $1 AND e.group_key = $2 AND e.group_key IS NOT NULL" \
    " AND e.state IN ('pending', 'claimed')"
#define HOLDS "e.state = 'claimed' AND (e.lease_until > $3) IS TRUE"
#define DUE_PENDING                                                                      \
    "e.run_at <= $3 AND NOT EXISTS (SELECT 1 FROM throttle.event c"                      \
    "                               WHERE c.queue = e.queue AND c.item_key = e.item_key" \
    "                                 AND c.state = 'claimed' OFFSET 0)"
#define LOCKABLE                                                         \
    "((upper(e.state) = 'CLAIMED' AND (e.lease_until > $3) IS NOT TRUE)" \
    " OR (upper(e.state) = 'PENDING' AND " DUE_PENDING "))"
// The result of both reads: the due events' ids in the claim's order, the
// expired claims among them, and the tokens of the claims whose lease holds.
#define DUE_RESULT(order)                                                    \
    " SELECT (SELECT array_agg(d.id ORDER BY " order                         \
    ") FROM due d),"                                                         \
    "        (SELECT array_agg(d.id) FROM due d WHERE d.state = 'claimed')," \
    "        (SELECT array_agg(DISTINCT g.claim_token) FROM grp g WHERE g.holds)"

// Step 2: the group's due events, read without locking anything, expired
// claims first, then by run_at. Claims whose lease holds are other
// workers': never taken.
KeptPlan group_due{
    "WITH grp AS ("
    "  SELECT e.id, e.state, e.run_at, e.claim_token, " HOLDS
    " AS holds FROM throttle.event e"
    "  WHERE " GROUP_EVENTS " AND (upper(e.state) = 'CLAIMED' OR (" DUE_PENDING
    "))),"
    " due AS (SELECT g.id, g.state, g.run_at FROM grp g WHERE NOT g.holds)" DUE_RESULT(
        "d.state = 'claimed' DESC, d.run_at, d.id"),
    3,
    {TEXTOID, TEXTOID, TIMESTAMPTZOID},
    nullptr};

// The same for a queue whose groups keep strict order: the group's events in
// id order up to the first one that is not ready (pending with run_at after
// now, or waiting for a claimed run of its item_key), ids in id order.
KeptPlan group_due_strict{
    "WITH grp AS ("
    "  SELECT e.id, e.state, e.claim_token, " HOLDS
    " AS holds,"
    "         upper(e.state) = 'CLAIMED' OR (" DUE_PENDING
    ") AS ready"
    "  FROM throttle.event e WHERE " GROUP_EVENTS
    "),"
    " due AS ("
    "  SELECT g.id, g.state FROM grp g"
    "  WHERE g.ready AND NOT g.holds"
    "    AND g.id < coalesce((SELECT min(n.id) FROM grp n WHERE NOT n.ready),"
    "                        9223372036854775807))" DUE_RESULT("d.id"),
    3,
    {TEXTOID, TEXTOID, TIMESTAMPTZOID},
    nullptr};

// Step 3: the events the claim takes ($4) and the group's expired claims
// ($5, NULL for none) locked, never waiting, found by primary key and
// rechecked; how many ids there are, how many were locked, and the tokens
// of the claims whose lease holds, as this statement's snapshot shows them.
KeptPlan lock_events{
    "WITH locked AS ("
    "  SELECT e.id FROM throttle.event e"
    "  WHERE e.id = ANY ($4 || coalesce($5, '{}'))"
    "    AND e.queue = $1 AND e.group_key = $2 AND " LOCKABLE
    "  FOR UPDATE OF e SKIP LOCKED)"
    " SELECT (SELECT count(DISTINCT i) FROM unnest($4 || coalesce($5, '{}')) AS i),"
    "        (SELECT count(*) FROM locked),"
    "        (SELECT array_agg(DISTINCT e.claim_token) FROM throttle.event e"
    "         WHERE " GROUP_EVENTS " AND " HOLDS ")",
    5,
    {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT8ARRAYOID, INT8ARRAYOID},
    nullptr};

#undef DUE_RESULT
#undef LOCKABLE
#undef DUE_PENDING
#undef HOLDS
#undef GROUP_EVENTS

// The expired claims of $1 after the first (by id) of each old claim: in a
// strict group they waited behind it and never ran.
KeptPlan never_ran{
    "SELECT coalesce(array_agg(e.id), '{}') FROM throttle.event e"
    " WHERE e.id = ANY ($1)"
    "   AND e.id > (SELECT min(x.id) FROM throttle.event x"
    "               WHERE x.id = ANY ($1) AND x.claim_token = e.claim_token)",
    1,
    {INT8ARRAYOID},
    nullptr};

// Expired claims ($1) that this claim does not take ($3) ended for their
// worker (throttle._fence_claims); those that never ran ($4, never_ran's)
// get their attempt back.
KeptPlan fence_claims{
    "SELECT count(*) FROM throttle._fence_claims("
    "  ARRAY(SELECT unnest($1::bigint[]) EXCEPT SELECT unnest($3::bigint[])), $2,"
    "  coalesce($4, '{}'))",
    4,
    {INT8ARRAYOID, TIMESTAMPTZOID, INT8ARRAYOID, INT8ARRAYOID},
    nullptr};

// The groups this call has tried: a hash of their keys, each bucket a chain
// of the keys with that hash (copies, in the call's memory context).
struct TriedKey {
    const text* group_key;
    TriedKey* next;
};

struct TriedBucket {
    uint32 hash;  // the hash table's key
    TriedKey* keys;
};

HTAB* tried_groups_create() {
    HASHCTL info{};
    info.keysize = sizeof(uint32);
    info.entrysize = sizeof(TriedBucket);
    info.hcxt = CurrentMemoryContext;
    return hash_create("pg_throttle claim_group tried groups", 256, &info,
                       HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

// Whether `group_key` was tried before in this call; records it when not.
bool tried_before(HTAB* tried, const text* group_key) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(VARDATA_ANY(group_key));
    const int len = static_cast<int>(VARSIZE_ANY_EXHDR(group_key));
    const uint32 hash = DatumGetUInt32(hash_any(bytes, len));
    bool found = false;
    auto* bucket = static_cast<TriedBucket*>(hash_search(tried, &hash, HASH_ENTER, &found));
    if (!found) {
        bucket->keys = nullptr;
    }
    for (const TriedKey* key = bucket->keys; key != nullptr; key = key->next) {
        if (static_cast<int>(VARSIZE_ANY_EXHDR(key->group_key)) == len &&
            memcmp(VARDATA_ANY(key->group_key), bytes, len) == 0) {
            return true;
        }
    }
    auto* key = static_cast<TriedKey*>(palloc(sizeof(TriedKey)));
    key->group_key =
        reinterpret_cast<const text*>(PG_DETOAST_DATUM_COPY(PointerGetDatum(group_key)));
    key->next = bucket->keys;
    bucket->keys = key;
    return false;
}

// The groups paused on their own (throttle.pause), counted as tried: both
// passes skip them, their due events and their expired claims alike.
void mark_paused_tried(HTAB* tried, ArrayType* paused_groups) {
    if (paused_groups == nullptr) {
        return;
    }
    Datum* keys = nullptr;
    bool* nulls = nullptr;
    int count = 0;
    deconstruct_array(paused_groups, TEXTOID, -1, false, TYPALIGN_INT, &keys, &nulls, &count);
    for (int i = 0; i < count; i++) {
        if (!nulls[i]) {
            tried_before(tried, DatumGetTextPP(keys[i]));
        }
    }
}

struct GroupClaim {
    const ClaimLimit* limit;
    const GroupLimit* group_limit;
    GroupPolicy policy;  // throttle.group_policy
    int64 max;           // events per claim; INT64_MAX for every due one
    Datum queue;
    Datum worker;
    Datum lease;
    int64 lease_us;
    const Holder* holder;
    TimestampTz now;
};

// Takes the first free lease slot of the group (step 1): its key in `*key`
// and its token, or 0 when other workers hold every slot.
int64 take_slot(const GroupClaim& claim, const text* group_key, RegistryKey* key, int* slot) {
    for (*slot = 0; *slot < claim.policy.workers; (*slot)++) {
        group_lease_key(DatumGetTextPP(claim.queue), group_key, *slot, key);
        const int64 token = group_lease_take(*key, claim.lease_us, *claim.holder);
        if (token != 0) {
            return token;
        }
    }
    return 0;
}

// Whether this claim would make more than claim.policy.workers holders of the group:
// the claims whose lease holds in the table (`held_tokens`, never this
// claim's), the other slots' holders in shared memory, and this claim.
bool too_many_holders(const GroupClaim& claim, const text* group_key, int slot,
                      ArrayType* held_tokens) {
    if (held_tokens == nullptr) {
        return false;  // only the slots' holders, at most one per slot
    }
    if (claim.policy.workers == 1) {
        return true;  // a claim holds it: from before a restart, or just extended
    }
    Datum* tokens = nullptr;
    int count = 0;
    deconstruct_array(held_tokens, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
                      &tokens, nullptr, &count);
    int holders = 1 + count;  // this claim and the table's
    for (int other = 0; other < claim.policy.workers; other++) {
        if (other == slot) {
            continue;
        }
        RegistryKey key;
        group_lease_key(DatumGetTextPP(claim.queue), group_key, other, &key);
        const int64 token = lock_token_held(key);
        bool in_table = false;
        for (int i = 0; i < count && !in_table; i++) {
            in_table = DatumGetInt64(tokens[i]) == token;
        }
        if (token != 0 && !in_table) {
            holders++;
        }
    }
    return holders > claim.policy.workers;
}

// An array column of SPI_tuptable's first row, copied; nullptr when NULL.
ArrayType* array_column(int column) {
    bool is_null = true;
    const Datum value =
        SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, column, &is_null);
    return is_null ? nullptr : DatumGetArrayTypePCopy(value);
}

int array_length(const ArrayType* array) {
    return ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
}

// Steps 3 and 4 for one group, in a subtransaction (run_in_subtransaction):
// what they take, and what they found. The claim writes its events in the
// subtransaction that locked them: an UPDATE of a row that another
// (sub)transaction of ours locked makes a MultiXact of the two, one per row.
struct GroupTake {
    const GroupClaim* claim;
    const text* group_key;
    int slot;
    int64 token;         // the group lease's
    ArrayType* ids;      // the events to claim, in the claim's order
    ArrayType* expired;  // the group's expired claims; nullptr: none
    int free;            // how many events were due
    bool units_taken;    // by an earlier try: take none again
    bool fewer_units;    // out: the buckets gave units for fewer than `ids` (now cut to them)
    bool bucket_empty;   // out: the queue's bucket had no unit left
    const SPITupleTable* rows;  // out: the rows claimed
    uint64 claimed;             // out: how many
};

// Locks the events of `take->ids` and the group's expired claims, never
// waiting; then, unless an earlier try did, takes the units for them. True
// when every one was locked, the group has no more holders than it takes,
// and the buckets gave units for all of them.
bool lock_group_events(GroupTake* take) {
    const GroupClaim& claim = *take->claim;
    Datum args[5] = {claim.queue, PointerGetDatum(take->group_key), TimestampTzGetDatum(claim.now),
                     PointerGetDatum(take->ids), PointerGetDatum(take->expired)};
    const char nulls[5] = {' ', ' ', ' ', ' ', take->expired == nullptr ? 'n' : ' '};
    run_kept_plan(&lock_events, args, nulls, SPI_OK_SELECT, 1);
    bool is_null = true;
    const int64 wanted =
        DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
    const int64 locked =
        DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &is_null));
    if (locked < wanted || too_many_holders(claim, take->group_key, take->slot, array_column(3))) {
        return false;  // busy: another transaction is changing one of them
    }
    if (take->units_taken) {
        return true;
    }
    // The queue's units for no more than the group's bucket had (step 2),
    // then the group's for no more than the queue gave: units are lost (a
    // bucket errs on the side of fewer events) only when another claim of
    // this group took the group's units in between, or when, the buckets
    // having given fewer units than events, one of the events the claim then
    // takes turned busy before the second try.
    const text* queue = DatumGetTextPP(claim.queue);
    const int64 count = array_length(take->ids);
    const int64 queue_allowed = claim_limit_take(*claim.limit, claim.now, count);
    if (queue_allowed == 0) {  // the queue's bucket is empty: no group now
        take->bucket_empty = true;
        return false;
    }
    const int64 allowed =
        group_limit_take(*claim.group_limit, queue, take->group_key, claim.now, queue_allowed);
    take->units_taken = true;
    if (allowed < count) {
        take->fewer_units = allowed > 0;
        take->ids = allowed > 0 ? first_ids(take->ids, static_cast<int>(allowed)) : nullptr;
        return false;
    }
    return true;
}

// Steps 3 and 4 (run_in_subtransaction's step): the events locked, then
// claimed; false, nothing written and nothing locked, when the group is
// passed over.
bool take_group_events(void* arg) {
    auto* take = static_cast<GroupTake*>(arg);
    if (!lock_group_events(take)) {
        return false;
    }
    const GroupClaim& claim = *take->claim;
    // In a strict group only the first event of an expired claim ran (its
    // worker went in order and stopped there): the others are not charged.
    ArrayType* uncharged = nullptr;
    if (claim.policy.strict_order && take->expired != nullptr) {
        Datum expired_args[1] = {PointerGetDatum(take->expired)};
        run_kept_plan(&never_ran, expired_args, nullptr, SPI_OK_SELECT, 1);
        uncharged = array_column(1);
    }
    if (take->expired != nullptr && array_length(take->ids) < take->free) {
        // The first events (expired claims first, then the oldest; in strict
        // order by id), as many as max and the buckets allow. Expired claims
        // left out are ended for their worker now, or it could still complete
        // them while this claim holds the group; those that never ran are
        // not charged for it (nor made dead by it).
        Datum fence_args[4] = {PointerGetDatum(take->expired), TimestampTzGetDatum(claim.now),
                               PointerGetDatum(take->ids), PointerGetDatum(uncharged)};
        const char fence_nulls[4] = {' ', ' ', ' ', uncharged == nullptr ? 'n' : ' '};
        run_kept_plan(&fence_claims, fence_args, fence_nulls, SPI_OK_SELECT);
    }
    const ClaimRequest request{take->ids,
                               take->expired != nullptr,
                               claim.worker,
                               claim.lease,
                               take->token,
                               claim.now,
                               claim.policy.strict_order ? ClaimOrder::kId : ClaimOrder::kRunAt,
                               uncharged};
    take->claimed = mark_claimed(request, &take->rows);
    return true;  // kept even when every event was out of attempts: they are dead now
}

// Step 2 for the group whose lease slot `slot` this claim holds: its due
// events read, and the ones the claim takes chosen (in the claim's order).
// False when the group is passed over.
bool choose_group_events(GroupTake* take) {
    const GroupClaim& claim = *take->claim;
    Datum args[3] = {claim.queue, PointerGetDatum(take->group_key), TimestampTzGetDatum(claim.now)};
    run_kept_plan(claim.policy.strict_order ? &group_due_strict : &group_due, args, nullptr,
                  SPI_OK_SELECT, 1);
    ArrayType* ids = array_column(1);
    take->expired = array_column(2);
    if (ids == nullptr || too_many_holders(claim, take->group_key, take->slot, array_column(3))) {
        return false;
    }
    take->free = array_length(ids);
    // No more events locked than the buckets have units for now.
    const text* queue = DatumGetTextPP(claim.queue);
    const int64 group_has =
        group_limit_available(*claim.group_limit, queue, take->group_key, claim.now,
                              std::min<int64>(take->free, claim.max));
    if (group_has == 0) {  // emptied since the look-up: pass the group over
        return false;
    }
    const int64 queue_has = claim_limit_available(*claim.limit, claim.now, group_has);
    if (queue_has == 0) {  // the queue's bucket is empty: no group now
        take->bucket_empty = true;
        return false;
    }
    take->ids = queue_has < take->free ? first_ids(ids, static_cast<int>(queue_has)) : ids;
    return true;
}

// Claims the due events of `group_key` if the group is free (steps 1-4);
// how many, their rows in `*rows`. Sets `*bucket_empty` when the queue's
// bucket had no unit left.
uint64 claim_one_group(const GroupClaim& claim, const text* group_key, const SPITupleTable** rows,
                       bool* bucket_empty) {
    const text* queue = DatumGetTextPP(claim.queue);
    if (group_limit_available(*claim.group_limit, queue, group_key, claim.now, 1) == 0) {
        return 0;  // the group's own bucket is empty
    }
    GroupTake take{};
    take.claim = &claim;
    take.group_key = group_key;
    RegistryKey key;
    take.token = take_slot(claim, group_key, &key, &take.slot);
    if (take.token == 0) {
        return 0;  // other workers hold the group (shared memory)
    }
    bool taken = choose_group_events(&take) && run_in_subtransaction(take_group_events, &take);
    if (!taken && take.fewer_units) {  // again, for as many events as units
        taken = run_in_subtransaction(take_group_events, &take);
    }
    *bucket_empty = take.bucket_empty;
    if (!taken || take.claimed == 0) {  // passed over, or every due event was out of attempts
        lock_release(key, take.token);
        return 0;
    }
    *rows = take.rows;
    return take.claimed;
}

// Reads the candidates of one pass (expired group claims, or due grouped
// events) in batches and claims the first free group not tried yet; how many
// events, their rows in `*rows`. Stops at an empty bucket (`*bucket_empty`).
uint64 claim_from_pass(const GroupClaim& claim, KeptPlan* pass, HTAB* tried,
                       const SPITupleTable** rows, bool* bucket_empty) {
    TimestampTz after_at = DT_NOBEGIN;
    int64 after_id = 0;
    for (;;) {
        Datum args[4] = {claim.queue, TimestampTzGetDatum(claim.now), TimestampTzGetDatum(after_at),
                         Int64GetDatum(after_id)};
        run_kept_plan(pass, args, nullptr, SPI_OK_SELECT, kCandidateBatch);
        SPITupleTable* candidates = SPI_tuptable;  // the claims below run other statements
        const uint64 count = SPI_processed;
        if (count == 0) {
            return 0;
        }
        for (uint64 i = 0; i < count; i++) {
            const HeapTuple row = candidates->vals[i];
            const TupleDesc desc = candidates->tupdesc;
            bool is_null = true;
            const text* group_key = DatumGetTextPP(SPI_getbinval(row, desc, 1, &is_null));
            after_at = DatumGetTimestampTz(SPI_getbinval(row, desc, 2, &is_null));
            after_id = DatumGetInt64(SPI_getbinval(row, desc, 3, &is_null));
            if (tried_before(tried, group_key)) {
                continue;
            }
            const uint64 claimed = claim_one_group(claim, group_key, rows, bucket_empty);
            if (claimed > 0 || *bucket_empty) {
                return claimed;
            }
        }
        SPI_freetuptable(candidates);
    }
}

// Round robin (fairness = 'round_robin'): the groups with due events after
// `cursor`, the one served last, then from the first key up to it (once
// around, so the group served last comes again only when no other is free),
// each not tried yet offered to claim_one_group; the one claimed is the
// queue's cursor from now on. Stops at an empty bucket (`*bucket_empty`).
uint64 claim_round_robin(const GroupClaim& claim, const text* cursor, HTAB* tried,
                         const SPITupleTable** rows, bool* bucket_empty) {
    const text* queue = DatumGetTextPP(claim.queue);
    for (int turn = 0; turn < 2; turn++) {
        const text* after = turn == 0 ? cursor : nullptr;  // nullptr: from the first key
        const text* upto = turn == 0 ? nullptr : cursor;   // nullptr: to the last
        for (;;) {
            Datum args[4] = {claim.queue, TimestampTzGetDatum(claim.now), PointerGetDatum(after),
                             PointerGetDatum(upto)};
            const char nulls[4] = {' ', ' ', after == nullptr ? 'n' : ' ',
                                   upto == nullptr ? 'n' : ' '};
            run_kept_plan(after == nullptr ? &due_groups_first : &due_groups_after, args, nulls,
                          SPI_OK_SELECT, kCandidateBatch);
            SPITupleTable* candidates = SPI_tuptable;  // the claims below run other statements
            const uint64 count = SPI_processed;
            for (uint64 i = 0; i < count; i++) {
                bool is_null = true;
                const text* group_key = DatumGetTextPP(
                    SPI_getbinval(candidates->vals[i], candidates->tupdesc, 1, &is_null));
                if (tried_before(tried, group_key)) {
                    continue;
                }
                const uint64 claimed = claim_one_group(claim, group_key, rows, bucket_empty);
                if (claimed > 0) {
                    fair_group_cursor_store(queue, group_key);
                    return claimed;
                }
                if (*bucket_empty) {
                    return 0;
                }
            }
            if (count < static_cast<uint64>(kCandidateBatch)) {
                break;  // this turn's keys are all read
            }
            bool is_null = true;
            after = DatumGetTextPCopy(
                SPI_getbinval(candidates->vals[count - 1], candidates->tupdesc, 1, &is_null));
            SPI_freetuptable(candidates);
        }
    }
    return 0;
}

// (queue text, worker text, lease interval, max integer) -> SETOF throttle.event
Datum claim_group(FunctionCallInfo fcinfo) {
    standby_refuse("throttle.claim_group");
    require_not_null(fcinfo, 0, "queue");
    require_not_null(fcinfo, 1, "worker");
    require_not_null(fcinfo, 2, "lease");
    const Interval* lease = PG_GETARG_INTERVAL_P(2);
    require_positive_interval(lease, "lease");
    int64 max = std::numeric_limits<int64>::max();
    if (PG_NARGS() > 3 && !PG_ARGISNULL(3)) {
        if (PG_GETARG_INT32(3) <= 0) {
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("max must be positive or NULL")));
        }
        max = PG_GETARG_INT32(3);
    }
    registry_require();
    const Holder holder = holder_from_argument(fcinfo, 1);
    const int64 lease_us = positive_interval(lease, "lease");

    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    // The policy first: its lock may wait for a change of it, and the
    // claim's leases count from the time after that wait.
    const GroupPolicy policy = group_policy_for_claim(PG_GETARG_TEXT_PP(0));
    const TimestampTz now = clock_now();
    require_ends_after(now, lease, "lease");
    if (policy.paused) {  // throttle.pause: no group of the queue now
        InitMaterializedSRF(fcinfo, 0);
        SPI_finish();
        return static_cast<Datum>(0);
    }
    const ClaimLimits limits = claim_limits_of(PG_GETARG_TEXT_PP(0));
    const ClaimLimit& limit = limits.queue;
    if (claim_limit_available(limit, now, 1) == 0) {  // an empty bucket: no group now
        InitMaterializedSRF(fcinfo, 0);
        SPI_finish();
        return static_cast<Datum>(0);
    }
    const GroupClaim claim{&limit,
                           &limits.groups,
                           policy,
                           max,
                           PG_GETARG_DATUM(0),
                           PG_GETARG_DATUM(1),
                           PG_GETARG_DATUM(2),
                           lease_us,
                           &holder,
                           now};
    // An expired claim of throttle.claim holding back a due grouped run of
    // its item_key is ended first (blocking_claims.hpp).
    end_blocking_claims(claim.queue, now, Claimer::kClaimGroup);
    HTAB* tried = tried_groups_create();
    mark_paused_tried(tried, policy.paused_groups);
    const SPITupleTable* rows = nullptr;
    uint64 claimed = 0;
    bool bucket_empty = false;
    for (KeptPlan* pass : {&expired_group_claims, &due_grouped_events}) {
        const text* cursor = pass == &due_grouped_events && policy.round_robin
                                 ? fair_group_cursor_of(DatumGetTextPP(claim.queue))
                                 : nullptr;
        if (cursor != nullptr) {
            claimed = claim_round_robin(claim, cursor, tried, &rows, &bucket_empty);
        } else {
            // Oldest first; also round robin's first claim, and one whose
            // cursor was evicted (more queues claiming than slots): it is
            // served as oldest first would, never always from the first key,
            // and leaves the cursor for the next.
            claimed = claim_from_pass(claim, pass, tried, &rows, &bucket_empty);
            if (claimed > 0 && pass == &due_grouped_events && policy.round_robin) {
                bool is_null = true;
                const Datum group_key =
                    SPI_getbinval(rows->vals[0], rows->tupdesc,
                                  SPI_fnumber(rows->tupdesc, "group_key"), &is_null);
                if (!is_null) {
                    fair_group_cursor_store(DatumGetTextPP(claim.queue), DatumGetTextPP(group_key));
                }
            }
        }
        if (claimed > 0 || bucket_empty) {
            break;
        }
    }
    if (claimed > 0) {
        require_durable_commit();
        return_events(fcinfo, rows, claimed);
    } else {
        InitMaterializedSRF(fcinfo, 0);
    }
    SPI_finish();
    return static_cast<Datum>(0);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_claim_group, pg_throttle::pg::claim_group)
