// throttle.reset(name, kind): an operator clears entries after an incident.
// Not granted to PUBLIC by the install script. Every kind throttle.status
// shows but a group's lease, which throttle.release_group ends.
#include "pg/server/arguments.hpp"
#include "pg/durability/checkpoint.hpp"
#include "pg/locks/locks.hpp"
#include "pg/queue/group_lease.hpp"
#include "pg/registry/registry.hpp"
#include "pg/scale_out/placement.hpp"

#include "pg/server/boundary.hpp"

namespace pg_throttle::pg {
namespace {

constexpr EntryKind kKinds[] = {EntryKind::kResource, EntryKind::kBucket, EntryKind::kLock,
                                EntryKind::kQueueBucket, EntryKind::kQueueGroupBucket};

// Reads at `*pos` a number as group_lease.cpp writes it ("%zu", "%d"):
// digits only, no leading zero, 1 to `max` (at most 63: no overflow).
bool read_count(const char** pos, int max, int* value) {
    const char* digit = *pos;
    if (*digit < '1' || *digit > '9') {
        return false;
    }
    int read = 0;
    for (; *digit >= '0' && *digit <= '9'; digit++) {
        read = read * 10 + (*digit - '0');
        if (read > max) {
            return false;
        }
    }
    *value = read;
    *pos = digit;
    return true;
}

// The queue and group_key of a group lease's name as throttle.status shows
// it, "<bytes of queue>[/<slot>]:<queue>:<group_key>" (group_lease.cpp),
// read exactly as it is built: a queue of 1 to kMaxQueueBytes bytes, a slot
// of 1 to kMaxGroupWorkers - 1 (slot 0 has none), a name of at most
// kMaxNameBytes. The group_key may be empty, as throttle.schedule takes it.
// False for any other name, among them those that carry a digest of their
// group_key. Both palloc'd.
bool group_of_lease_name(const char* name, char** queue, char** group) {
    if (std::strlen(name) > core::kMaxNameBytes) {
        return false;
    }
    const char* pos = name;
    int queue_len = 0;
    int slot = 0;
    if (!read_count(&pos, static_cast<int>(kMaxQueueBytes), &queue_len)) {
        return false;
    }
    if (*pos == '/') {
        pos++;
        if (!read_count(&pos, kMaxGroupWorkers - 1, &slot)) {
            return false;
        }
    }
    if (*pos != ':' || std::strlen(pos + 1) <= static_cast<size_t>(queue_len) ||
        pos[1 + queue_len] != ':') {
        return false;
    }
    *queue = pnstrdup(pos + 1, queue_len);
    *group = pstrdup(pos + 2 + queue_len);
    return true;
}

// A group's lease is refused: it stands for the claim on the group's
// events, whose claimed rows keep the group from other workers until their
// lease ends (the queue checks them before it hands a group out). Clearing
// it would free nothing and hide the claim from throttle.status;
// throttle.release_group ends the claim itself.
void refuse_group(const char* name) {
    char* queue = nullptr;
    char* group = nullptr;
    const char* call = "throttle.release_group(queue, group_key)";
    if (group_of_lease_name(name, &queue, &group)) {
        call = psprintf("throttle.release_group(%s, %s)", quote_literal_cstr(queue),
                        quote_literal_cstr(group));
    }
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
             errmsg("throttle.reset does not clear a group's lease"),
             errdetail("A group's lease stands for a claim on the group's events, whose rows keep "
                       "the group from other workers until their lease ends: clearing the lease "
                       "would free nothing."),
             errhint("Use %s, which ends the claim on the group and fences its worker.", call)));
}

