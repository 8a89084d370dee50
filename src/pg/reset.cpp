// throttle.reset(name, kind): an operator clears entries after an incident.
// Not granted to PUBLIC by the install script.
#include "pg/arguments.hpp"
#include "pg/registry.hpp"

#include "pg/boundary.hpp"

namespace pg_throttle::pg {
namespace {

constexpr EntryKind kKinds[] = {EntryKind::kResource, EntryKind::kBucket, EntryKind::kLock};

Datum reset(FunctionCallInfo fcinfo) {
    registry_require();
    require_not_null(fcinfo, 0, "name");
    const text* name = PG_GETARG_TEXT_PP(0);
    const char* only = PG_ARGISNULL(1) ? nullptr : text_to_cstring(PG_GETARG_TEXT_PP(1));
    bool kind_known = only == nullptr;
    int32 removed = 0;
    for (const EntryKind kind : kKinds) {
        if (only != nullptr && strcmp(only, entry_kind_name(kind)) != 0) {
            continue;
        }
        kind_known = true;
        RegistryKey key;
        registry_make_key(kind, VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name), entry_kind_name(kind),
                          &key);
        if (registry_remove(key)) {
            removed++;
        }
    }
    if (!kind_known) {
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("unknown kind \"%s\"", only),
                 errhint("Use resource, bucket or lock, or NULL for all of them.")));
    }
    PG_RETURN_INT32(removed);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_reset, pg_throttle::pg::reset)
