// The lease that holds a group of the event queue: taken by claim_group
// (claim_group.cpp), renewed by extend (extend.cpp), and ended by
// throttle._group_release, _group_release_at_commit and _group_reset.
// Internal: called by the queue's SECURITY DEFINER functions, not granted
// to PUBLIC.
//
// Groups have a kind of their own (EntryKind::kQueueGroup), so no name given
// to throttle.lock can reach them. They are not journaled: the claimed rows
// of throttle.event, with their lease_until, are the durable truth of a group
// claim (the queue checks them before it hands a group out), so after a
// crash a group no claim holds is free at once. A lease taken follows its
// transaction (group_lease_xact.hpp).
#include "pg/queue/group_lease.hpp"

#include "pg/locks/locks.hpp"
#include "pg/queue/group_lease_xact.hpp"

#include "pg/arguments.hpp"
#include "pg/boundary.hpp"

#include <cstdio>

namespace pg_throttle::pg {

// The key of slot 0: "<bytes of queue>:<queue>:<group_key>", or, when that
// does not fit a registry name, "<bytes of queue>:<queue>#<SHA-256 of
// group_key in hex>". Both forms name the queue first, and the byte after it
// tells them apart, so no group_key of one form can name a group of the
// other. Two group_keys with one digest would share a lease: each would wait
// for the other, never run beside it. Slot k > 0 starts "<bytes of
// queue>/<k>:" instead: the byte after the length tells it from slot 0.
void group_lease_key(const text* queue, const text* group, int slot, RegistryKey* key) {
    queue_group_key(EntryKind::kQueueGroup, queue, group, slot, key);
}

void queue_group_key(EntryKind kind, const text* queue, const text* group, int slot,
                     RegistryKey* key) {
    Assert(slot >= 0 && slot < kMaxGroupWorkers);
    const size_t queue_len = VARSIZE_ANY_EXHDR(queue);
    const size_t group_len = VARSIZE_ANY_EXHDR(group);
    char name[core::kMaxNameBytes + 1];
    const int prefix = slot == 0 ? std::snprintf(name, sizeof name, "%zu:", queue_len)
                                 : std::snprintf(name, sizeof name, "%zu/%d:", queue_len, slot);
    constexpr size_t kDigestHex = size_t{2} * PG_SHA256_DIGEST_LENGTH;
    if (static_cast<size_t>(prefix) + queue_len + 1 + kDigestHex > core::kMaxNameBytes) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("queue name must have 1 to 63 bytes")));
    }
    char* pos = name + prefix;
    memcpy(pos, VARDATA_ANY(queue), queue_len);
    pos += queue_len;
    if (static_cast<size_t>(prefix) + queue_len + 1 + group_len <= core::kMaxNameBytes) {
        *pos++ = ':';
        memcpy(pos, VARDATA_ANY(group), group_len);
        pos += group_len;
    } else {
        uint8 digest[PG_SHA256_DIGEST_LENGTH];
        pg_cryptohash_ctx* ctx = pg_cryptohash_create(PG_SHA256);
        if (ctx == nullptr || pg_cryptohash_init(ctx) < 0 ||
            pg_cryptohash_update(ctx, reinterpret_cast<const uint8*>(VARDATA_ANY(group)),
                                 group_len) < 0 ||
            pg_cryptohash_final(ctx, digest, sizeof digest) < 0) {
            pg_cryptohash_free(ctx);
            ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
                            errmsg("could not compute the SHA-256 digest of a group_key")));
        }
        pg_cryptohash_free(ctx);
        *pos++ = '#';
        static const char kHex[] = "0123456789abcdef";
        for (const uint8 byte : digest) {
            *pos++ = kHex[byte >> 4];
            *pos++ = kHex[byte & 0xf];
        }
    }
    registry_make_key(kind, name, static_cast<size_t>(pos - name), "group", key);
}

bool group_lease_find(const text* queue, const text* group_key, int64 token, RegistryKey* key) {
    if (token == 0) {
        return false;  // no lease is held with token 0
    }
    for (int slot = 0; slot < kMaxGroupWorkers; slot++) {
        group_lease_key(queue, group_key, slot, key);
        if (lock_token_held(*key) == token) {
            return true;
        }
    }
    return false;
}