Datum reset(FunctionCallInfo fcinfo) {
    registry_require();
    // Before the checkpoint's file lock: noticing a promotion takes every
    // partition lock and logs, and no other lock may be held then
    // (docs/design.md). registry_clear leaves it to its caller.
    registry_notice_promotion();
    require_not_null(fcinfo, 0, "name");
    const text* name = PG_GETARG_TEXT_PP(0);
    const char* only = PG_ARGISNULL(1) ? nullptr : text_to_cstring(PG_GETARG_TEXT_PP(1));
    if (only != nullptr && strcmp(only, entry_kind_name(EntryKind::kQueueGroup)) == 0) {
        RegistryKey key;  // the name is checked first, as for every kind
        registry_make_key(EntryKind::kQueueGroup, VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name),
                          entry_kind_name(EntryKind::kQueueGroup), &key);
        refuse_group(text_to_cstring(name));
    }
    // A resource or bucket may have an entry on each clock (EntryClock): an
    // operator clears the name, whatever clock made it.
    RegistryKey keys[2 * std::size(kKinds)];
    bool own_clock[std::size(keys)];  // the clock this session's entries of the kind have
    size_t key_count = 0;
    for (const EntryKind kind : kKinds) {
        if (only != nullptr && strcmp(only, entry_kind_name(kind)) != 0) {
            continue;
        }
        RegistryKey key;
        registry_make_key(kind, VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name), entry_kind_name(kind),
                          &key);
        if (!entry_kind_follows_clock(kind)) {
            own_clock[key_count] = true;
            keys[key_count++] = key;
            continue;
        }
        const uint8 session_clock = key.clock;
        for (const EntryClock clock : {EntryClock::kReal, EntryClock::kTest}) {
            key.clock = static_cast<uint8>(clock);
            own_clock[key_count] = key.clock == session_clock;
            keys[key_count++] = key;
        }
    }
    // On a Citus cluster the name's resource, bucket and lock live on the node
    // that holds its shard (scale_out/placement.hpp); a queue's buckets do not.
    if (key_count > 0 && placement_kind_distributed(static_cast<EntryKind>(keys[0].kind))) {
        placement_enter(static_cast<EntryKind>(keys[0].kind), VARDATA_ANY(name),
                        VARSIZE_ANY_EXHDR(name));
    }
    if (key_count == 0) {
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("unknown kind \"%s\"", only),
                 errhint("Use resource, bucket, queue_bucket, group_bucket or lock, or NULL for "
                         "all of them.")));
    }
    // Under a crash rule, a name is left known free rather than absent (an
    // absent name would be born again in the rule's state), on the session's
    // own clock also when it had no entry (registry_clear).
    int32 removed = 0;
    QuotaCheck no_room = QuotaCheck::kOk;  // the first refusal for want of room
    // A lock's grant is ended, not its entry removed: the earliest waiter
    // gets it, and the lease journal records the release.
    for (size_t i = 0; i < key_count; i++) {
        if (static_cast<EntryKind>(keys[i].kind) != EntryKind::kLock) {
            continue;
        }
        if (lock_reset(keys[i])) {
            removed++;
            continue;
        }
        QuotaCheck refused = QuotaCheck::kOk;
        if (registry_clear(keys[i], true, &refused) == ClearResult::kNoRoom &&
            no_room == QuotaCheck::kOk) {
            no_room = refused;
        }
    }
    // A checkpoint that still showed a removed resource would bring it back
    // after a crash, while a grant made after the reset was lost. Nothing
    // between begin and end raises, nor notices a promotion (registry_clear
    // leaves that to this function's start): one that ends meanwhile is
    // noticed by the next call, which forgets the standby's resources and
    // buckets, these among them, as if the reset had run just before it.
    checkpoint_begin_forget();
    for (size_t i = 0; i < key_count; i++) {
        if (static_cast<EntryKind>(keys[i].kind) == EntryKind::kLock) {
            continue;
        }
        QuotaCheck refused = QuotaCheck::kOk;
        const ClearResult result = registry_clear(keys[i], own_clock[i], &refused);
        if (result == ClearResult::kCleared) {
            removed++;
        } else if (result == ClearResult::kNoRoom && no_room == QuotaCheck::kOk) {
            no_room = refused;
        }
    }
    checkpoint_end_forget();
    if (no_room != QuotaCheck::kOk) {
        registry_raise_no_room(no_room);  // a name under a crash rule could not be left free
    }
    PG_RETURN_INT32(removed);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_reset, pg_throttle::pg::reset)
