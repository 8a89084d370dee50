// The C++ / PostgreSQL boundary (docs/design.md, "The boundary"; make boundary-check).
//
// Every SQL-callable function is an extern "C" wrapper around an
// implementation run by call_guarded(): a C++ exception never crosses into
// PostgreSQL. It is turned into an ERROR after its catch block has closed.
//
// Implementations may ereport(); they keep only trivially destructible
// objects alive in frames where they do, so the longjmp skips no destructor.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

using SqlImpl = Datum (*)(FunctionCallInfo);

Datum call_guarded(FunctionCallInfo fcinfo, SqlImpl impl);

}  // namespace pg_throttle::pg

// Declares the extern "C" entry point `name` that runs `impl` behind the guard.
#define PG_THROTTLE_SQL_FUNCTION(name, impl)                \
    extern "C" {                                            \
    PG_FUNCTION_INFO_V1(name);                              \
    Datum name(PG_FUNCTION_ARGS) {                          \
        return pg_throttle::pg::call_guarded(fcinfo, impl); \
    }                                                       \
    }
