// throttle._claim_token(): the token of a claim of ungrouped events.
//
// A fence token (durability/fence.hpp): unique on the server and greater
// than every token handed out before, also after a crash or a promotion, so
// that a claim made after an earlier one expired never has its token.
// (A group claim's token is its group lease's, from the same counter.)
#include "pg/boundary.hpp"
#include "pg/durability/fence.hpp"

namespace pg_throttle::pg {
namespace {

// () -> a new token.
Datum claim_token(FunctionCallInfo /*fcinfo*/) {
    for (;;) {
        fence_reserve_ahead();
        const int64 token = fence_next();
        if (token != 0) {
            PG_RETURN_INT64(token);
        }
    }
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_claim_token, pg_throttle::pg::claim_token)
