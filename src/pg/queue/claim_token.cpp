// throttle._claim_token(), for the queue's SQL functions.
#include "pg/queue/claim_token.hpp"

#include "pg/boundary.hpp"
#include "pg/durability/fence.hpp"

namespace pg_throttle::pg {

int64 new_claim_token() {
    for (;;) {
        fence_reserve_ahead();
        const int64 token = fence_next();
        if (token != 0) {
            return token;
        }
    }
}

namespace {

// () -> a new token.
Datum claim_token(FunctionCallInfo /*fcinfo*/) {
    PG_RETURN_INT64(new_claim_token());
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_claim_token, pg_throttle::pg::claim_token)
