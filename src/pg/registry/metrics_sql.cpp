// throttle.registry_metrics(): server-wide totals of the registry per kind,
// the rows behind the throttle.registry_metrics view that an exporter
// scrapes (monitoring/). Every database and role is summed, so the function
// is for superusers and pg_read_all_stats (pg_monitor), as pg_stat_statements'
// other tenants' rows are: the install script revokes it from PUBLIC.
#include "pg/registry/registry.hpp"

#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"

namespace pg_throttle::pg {
namespace {

constexpr int kMetricsColumns = 7;

Datum registry_metrics_rows(FunctionCallInfo fcinfo) {
    registry_require();
    InitMaterializedSRF(fcinfo, 0);
    auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    RegistryKindMetrics kinds[kEntryKindCount];
    registry_metrics(kinds);
    for (int kind = 1; kind < kEntryKindCount; kind++) {
        const RegistryKindMetrics& totals = kinds[kind];
        Datum values[kMetricsColumns];
        bool nulls[kMetricsColumns] = {};
        values[0] = CStringGetTextDatum(entry_kind_name(static_cast<EntryKind>(kind)));
        values[1] = Int64GetDatum(totals.entries);
        values[2] = Int64GetDatum(totals.in_force);
        values[3] = Int64GetDatum(registry_capacity(static_cast<EntryKind>(kind)));
        values[4] = Int64GetDatum(static_cast<int64>(totals.grants));
        values[5] = Int64GetDatum(static_cast<int64>(totals.denials));
        values[6] = Int64GetDatum(totals.waiters);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    return static_cast<Datum>(0);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_registry_metrics, pg_throttle::pg::registry_metrics_rows)
