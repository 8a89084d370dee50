// Who is calling the queue (caller_sql.cpp): the role the session acts as, not
// the owner of the SECURITY DEFINER functions that run the queue.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// "<role>", or "<role> (<application_name>)" when the session has one: what
// enqueued_by and cancelled_by record.
text* caller_name();

}  // namespace pg_throttle::pg
