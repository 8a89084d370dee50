// Per-key concurrency for throttle.claim (concurrency_keys.hpp).
#include "pg/queue/concurrency_keys.hpp"

#include "pg/server/kept_plan.hpp"
#include "pg/queue/policy_lock.hpp"

extern "C" {
#include "storage/lmgr.h"
}

namespace pg_throttle::pg {
namespace {

KeptPlan policy_query{
    "SELECT max_claimed FROM throttle.concurrency_policy WHERE queue = $1", 1, {TEXTOID}, nullptr};

// Found through event_claimed_concurrency.
KeptPlan claims_of_key{
    "SELECT count(*) FROM throttle.event c"
    " WHERE c.queue = $1 AND c.concurrency_key = $2 AND c.state = 'claimed'"
    "   AND c.concurrency_key IS NOT NULL AND c.lease_until > $3",
    3,
    {TEXTOID, TEXTOID, TIMESTAMPTZOID},
    nullptr};

}  // namespace

LOCKTAG concurrency_key_lock_tag(Datum queue, const text* key) {
    const text* queue_text = DatumGetTextPP(queue);
    const uint64 queue_hash =
        hash_bytes_extended(reinterpret_cast<const unsigned char*>(VARDATA_ANY(queue_text)),
                            static_cast<int>(VARSIZE_ANY_EXHDR(queue_text)), 0);
    const uint64 hash =
        hash_bytes_extended(reinterpret_cast<const unsigned char*>(VARDATA_ANY(key)),
                            static_cast<int>(VARSIZE_ANY_EXHDR(key)), queue_hash);
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, static_cast<uint32>(hash >> 32),
                         static_cast<uint32>(hash), kConcurrencyKeyLockClass);
    return tag;
}

