#include "pg/scale_out/placement.hpp"

#include "pg/durability/fence.hpp"
#include "pg/server/kept_plan.hpp"
#include "pg/scale_out/arrivals.hpp"

#include "utils/syscache.h"

namespace pg_throttle::pg {
namespace {

// The anchor table throttle.distribute() creates and distributes: its shards
// are the shards of every key, and its rows name each shard's first placement.
constexpr const char* kSchema = "throttle";
constexpr const char* kAnchor = "key_shard";

// Citus's lock class for the metadata of a hash-distributed table's shard
// (ADV_LOCKTAG_CLASS_CITUS_COLOCATED_SHARDS_METADATA in its resource_lock.h):
// the lock is named by the colocation group and the shard's index among the
// table's shards, and a move takes it in ExclusiveLock on every node before
// it switches the placement.
constexpr uint16 kCitusColocatedShardsMetadataLockClass = 8;

// The key's shard, with what names its metadata lock: the shard's index in
// the table's shards sorted by their hash ranges, and the colocation group.
KeptPlan shard_query{
    "SELECT s.shardid,"
    " (SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_shard o, pg_catalog.pg_dist_shard m"
    "   WHERE m.shardid OPERATOR(pg_catalog.=) s.shardid"
    "     AND o.logicalrelid OPERATOR(pg_catalog.=) m.logicalrelid"
    "     AND o.shardminvalue::pg_catalog.int4 OPERATOR(pg_catalog.<)"
    "         m.shardminvalue::pg_catalog.int4),"
    " (SELECT p.colocationid::pg_catalog.int8 FROM pg_catalog.pg_dist_partition p"
    "   WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'throttle.key_shard'::pg_catalog.regclass)"
    " FROM (SELECT pg_catalog.get_shard_id_for_distribution_column("
    "   'throttle.key_shard'::pg_catalog.regclass, $1) AS shardid) s",
    1,
    {TEXTOID},
    nullptr};

struct KeyShard {
    int64 shard_id;
    int64 index;
    int64 colocation_id;
};

KeptPlan placement_query{
    "SELECT p.groupid::bigint FROM pg_catalog.pg_dist_placement p"
    " WHERE p.shardid OPERATOR(pg_catalog.=) $1 AND p.groupid OPERATOR(pg_catalog.=)"
    " (SELECT groupid FROM pg_catalog.pg_dist_local_group)",
    1,
    {INT8OID},
    nullptr};

// What the last placement_enter found, for the registry's calls that follow.
struct LastPlacement {
    Oid dbid;
    bool distributed;
    bool locked;  // this call holds the shard metadata lock (placement_pause)
    KeyShard shard;
    Oid relid;  // the shard's relation here when the call began
    uint8 name_len;
    char name[core::kMaxNameBytes];
    core::Micros moved_in_at;
};
LastPlacement last{InvalidOid, false, false, {}, InvalidOid, 0, {}, kNeverMoved};

// Whether this database has the anchor table, as this backend last found
// it: every key-taking call asks, and two catalog cache searches a call were
// a tenth of throttle.acquire's cost. A change to pg_class or pg_namespace
// (any relation or schema created, renamed or dropped, here or by another
// session, committed or rolled back) makes the next call look again; the
// invalidation reaches this backend when the catalog caches it would have
// searched learn of it. The look-up itself may take in an invalidation (its
// first catalog read locks pg_class): an answer is kept only when no
// invalidation came during the look-up that made it, else it looks again.
enum class Distributed : uint8 { kUnknown, kNo, kYes };
Distributed distributed = Distributed::kUnknown;
uint64 invalidations = 0;
bool invalidation_registered = false;

void forget_distributed(Datum /*arg*/, int /*cache_id*/, uint32 /*hash_value*/) {
    distributed = Distributed::kUnknown;
    ++invalidations;
}

bool database_distributed() {
    if (!invalidation_registered) {
        CacheRegisterSyscacheCallback(RELNAMENSP, forget_distributed, static_cast<Datum>(0));
        CacheRegisterSyscacheCallback(NAMESPACENAME, forget_distributed, static_cast<Datum>(0));
        invalidation_registered = true;
    }
    while (distributed == Distributed::kUnknown) {
        const uint64 before = invalidations;
        const Oid schema = get_namespace_oid(kSchema, true);
        const bool found = OidIsValid(schema) && OidIsValid(get_relname_relid(kAnchor, schema));
        if (invalidations == before) {
            distributed = found ? Distributed::kYes : Distributed::kNo;
        }
    }
    return distributed == Distributed::kYes;
}

// Column `column` of the row the last SPI query found, unless it found none
// or the value is NULL.
std::optional<Datum> only_value(int column = 1) {
    if (SPI_processed != 1) {
        return std::nullopt;
    }
    bool is_null = true;
    const Datum value =
        SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, column, &is_null);
    if (is_null) {
        return std::nullopt;
    }
    return value;
}

// Whether the anchor's shard on this node is the one throttle.distribute()
// made: the node (group) and the relation it recorded as the shard's first.
// A move makes a new relation, also when the shard comes back to a node it
// left. False for a shard with no row (made by a split).
bool first_placement(int64 shard_id, int64 group_id, Oid relid) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT first_group_id OPERATOR(pg_catalog.=) $2 AND first_relid "
             "OPERATOR(pg_catalog.=) $3 FROM %s.%s_" INT64_FORMAT
             " WHERE shard_id OPERATOR(pg_catalog.=) $1",
             kSchema, kAnchor, shard_id);
    Oid argtypes[3] = {INT8OID, INT8OID, OIDOID};
    Datum args[3] = {Int64GetDatum(shard_id), Int64GetDatum(group_id), ObjectIdGetDatum(relid)};
    if (SPI_execute_with_args(sql, 3, argtypes, args, nullptr, true, 1) != SPI_OK_SELECT) {
        elog(ERROR, "could not read the first placement of shard " INT64_FORMAT, shard_id);
    }
    const std::optional<Datum> first = only_value();
    return first.has_value() && DatumGetBool(*first);
}

