#include "pg/server/boundary.hpp"

namespace pg_throttle::pg {

Datum call_guarded(FunctionCallInfo fcinfo, SqlImpl impl) {
    char message[256];
    try {
        return impl(fcinfo);
    } catch (const std::exception& e) {
        strlcpy(message, e.what(), sizeof message);
    } catch (...) {
        strlcpy(message, "unknown C++ exception", sizeof message);
    }
    // Raised only now that the catch block is closed: the exception object is
    // gone before longjmp leaves this frame.
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("pg_throttle: %s", message)));
    pg_unreachable();
}

}  // namespace pg_throttle::pg
