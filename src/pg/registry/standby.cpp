#include "pg/registry/standby.hpp"

extern "C" {
#include "access/xlog.h"
#include "utils/guc.h"
}

namespace pg_throttle::pg {
namespace {

bool standby_local = false;

}  // namespace

void standby_define_guc() {
    DefineCustomBoolVariable(
        "pg_throttle.standby_local",
        "Lets acquire, take, allow and wait decide on a hot standby from its own registry.",
        "Off, they refuse on a standby (25006): its registry is not shared with the primary, "
        "which may grant the same resource or units in the same interval.",
        &standby_local, false, PGC_SUSET, 0, nullptr, nullptr, nullptr);
}

void standby_check_local_decision(EntryKind kind) {
    if ((kind != EntryKind::kResource && kind != EntryKind::kBucket) || standby_local ||
        !RecoveryInProgress()) {
        return;
    }
    ereport(
        ERROR,
        (errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
         errmsg("cannot decide a pg_throttle %s on a standby", entry_kind_name(kind)),
         errdetail("A standby's registry is its own: the primary never sees what it grants."),
         errhint(
             "Call it on the primary, or have a superuser SET pg_throttle.standby_local = on for a "
             "decision that only this standby shares.")));
}

void standby_refuse(const char* function) {
    if (!RecoveryInProgress()) {
        return;
    }
    ereport(ERROR, (errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
                    errmsg("%s cannot run on a standby", function),
                    errdetail("The event queue is written on the primary."),
                    errhint("Connect to the primary.")));
}

}  // namespace pg_throttle::pg
