// The SQL entries of the durability layer.
//
// throttle.checkpoint(): writes the checkpoint of resources now
// (checkpoint.hpp), as the checkpointer worker does on its interval.
//
// throttle.advance_fence(past): after a dump restored into another cluster,
// the operator moves the fence counter past every token the old cluster
// handed out, so writers that stored tokens keep accepting the new ones.

// These bring in src/core: before any PostgreSQL header.
#include "pg/server/arguments.hpp"
#include "pg/registry/registry.hpp"

#include "pg/server/boundary.hpp"
#include "pg/durability/checkpoint.hpp"
#include "pg/durability/fence.hpp"

extern "C" {
#include "access/xlog.h"
#include "miscadmin.h"
}

namespace pg_throttle::pg {
namespace {

Datum checkpoint_sql(FunctionCallInfo /*fcinfo*/) {
    registry_require();
    if (RecoveryInProgress()) {
        ereport(ERROR, (errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
                        errmsg("cannot write a pg_throttle checkpoint during recovery")));
    }
    PG_RETURN_INT64(checkpoint_write(false));
}

Datum advance_fence_sql(FunctionCallInfo fcinfo) {
    registry_require();
    // Tokens are server-wide: one database's owner must not move every
    // database's counter. EXECUTE is revoked from PUBLIC too.
    if (!superuser()) {
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("only superusers may advance the fence counter")));
    }
    require_not_null(fcinfo, 0, "past");
    const int64 past = PG_GETARG_INT64(0);
    if (past < 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("past must not be negative: %lld", static_cast<long long>(past))));
    }
    if (past > kFenceAdvanceMax) {
        ereport(ERROR,
                (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
                 errmsg("past %lld is above the fence counter's limit %lld",
                        static_cast<long long>(past), static_cast<long long>(kFenceAdvanceMax)),
                 errdetail("Tokens must keep room to grow.")));
    }
    if (RecoveryInProgress()) {
        ereport(ERROR, (errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
                        errmsg("cannot advance the fence counter during recovery"),
                        errdetail("The fence counter is made durable in WAL, which a standby "
                                  "cannot write; a standby follows its primary's."),
                        errhint("Advance it on the primary.")));
    }
    PG_RETURN_INT64(fence_advance_past(past));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_advance_fence, pg_throttle::pg::advance_fence_sql)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_checkpoint, pg_throttle::pg::checkpoint_sql)
