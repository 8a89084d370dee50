// throttle._caller(): who is calling, for the queue's enqueued_by.
//
// The queue's functions are SECURITY DEFINER, so inside them current_user is
// the extension's owner. The caller is the role the session acts as (its
// login role, or the one SET ROLE chose), which security-definer calls do
// not change.
#include "pg/boundary.hpp"

namespace pg_throttle::pg {
namespace {

// () -> "<role>", or "<role> (<application_name>)" when the session has one.
Datum caller(FunctionCallInfo /*fcinfo*/) {
    const char* role = GetUserNameFromId(GetOuterUserId(), false);
    const char* application = application_name;
    if (application == nullptr || application[0] == '\0') {
        PG_RETURN_TEXT_P(cstring_to_text(role));
    }
    PG_RETURN_TEXT_P(cstring_to_text(psprintf("%s (%s)", role, application)));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_caller, pg_throttle::pg::caller)
