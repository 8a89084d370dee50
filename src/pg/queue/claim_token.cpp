#include "pg/queue/claim_token.hpp"

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

}  // namespace pg_throttle::pg
