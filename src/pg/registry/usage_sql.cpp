// throttle.registry_usage(): the rows behind the throttle.usage view: how
// many registry entries each role and each database holds, and its quota.
// Like pg_stat_activity, other tenants' rows are for superusers and members
// of pg_read_all_stats: others see the current database and the roles whose
// privileges they have.
#include "pg/registry/registry.hpp"
#include "pg/registry/quota.hpp"

#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"

extern "C" {
#include "catalog/pg_authid.h"
#include "utils/acl.h"
}

#include <limits>

namespace pg_throttle::pg {
namespace {

constexpr int kUsageColumns = 4;

Datum registry_usage(FunctionCallInfo fcinfo) {
    registry_require();
    InitMaterializedSRF(fcinfo, 0);
    auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    // Copied under the quota lock into memory allocated before it is taken.
    int64 capacity = 64;
    QuotaUsage* rows = nullptr;
    int64 count = 0;
    for (;;) {
        rows = static_cast<QuotaUsage*>(
            palloc_extended(capacity * sizeof(QuotaUsage), MCXT_ALLOC_HUGE));
        count = quota_usage(rows, capacity);
        if (count <= capacity) {
            break;
        }
        pfree(rows);
        capacity = count + count / 4 + 64;
    }
    const Oid viewer = GetUserId();
    const bool sees_all = has_privs_of_role(viewer, ROLE_PG_READ_ALL_STATS);
    for (int64 i = 0; i < count; i++) {
        Datum values[kUsageColumns];
        bool nulls[kUsageColumns] = {};
        const QuotaUsage& row = rows[i];
        if (!sees_all &&
            (row.is_role ? !has_privs_of_role(viewer, row.owner) : row.owner != MyDatabaseId)) {
            continue;
        }
        if (row.is_role) {
            const char* role = GetUserNameFromId(row.owner, true);
            values[1] = role != nullptr ? CStringGetTextDatum(role) : (nulls[1] = true, 0);
        } else {
            const char* database = get_database_name(row.owner);
            values[1] = database != nullptr ? CStringGetTextDatum(database) : (nulls[1] = true, 0);
        }
        values[0] = CStringGetTextDatum(row.is_role ? "role" : "database");
        values[2] = Int64GetDatum(row.entries);
        // The quota that applies to the row's role (its sessions in this
        // database) or database, by the stored settings, not the viewer's.
        const int64 limit =
            quota_limit_of(row.is_role ? quota_percent_for(MyDatabaseId, row.owner, true)
                                       : quota_percent_for(row.owner, InvalidOid, false));
        values[3] = Int64GetDatum(limit);
        nulls[3] = limit == std::numeric_limits<int64>::max();  // 100%: no quota
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    pfree(rows);
    return static_cast<Datum>(0);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_registry_usage, pg_throttle::pg::registry_usage)
