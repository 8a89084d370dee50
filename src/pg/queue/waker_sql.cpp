// throttle._waker_start(): called by the install and update scripts, so
// that a database which has just got wake-ups gets its waker once the
// transaction commits; throttle._wake_at(instant): the trigger of
// throttle.recurring tells the waker of a next firing (wakeups.hpp).
#include "pg/queue/wakeups.hpp"
#include "pg/server/boundary.hpp"

namespace pg_throttle::pg {
namespace {

Datum waker_start(FunctionCallInfo /*fcinfo*/) {
    wakeups_want_here();
    PG_RETURN_VOID();
}

// (instant) -> void: noted as a write of the transaction.
Datum wake_at(FunctionCallInfo fcinfo) {
    wakeup_note(PG_GETARG_TIMESTAMPTZ(0));
    PG_RETURN_VOID();
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_waker_start, pg_throttle::pg::waker_start)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_wake_at, pg_throttle::pg::wake_at)
