// throttle.now(): the extension's clock as SQL sees it (the test clock when
// set), used by the event queue so that its times follow the same clock.
#include "pg/server/clock.hpp"
#include "pg/registry/registry.hpp"

#include "pg/server/boundary.hpp"

namespace pg_throttle::pg {
namespace {

Datum now(FunctionCallInfo /*fcinfo*/) {
    registry_require();
    PG_RETURN_TIMESTAMPTZ(clock_now());
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_now, pg_throttle::pg::now)
