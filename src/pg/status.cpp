// throttle.registry_entries(): the rows behind the throttle.status view.
// Headers that bring in src/core come before any PostgreSQL header.
#include "pg/clock.hpp"
#include "pg/registry.hpp"

#include "pg/boundary.hpp"

namespace pg_throttle::pg {
namespace {

constexpr int kStatusColumns = 8;

struct StatusScan {
    ReturnSetInfo* rsinfo;
};

Datum timestamp_or_infinity(core::Micros value) {
    TimestampTz ts = value;
    if (!IS_VALID_TIMESTAMP(ts)) {
        TIMESTAMP_NOEND(ts);
    }
    return TimestampTzGetDatum(ts);
}

void emit_status_row(const RegistryEntry& entry, void* ctx) {
    auto* scan = static_cast<StatusScan*>(ctx);
    Datum values[kStatusColumns];
    bool nulls[kStatusColumns] = {};
    values[0] = CStringGetTextDatum(entry_kind_name(static_cast<EntryKind>(entry.key.kind)));
    values[1] = PointerGetDatum(cstring_to_text_with_len(entry.key.name, entry.key.name_len));
    values[2] = CStringGetTextDatum(entry.holder);
    values[3] = Int32GetDatum(entry.holder_pid);
    values[4] = timestamp_or_infinity(entry.granted_at);
    values[5] = timestamp_or_infinity(entry.expires_at);
    values[6] = Int64GetDatum(static_cast<int64>(__atomic_load_n(&entry.grants, __ATOMIC_RELAXED)));
    values[7] =
        Int64GetDatum(static_cast<int64>(__atomic_load_n(&entry.denials, __ATOMIC_RELAXED)));
    tuplestore_putvalues(scan->rsinfo->setResult, scan->rsinfo->setDesc, values, nulls);
}

Datum registry_entries(FunctionCallInfo fcinfo) {
    registry_require();
    InitMaterializedSRF(fcinfo, 0);
    StatusScan scan{reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo)};
    registry_scan(clock_now(), emit_status_row, &scan);
    return static_cast<Datum>(0);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_registry_entries, pg_throttle::pg::registry_entries)
