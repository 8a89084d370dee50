// The lease that holds a group of the event queue: taken by claim_group
// (claim_group_sql.cpp), renewed by extend (extend_sql.cpp), and ended by
// throttle._group_release, _group_release_at_commit and _group_reset
// (group_lease_sql.cpp).
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

#include "pg/server/arguments.hpp"

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

}  // namespace pg_throttle::pg