// The OID of the anchor's shard relation on this node: a new one each time
// the shard arrives here.
Oid local_shard_relation(int64 shard_id) {
    char name[NAMEDATALEN];
    snprintf(name, sizeof name, "%s_" INT64_FORMAT, kAnchor, shard_id);
    const Oid relid = get_relname_relid(name, get_namespace_oid(kSchema, false));
    if (!OidIsValid(relid)) {
        elog(ERROR, "shard " INT64_FORMAT " of throttle.key_shard has no relation on this node",
             shard_id);
    }
    return relid;
}

// The shard of `name`, in the latest snapshot. Inside SPI_connect.
KeyShard key_shard_of(const char* name, size_t len) {
    text* key = cstring_to_text_with_len(name, static_cast<int>(len));
    Datum args[1] = {PointerGetDatum(key)};
    run_kept_plan_latest(&shard_query, args, nullptr, SPI_OK_SELECT, 1);
    const std::optional<Datum> shard_id = only_value(1);
    const std::optional<Datum> index = only_value(2);
    const std::optional<Datum> colocation_id = only_value(3);
    if (!shard_id.has_value() || !index.has_value() || !colocation_id.has_value()) {
        elog(ERROR, "Citus found no shard of throttle.key_shard for a key");
    }
    return KeyShard{DatumGetInt64(*shard_id), DatumGetInt64(*index), DatumGetInt64(*colocation_id)};
}

// The tag Citus names the shard's metadata lock with (SET_LOCKTAG_COLOCATED_
// SHARDS_METADATA_RESOURCE).
LOCKTAG shard_metadata_tag(const KeyShard& shard) {
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, static_cast<uint32>(shard.index),
                         static_cast<uint32>(shard.colocation_id),
                         kCitusColocatedShardsMetadataLockClass);
    return tag;
}

void lock_shard_metadata(const KeyShard& shard) {
    const LOCKTAG tag = shard_metadata_tag(shard);
    (void)LockAcquire(&tag, ShareLock, false, false);
}

void unlock_shard_metadata(const KeyShard& shard) {
    const LOCKTAG tag = shard_metadata_tag(shard);
    (void)LockRelease(&tag, ShareLock, false);
}

bool same_shard(const KeyShard& a, const KeyShard& b) {
    return a.shard_id == b.shard_id && a.index == b.index && a.colocation_id == b.colocation_id;
}

// Locks the metadata of the shard of `name` and returns it. A split that
// committed between the look-up and the lock changes the shard (or the index
// that names its lock): looked up again under the lock until it holds still.
// Inside SPI_connect.
KeyShard lock_key_shard(const char* name, size_t len) {
    KeyShard shard = key_shard_of(name, len);
    for (int attempt = 0;; attempt++) {
        lock_shard_metadata(shard);
        AcceptInvalidationMessages();  // Citus's cache of shards, as of the lock
        const KeyShard locked = key_shard_of(name, len);
        if (same_shard(locked, shard)) {
            return shard;
        }
        unlock_shard_metadata(shard);
        if (attempt == 3) {
            ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                            errmsg("the shards of throttle.key_shard kept changing"),
                            errhint("Retry the call.")));
        }
        shard = locked;
    }
}

