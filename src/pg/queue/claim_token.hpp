// Claim tokens: fence tokens (durability/fence.hpp), unique on the server and
// greater than every token handed out before, also after a crash or a
// promotion, so that a claim made after an earlier one expired never has
// its token. (A group claim's token is its group lease's, from the same
// counter.)
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// A new claim token.
int64 new_claim_token();

}  // namespace pg_throttle::pg
