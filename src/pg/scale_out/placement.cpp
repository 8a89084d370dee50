#include "pg/scale_out/placement.hpp"

#include "pg/durability/fence.hpp"
#include "pg/kept_plan.hpp"
#include "pg/scale_out/arrivals.hpp"

namespace pg_throttle::pg {
namespace {

// The anchor table throttle.distribute() creates and distributes: its shards
// are the shards of every key, and its rows name each shard's first placement.
constexpr const char* kSchema = "throttle";
constexpr const char* kAnchor = "key_shard";

// Citus's lock class for a shard's metadata (its resource_lock.h): a move
// takes it in ExclusiveLock on every node before it switches the placement.
constexpr uint16 kCitusShardMetadataLockClass = 4;

KeptPlan shard_query{
    "SELECT pg_catalog.get_shard_id_for_distribution_column('throttle.key_shard'::regclass, $1)",
    1,
    {TEXTOID},
    nullptr};

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
    uint8 name_len;
    char name[core::kMaxNameBytes];
    core::Micros moved_in_at;
};
LastPlacement last{InvalidOid, false, 0, {}, kNeverMoved};

bool database_distributed() {
    const Oid schema = get_namespace_oid(kSchema, true);
    return OidIsValid(schema) && OidIsValid(get_relname_relid(kAnchor, schema));
}

// The first column of the row the last SPI query found, unless it found
// none or the value is NULL.
std::optional<Datum> only_value() {
    if (SPI_processed != 1) {
        return std::nullopt;
    }
    bool is_null = true;
    const Datum value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null);
    if (is_null) {
        return std::nullopt;
    }
    return value;
}

// The one bigint `query` answers for `arg` (latest: in the latest snapshot).
int64 single_int8(KeptPlan* query, Datum arg, bool latest, bool* found) {
    Datum args[1] = {arg};
    if (latest) {
        run_kept_plan_latest(query, args, nullptr, SPI_OK_SELECT, 1);
    } else {
        run_kept_plan(query, args, nullptr, SPI_OK_SELECT, 1);
    }
    const std::optional<Datum> value = only_value();
    *found = value.has_value();
    return value.has_value() ? DatumGetInt64(*value) : 0;
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

void lock_shard_metadata(int64 shard_id) {
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId,
                         static_cast<uint32>(static_cast<uint64>(shard_id) >> 32),
                         static_cast<uint32>(shard_id), kCitusShardMetadataLockClass);
    (void)LockAcquire(&tag, ShareLock, false, false);
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
    text* key = cstring_to_text_with_len(name, static_cast<int>(len));
    bool found = false;
    const int64 shard_id = single_int8(&shard_query, PointerGetDatum(key), false, &found);
    if (!found) {
        elog(ERROR, "Citus found no shard of throttle.key_shard for a key");
    }
    // A move of this shard waits for this call's transaction, and once the
    // move holds the lock, this waits and then reads the new placement.
    lock_shard_metadata(shard_id);
    const int64 group_id = single_int8(&placement_query, Int64GetDatum(shard_id), true, &found);
    if (!found) {
        SPI_finish();
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                 errmsg("pg_throttle key \"%.*s\" is not placed on this node",
                        static_cast<int>(len), name),
                 errdetail("Its shard " INT64_FORMAT " of throttle.key_shard is on another node, "
                           "or has just moved.",
                           shard_id),
                 errhint("Call the function on its own in a statement, outside a transaction "
                         "block, so that Citus runs it on the node that holds the key; retry a "
                         "call that raced a shard move.")));
    }
    const Oid relid = local_shard_relation(shard_id);
    std::optional<core::Micros> moved_in_at = arrival_of(shard_id, relid);
    if (!moved_in_at.has_value()) {
        const bool first = first_placement(shard_id, group_id, relid);
        core::Micros arrived_at = kNeverMoved;
        if (!first) {
            // Fence tokens continue above every token the old node handed
            // out before the move (its counter stays below its clock).
            arrived_at = GetCurrentTimestamp();
            fence_raise_to(arrived_at);
            if (!RecoveryInProgress()) {
                fence_reserve_ahead();
            }
        }
        moved_in_at = arrival_note(shard_id, relid, arrived_at);
    }
    SPI_finish();
    last.dbid = MyDatabaseId;
    last.distributed = true;
    last.name_len = static_cast<uint8>(len);
    memcpy(last.name, name, len);
    last.moved_in_at = *moved_in_at;
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
