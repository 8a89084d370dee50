// throttle.reset(name, kind): an operator clears entries after an incident.
// Not granted to PUBLIC by the install script.
#include "pg/arguments.hpp"
#include "pg/durability/checkpoint.hpp"
#include "pg/locks/locks.hpp"
#include "pg/registry.hpp"
#include "pg/scale_out/placement.hpp"

#include "pg/boundary.hpp"

namespace pg_throttle::pg {
namespace {

constexpr EntryKind kKinds[] = {EntryKind::kResource, EntryKind::kBucket, EntryKind::kLock,
                                EntryKind::kQueueBucket, EntryKind::kQueueGroupBucket};

bool made_no_room(ClearResult result) {
    return result == ClearResult::kFull || result == ClearResult::kRoleQuota ||
           result == ClearResult::kDatabaseQuota;
}

// The clock (EntryClock) of the entries this session makes for `name`.
uint8 own_clock_of(const text* name) {
    RegistryKey key;
    registry_make_key(EntryKind::kResource, VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name), "name",
                      &key);
    return key.clock;
}

Datum reset(FunctionCallInfo fcinfo) {
    registry_require();
    require_not_null(fcinfo, 0, "name");
    const text* name = PG_GETARG_TEXT_PP(0);
    const char* only = PG_ARGISNULL(1) ? nullptr : text_to_cstring(PG_GETARG_TEXT_PP(1));
    // A resource or bucket may have an entry on each clock (EntryClock): an
    // operator clears the name, whatever clock made it.
    RegistryKey keys[2 * std::size(kKinds)];
    size_t key_count = 0;
    for (const EntryKind kind : kKinds) {
        if (only != nullptr && strcmp(only, entry_kind_name(kind)) != 0) {
            continue;
        }
        RegistryKey key;
        registry_make_key(kind, VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name), entry_kind_name(kind),
                          &key);
        if (!entry_kind_follows_clock(kind)) {
            keys[key_count++] = key;
            continue;
        }
        for (const EntryClock clock : {EntryClock::kReal, EntryClock::kTest}) {
            key.clock = static_cast<uint8>(clock);
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
    const uint8 own_clock = own_clock_of(name);
    int32 removed = 0;
    ClearResult no_room = ClearResult::kAbsent;  // the first that made no room
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
        const ClearResult result = registry_clear(keys[i], true);
        if (no_room == ClearResult::kAbsent && made_no_room(result)) {
            no_room = result;
        }
    }
    // A checkpoint that still showed a removed resource would bring it back
    // after a crash, while a grant made after the reset was lost. Nothing
    // between begin and end raises.
    checkpoint_begin_forget();
    for (size_t i = 0; i < key_count; i++) {
        if (static_cast<EntryKind>(keys[i].kind) == EntryKind::kLock) {
            continue;
        }
        const ClearResult result = registry_clear(keys[i], keys[i].clock == own_clock);
        if (result == ClearResult::kCleared) {
            removed++;
        } else if (no_room == ClearResult::kAbsent && made_no_room(result)) {
            no_room = result;
        }
    }
    checkpoint_end_forget();
    if (no_room != ClearResult::kAbsent) {
        registry_raise_no_room(no_room);  // a name under a crash rule could not be left free
    }
    PG_RETURN_INT32(removed);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_reset, pg_throttle::pg::reset)
