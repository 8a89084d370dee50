#include "pg/registry/quota.hpp"

extern "C" {
#include "access/genam.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_db_role_setting.h"
#include "utils/array.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/rel.h"
}

#include <cstring>

namespace pg_throttle::pg {
namespace {

// The value `name` has in the pg_db_role_setting row of (db, role), if that
// row sets it to a valid percent; -1 otherwise.
int stored_percent(Relation settings, Oid db, Oid role, const char* name) {
    ScanKeyData keys[2];
    ScanKeyInit(&keys[0], Anum_pg_db_role_setting_setdatabase, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(db));
    ScanKeyInit(&keys[1], Anum_pg_db_role_setting_setrole, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(role));
    SysScanDesc scan =
        systable_beginscan(settings, DbRoleSettingDatidRolidIndexId, true, nullptr, 2, keys);
    int percent = -1;
    const size_t length = strlen(name);
    if (HeapTuple tuple = systable_getnext(scan); HeapTupleIsValid(tuple)) {
        bool isnull = false;
        const Datum config = heap_getattr(tuple, Anum_pg_db_role_setting_setconfig,
                                          RelationGetDescr(settings), &isnull);
        if (!isnull) {
            Datum* items = nullptr;
            bool* item_nulls = nullptr;
            int count = 0;
            deconstruct_array(DatumGetArrayTypeP(config), TEXTOID, -1, false, TYPALIGN_INT, &items,
                              &item_nulls, &count);
            for (int i = 0; i < count; i++) {
                if (item_nulls[i]) {
                    continue;
                }
                const char* item = TextDatumGetCString(items[i]);
                int value = 0;
                // Stored as "name=value"; names are case-insensitive.
                if (pg_strncasecmp(item, name, length) == 0 && item[length] == '=' &&
                    parse_int(item + length + 1, &value, 0, nullptr) && value >= 1 &&
                    value <= 100) {
                    percent = value;
                }
            }
        }
    }
    systable_endscan(scan);
    return percent;
}

}  // namespace

int quota_percent_for(Oid db, Oid role, bool role_quota) {
    const char* name = role_quota ? "pg_throttle.role_quota" : "pg_throttle.database_quota";
    // PostgreSQL's order (process_settings): the most specific first. With
    // no role, the first two are the last two again.
    const struct {
        Oid db;
        Oid role;
    } order[] = {{db, role}, {InvalidOid, role}, {db, InvalidOid}, {InvalidOid, InvalidOid}};
    Relation settings = table_open(DbRoleSettingRelationId, AccessShareLock);
    int percent = -1;
    for (const auto& at : order) {
        percent = stored_percent(settings, at.db, at.role, name);
        if (percent > 0) {
            break;
        }
    }
    table_close(settings, AccessShareLock);
    return percent > 0 ? percent : quota_server_percent(role_quota);
}

}  // namespace pg_throttle::pg