bool group_lease_renew(const text* queue, const text* group_key, int64 token, int64 lease_us) {
    RegistryKey key;
    return group_lease_find(queue, group_key, token, &key) &&
           lock_renew(key, token, lease_us) == RenewResult::kRenewed;
}

int64 group_lease_take(const RegistryKey& key, int64 lease_us, const Holder& holder) {
    group_lease_make_room();
    const int64 token = lock_take(key, lease_us, 0, holder);
    if (token != 0) {
        group_lease_taken_in_transaction(key, token);
    }
    return token;
}

namespace {

// The queue and group_key of arguments 0 and 1.
void group_arguments(FunctionCallInfo fcinfo, const text** queue, const text** group) {
    require_not_null(fcinfo, 0, "queue");
    require_not_null(fcinfo, 1, "group_key");
    *queue = PG_GETARG_TEXT_PP(0);
    *group = PG_GETARG_TEXT_PP(1);
}

// The key of the slot held with the token of argument 2; false when none is.
bool held_slot(FunctionCallInfo fcinfo, RegistryKey* key) {
    const text* queue = nullptr;
    const text* group = nullptr;
    group_arguments(fcinfo, &queue, &group);
    require_not_null(fcinfo, 2, "token");
    return group_lease_find(queue, group, PG_GETARG_INT64(2), key);
}

// (queue, group_key, worker, lease) -> the claim's fence token, or NULL.
// 0.2.0 has no SQL function for it (claim_group takes the lease natively);
// the symbol stays for 0.1.0's throttle._group_take, which that version's
// claim_group calls until ALTER EXTENSION pg_throttle UPDATE has run.
Datum group_take(FunctionCallInfo fcinfo) {
    registry_require();
    const text* queue = nullptr;
    const text* group = nullptr;
    group_arguments(fcinfo, &queue, &group);
    RegistryKey key;
    group_lease_key(queue, group, 0, &key);
    require_not_null(fcinfo, 3, "lease");
    const int64 lease = positive_interval(PG_GETARG_INTERVAL_P(3), "lease");
    const int64 token = group_lease_take(key, lease, holder_from_argument(fcinfo, 2));
    if (token == 0) {
        PG_RETURN_NULL();
    }
    PG_RETURN_INT64(token);
}

// (queue, group_key, token) -> released.
Datum group_release(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    PG_RETURN_BOOL(held_slot(fcinfo, &key) && lock_release(key, PG_GETARG_INT64(2)));
}

// (queue, group_key, token): the lease is released when this transaction
// commits.
Datum group_release_at_commit(FunctionCallInfo fcinfo) {
    registry_require();
    RegistryKey key;
    if (held_slot(fcinfo, &key)) {
        group_lease_release_at_commit(key, PG_GETARG_INT64(2));
    }
    PG_RETURN_VOID();
}

// (queue, group_key) -> whether a lease held the group (throttle.release_group):
// every slot.
Datum group_reset(FunctionCallInfo fcinfo) {
    registry_require();
    const text* queue = nullptr;
    const text* group = nullptr;
    group_arguments(fcinfo, &queue, &group);
    bool held = false;
    for (int slot = 0; slot < kMaxGroupWorkers; slot++) {
        RegistryKey key;
        group_lease_key(queue, group, slot, &key);
        held = lock_reset(key) || held;
    }
    PG_RETURN_BOOL(held);
}

// (queue, group_key, token, lease) -> renewed. 0.2.0 has no SQL function for
// it (extend renews natively); the symbol stays for 0.1.0's
// throttle._group_renew, which that version's extend calls until ALTER
// EXTENSION pg_throttle UPDATE has run.
Datum group_renew(FunctionCallInfo fcinfo) {
    registry_require();
    const text* queue = nullptr;
    const text* group = nullptr;
    group_arguments(fcinfo, &queue, &group);
    require_not_null(fcinfo, 2, "token");
    require_not_null(fcinfo, 3, "lease");
    const int64 lease = positive_interval(PG_GETARG_INTERVAL_P(3), "lease");
    PG_RETURN_BOOL(group_lease_renew(queue, group, PG_GETARG_INT64(2), lease));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_take, pg_throttle::pg::group_take)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_release, pg_throttle::pg::group_release)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_release_at_commit,
                         pg_throttle::pg::group_release_at_commit)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_reset, pg_throttle::pg::group_reset)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_group_renew, pg_throttle::pg::group_renew)