namespace {

// The key lock, taken without waiting until the transaction ends; false
// when another transaction holds it.
bool try_lock_key(Datum queue, const text* key) {
    LOCKTAG tag = concurrency_key_lock_tag(queue, key);
    return LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

void unlock_key(Datum queue, const text* key) {
    LOCKTAG tag = concurrency_key_lock_tag(queue, key);
    (void)LockRelease(&tag, ExclusiveLock, false);
}

int32 read_policy(ConcurrencyKeys* keys) {
    if (!keys->policy_read && !try_lock_queue_policies_shared()) {
        keys->max_claimed = 0;  // a change of it in progress: no keyed event now
        keys->policy_read = true;
    }
    if (!keys->policy_read) {
        Datum args[1] = {keys->queue};
        run_kept_plan_latest(&policy_query, args, nullptr, SPI_OK_SELECT, 1);
        keys->max_claimed = 1;
        if (SPI_processed == 1) {
            bool is_null = false;
            keys->max_claimed = DatumGetInt32(
                SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
        }
        SPI_freetuptable(SPI_tuptable);
        keys->policy_read = true;
    }
    return keys->max_claimed;
}

// How many more events of `key` may be claimed now: the policy's
// max_claimed less the key's claims whose lease holds. Under the key lock.
int32 room_of(ConcurrencyKeys* keys, const text* key) {
    const int32 max_claimed = read_policy(keys);
    if (max_claimed == 0) {
        return 0;
    }
    Datum args[3] = {keys->queue, PointerGetDatum(key), TimestampTzGetDatum(keys->now)};
    run_kept_plan_latest(&claims_of_key, args, nullptr, SPI_OK_SELECT, 1);
    bool is_null = false;
    const int64 claimed =
        DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
    SPI_freetuptable(SPI_tuptable);
    return claimed >= max_claimed ? 0 : static_cast<int32>(max_claimed - claimed);
}

KeyRoom* find(const ConcurrencyKeys& keys, const text* key) {
    for (int i = 0; i < keys.count; ++i) {
        const text* known = keys.keys[i].key;
        if (VARSIZE_ANY_EXHDR(known) == VARSIZE_ANY_EXHDR(key) &&
            std::memcmp(VARDATA_ANY(known), VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key)) == 0) {
            return &keys.keys[i];
        }
    }
    return nullptr;
}

KeyRoom* add(ConcurrencyKeys* keys, const text* key, int32 room) {
    if (keys->count == keys->capacity) {
        keys->capacity *= 2;
        keys->keys = static_cast<KeyRoom*>(
            repalloc(keys->keys, sizeof(KeyRoom) * static_cast<size_t>(keys->capacity)));
    }
    KeyRoom* entry = &keys->keys[keys->count++];
    entry->key = DatumGetTextPCopy(PointerGetDatum(key));
    entry->room = room;
    entry->taken = 0;
    return entry;
}

// The keys met so far that have room left (with_room) or none, as a text[].
ArrayType* keys_array(const ConcurrencyKeys& keys, bool with_room) {
    auto* elements =
        static_cast<Datum*>(palloc(sizeof(Datum) * (keys.count == 0 ? 1 : keys.count)));
    int n = 0;
    for (int i = 0; i < keys.count; ++i) {
        if ((keys.keys[i].room > 0) == with_room) {
            elements[n++] = PointerGetDatum(keys.keys[i].key);
        }
    }
    return construct_array(elements, n, TEXTOID, -1, false, TYPALIGN_INT);
}

}  // namespace

ConcurrencyKeys concurrency_keys_start(Datum queue, TimestampTz now, ArrayType* full) {
    ConcurrencyKeys keys{};
    keys.queue = queue;
    keys.now = now;
    keys.capacity = 8;
    keys.keys = static_cast<KeyRoom*>(palloc(sizeof(KeyRoom) * 8));
    Datum* elements = nullptr;
    int n = 0;
    deconstruct_array(full, TEXTOID, -1, false, TYPALIGN_INT, &elements, nullptr, &n);
    for (int i = 0; i < n; ++i) {
        (void)add(&keys, DatumGetTextPP(elements[i]), 0);
    }
    return keys;
}

namespace {

// The claim's entry of `key`: the first time it meets `key`, it takes the
// key lock and counts the key's claims.
KeyRoom* meet(ConcurrencyKeys* keys, const text* key) {
    KeyRoom* entry = find(*keys, key);
    if (entry == nullptr) {
        if (keys->locked >= kMaxKeysPerClaim || !try_lock_key(keys->queue, key)) {
            entry = add(keys, key, 0);
        } else {
            ++keys->locked;
            const int32 room = room_of(keys, key);
            entry = add(keys, key, room);
            if (room == 0) {  // nothing of it taken: let the others have it
                unlock_key(keys->queue, key);
                --keys->locked;
            }
        }
    }
    return entry;
}

}  // namespace

bool concurrency_key_admit(ConcurrencyKeys* keys, const text* key) {
    KeyRoom* entry = meet(keys, key);
    if (entry->room == 0) {
        return false;
    }
    --entry->room;
    ++entry->taken;
    return true;
}

bool concurrency_key_has_room(ConcurrencyKeys* keys, const text* key) {
    return meet(keys, key)->room > 0;
}

void concurrency_key_pass(ConcurrencyKeys* keys, const text* key) {
    KeyRoom* entry = find(*keys, key);
    if (entry != nullptr && entry->room > 0 && entry->taken == 0) {  // it holds the key lock
        unlock_key(keys->queue, key);
        --keys->locked;
        entry->room = 0;
    }
}

bool concurrency_keys_may_meet_more(const ConcurrencyKeys& keys) {
    return keys.locked < kMaxKeysPerClaim && !(keys.policy_read && keys.max_claimed == 0);
}

ArrayType* concurrency_keys_open(const ConcurrencyKeys& keys) {
    return concurrency_keys_may_meet_more(keys) ? nullptr : keys_array(keys, true);
}

ArrayType* concurrency_keys_full(const ConcurrencyKeys& keys) {
    return keys_array(keys, false);
}

}  // namespace pg_throttle::pg
