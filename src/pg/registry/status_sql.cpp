// throttle.registry_entries(): the rows behind the throttle.status and
// throttle.locks views. A lock's token is shown only to roles that could use
// it: the role holding the lock, its members and superusers.
// Headers that bring in src/core come before any PostgreSQL header.
#include "core/gcra.hpp"
#include "pg/server/clock.hpp"
#include "pg/registry/registry.hpp"

#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"

extern "C" {
#include "utils/acl.h"
}

namespace pg_throttle::pg {
namespace {

constexpr int kStatusColumns = 15;

struct StatusScan {
    ReturnSetInfo* rsinfo;
    core::Micros now;
    Oid viewer;
    // Whether the viewer may see the tokens of the last owner asked about.
    bool cached;
    Oid last_owner;
    bool last_owner_visible;
};

// Called outside the registry's locks (registry_scan): may look up catalogs.
bool token_visible(StatusScan* scan, Oid owner) {
    if (!scan->cached || owner != scan->last_owner) {
        scan->cached = true;
        scan->last_owner = owner;
        // The rule unlock and renew apply (locks.cpp): the owner, its
        // members, superusers; an owner not known, superusers only.
        scan->last_owner_visible = has_privs_of_role(scan->viewer, owner);
    }
    return scan->last_owner_visible;
}

Datum timestamp_or_infinity(core::Micros value) {
    TimestampTz ts = value;
    if (!IS_VALID_TIMESTAMP(ts)) {
        TIMESTAMP_NOEND(ts);
    }
    return TimestampTzGetDatum(ts);
}

// Bucket columns: the shape of the last call, and the units left now.
void fill_bucket_columns(const RegistryEntry& entry, core::Micros now, Datum* values, bool* nulls) {
    const core::BucketShapeResult shape =
        core::make_bucket_shape(entry.of.bucket.rate, entry.of.bucket.per, entry.of.bucket.burst);
    values[8] = Int32GetDatum(entry.of.bucket.rate);
    values[9] = interval_datum(entry.of.bucket.per);
    values[10] = Int32GetDatum(entry.of.bucket.burst);
    values[11] =
        Int32GetDatum(static_cast<int32>(core::gcra_remaining(entry.expires_at, now, shape.shape)));
    // One more unit passes when a request of 1 would.
    const core::GcraDecision one = core::gcra_decide(entry.expires_at, now, shape.shape, 1);
    values[5] = timestamp_or_infinity(one.allowed ? now : one.allowed_at);
    nulls[5] = false;
}

void emit_status_row(const RegistryEntry& entry, void* ctx) {
    auto* scan = static_cast<StatusScan*>(ctx);
    Datum values[kStatusColumns];
    bool nulls[kStatusColumns] = {};
    const auto kind = static_cast<EntryKind>(entry.key.kind);
    values[0] = CStringGetTextDatum(entry_kind_name(kind));
    values[1] = PointerGetDatum(cstring_to_text_with_len(entry.key.name, entry.key.name_len));
    values[2] = CStringGetTextDatum(entry.holder);
    values[3] = Int32GetDatum(entry.holder_pid);
    values[4] = timestamp_or_infinity(entry.granted_at);
    values[5] = timestamp_or_infinity(entry.expires_at);
    values[6] = Int64GetDatum(static_cast<int64>(__atomic_load_n(&entry.grants, __ATOMIC_RELAXED)));
    values[7] =
        Int64GetDatum(static_cast<int64>(__atomic_load_n(&entry.denials, __ATOMIC_RELAXED)));
    for (int i = 8; i < kStatusColumns; i++) {
        nulls[i] = true;
    }
    if (entry_kind_is_bucket(kind)) {
        for (int i = 8; i < 12; i++) {
            nulls[i] = false;
        }
        fill_bucket_columns(entry, scan->now, values, nulls);
    } else if (kind == EntryKind::kLock || kind == EntryKind::kQueueGroup) {
        values[12] = Int64GetDatum(entry.of.lock.token);
        nulls[12] = !token_visible(scan, entry.owner);
        values[13] = Int32GetDatum(entry.of.lock.waiters);
        nulls[13] = false;
    }
    values[14] = ObjectIdGetDatum(entry.owner);
    nulls[14] = !OidIsValid(entry.owner);
    tuplestore_putvalues(scan->rsinfo->setResult, scan->rsinfo->setDesc, values, nulls);
}

Datum registry_entries(FunctionCallInfo fcinfo) {
    registry_require();
    InitMaterializedSRF(fcinfo, 0);
    StatusScan scan{reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo),
                    clock_now(),
                    GetUserId(),
                    false,
                    InvalidOid,
                    false};
    registry_scan(scan.now, emit_status_row, &scan);
    return static_cast<Datum>(0);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_registry_entries, pg_throttle::pg::registry_entries)
