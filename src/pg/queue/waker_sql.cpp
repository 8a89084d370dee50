// throttle._waker_start(): called by the install and update scripts, so
// that a database which has just got wake-ups gets its waker once the
// transaction commits (wakeups.hpp).
#include "pg/queue/wakeups.hpp"
#include "pg/server/boundary.hpp"

namespace pg_throttle::pg {
namespace {

Datum waker_start(FunctionCallInfo /*fcinfo*/) {
    wakeups_want_here();
    PG_RETURN_VOID();
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_waker_start, pg_throttle::pg::waker_start)
