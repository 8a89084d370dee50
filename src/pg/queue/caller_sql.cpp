// Who is calling the queue: throttle._caller() for enqueued_by,
// throttle._caller_role() for the role a claim belongs to, and
// throttle._acts_as(role), whether the caller may act for a claim's role.
//
// The queue's functions are SECURITY DEFINER, so inside them current_user is
// the extension's owner. The caller is the role the session acts as (its
// login role, or the one SET ROLE chose), which security-definer calls do
// not change.
#include "pg/queue/caller.hpp"

#include "pg/server/boundary.hpp"

extern "C" {
#include "utils/acl.h"
}

namespace pg_throttle::pg {

text* caller_name() {
    const char* role = GetUserNameFromId(GetOuterUserId(), false);
    const char* application = application_name;
    if (application == nullptr || application[0] == '\0') {
        return cstring_to_text(role);
    }
    return cstring_to_text(psprintf("%s (%s)", role, application));
}

namespace {

// () -> caller_name().
Datum caller(FunctionCallInfo /*fcinfo*/) {
    PG_RETURN_TEXT_P(caller_name());
}

// () -> the oid of the role the session acts as.
Datum caller_role(FunctionCallInfo /*fcinfo*/) {
    PG_RETURN_OID(GetOuterUserId());
}

// (role oid) -> whether the caller has the privileges of `role` (is it, a
// member of it, or a superuser). NULL (a claim made before claims had
// roles), and a role that no longer exists, only superusers.
Datum acts_as(FunctionCallInfo fcinfo) {
    const Oid caller = GetOuterUserId();
    if (PG_ARGISNULL(0)) {
        PG_RETURN_BOOL(superuser_arg(caller));
    }
    PG_RETURN_BOOL(has_privs_of_role(caller, PG_GETARG_OID(0)));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_caller, pg_throttle::pg::caller)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_caller_role, pg_throttle::pg::caller_role)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_acts_as, pg_throttle::pg::acts_as)
