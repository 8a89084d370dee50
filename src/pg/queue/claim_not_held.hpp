// What complete, fail and extend say when the claim token given does not
// hold every event given: a NOTICE, not an error (a claim lost to the end
// of its lease is a normal event for a worker), and the same return value,
// how many events the call changed.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// Raises a NOTICE when `changed`, the events of `ids` (bigint[]) that the
// call `function` ("throttle.complete") changed, are fewer than the
// distinct ids given: the token does not hold the others. `hint` says why
// that can be. Costs one look at the array's length when `changed` is not
// fewer than its elements (the call's common case). Outside SPI and every
// LWLock: the NOTICE goes to the client at once.
void notice_claim_not_held(const char* function, Datum ids, uint64 changed, const char* hint);

// The hints of complete and fail, and of extend.
extern const char* const kClaimEndHint;
extern const char* const kClaimExtendHint;

}  // namespace pg_throttle::pg