// This node's group when it holds `shard_id`, read in the latest snapshot.
// Inside SPI_connect.
std::optional<int64> local_group_of(int64 shard_id) {
    Datum args[1] = {Int64GetDatum(shard_id)};
    run_kept_plan_latest(&placement_query, args, nullptr, SPI_OK_SELECT, 1);
    const std::optional<Datum> group_id = only_value();
    return group_id.has_value() ? std::optional<int64>(DatumGetInt64(*group_id)) : std::nullopt;
}

[[noreturn]] void raise_not_placed(const char* name, size_t len, int64 shard_id) {
    ereport(
        ERROR,
        (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
         errmsg("pg_throttle key \"%.*s\" is not placed on this node", static_cast<int>(len), name),
         errdetail("Its shard " INT64_FORMAT " of throttle.key_shard is on another node, "
                   "or has just moved.",
                   shard_id),
         errhint("Call the function on its own in a statement, outside a transaction "
                 "block, so that Citus runs it on the node that holds the key; retry a "
                 "call that raced a shard move.")));
    pg_unreachable();
}

}  // namespace

bool placement_kind_distributed(EntryKind kind) {
    return kind == EntryKind::kResource || kind == EntryKind::kBucket || kind == EntryKind::kLock;
}

void placement_enter(EntryKind kind, const char* name, size_t len) {
    last.dbid = InvalidOid;
    last.distributed = false;
    if (!placement_kind_distributed(kind) || !database_distributed()) {
        return;
    }
    if (len > core::kMaxNameBytes) {
        return;  // registry_make_key refuses it
    }
    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    // A move of this shard waits for this call's transaction, and once the
    // move holds the lock, this waits and then reads the new placement.
    const KeyShard shard = lock_key_shard(name, len);
    const int64 shard_id = shard.shard_id;
    const std::optional<int64> group_id = local_group_of(shard_id);
    if (!group_id.has_value()) {
        SPI_finish();
        raise_not_placed(name, len, shard_id);
    }
    const Oid relid = local_shard_relation(shard_id);
    std::optional<core::Micros> moved_in_at = arrival_of(shard_id, relid);
    if (!moved_in_at.has_value()) {
        const bool first = first_placement(shard_id, *group_id, relid);
        core::Micros arrived_at = kNeverMoved;
        if (!first) {
            // No moved lock name is granted here before arrived_at +
            // pg_throttle.max_lease (the move rule), so tokens start there:
            // above every token the old node handed out, which stays near
            // its clock (a crash skips at most a durable block, about a
            // second), with the nodes' clocks in step.
            arrived_at = GetCurrentTimestamp();
            fence_raise_to(core::saturating_add(arrived_at, registry_max_lease()));
            if (!RecoveryInProgress()) {
                fence_reserve_ahead();
            }
        }
        moved_in_at = arrival_note(shard_id, relid, arrived_at);
    }
    SPI_finish();
    last.dbid = MyDatabaseId;
    last.distributed = true;
    last.locked = true;
    last.shard = shard;
    last.relid = relid;
    last.name_len = static_cast<uint8>(len);
    memcpy(last.name, name, len);
    last.moved_in_at = *moved_in_at;
}

void placement_pause() {
    if (!placement_distributed() || !last.locked) {
        return;
    }
    unlock_shard_metadata(last.shard);
    last.locked = false;
}

void placement_resume() {
    if (!placement_distributed() || last.locked) {
        return;
    }
    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    // Looked up again as placement_enter does (a split during the sleep may
    // have renamed the shard's lock), with the invalidations of the sleep
    // accepted, so that the relation below is this node's relation now.
    const int64 shard_before = last.shard.shard_id;
    last.shard = lock_key_shard(last.name, last.name_len);
    last.locked = true;
    const bool here =
        last.shard.shard_id == shard_before && local_group_of(last.shard.shard_id).has_value();
    SPI_finish();
    // Split, moved away, or away and back: what this call waited for is gone.
    if (!here || local_shard_relation(last.shard.shard_id) != last.relid) {
        raise_not_placed(last.name, last.name_len, shard_before);
    }
}

bool placement_distributed() {
    return last.distributed && last.dbid == MyDatabaseId;
}

core::Micros placement_moved_in_at(const RegistryKey& key) {
    if (!last.distributed || key.dbid != last.dbid || key.name_len != last.name_len ||
        key.clock != static_cast<uint8>(EntryClock::kReal) ||
        !placement_kind_distributed(static_cast<EntryKind>(key.kind)) ||
        memcmp(key.name, last.name, key.name_len) != 0) {
        return kNeverMoved;
    }
    return last.moved_in_at;
}

}  // namespace pg_throttle::pg
