// The NOTICE of complete, fail and extend for the events the claim token
// given does not hold (claim_not_held.hpp).
#include "pg/queue/claim_not_held.hpp"

namespace pg_throttle::pg {

const char* const kClaimEndHint =
    "The claim's lease may have ended and another worker claimed the events since, or the token "
    "is not the claim_token that claim or claim_group returned. Only the role that made the "
    "claim, its members and superusers may end it.";
const char* const kClaimExtendHint =
    "A claim whose lease has ended is not extended: another worker may have claimed the events "
    "since. Or the token is not the claim_token that claim or claim_group returned. Only the "
    "role that made the claim, its members and superusers may extend it.";

namespace {

// How many distinct ids, NULLs left out, `array` (bigint[]) holds.
int64 distinct_ids(ArrayType* array) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int count = 0;
    deconstruct_array(array, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &elements,
                      &nulls, &count);
    int64* ids = static_cast<int64*>(palloc(sizeof(int64) * (count > 0 ? count : 1)));
    int n = 0;
    for (int i = 0; i < count; i++) {
        if (!nulls[i]) {
            ids[n++] = DatumGetInt64(elements[i]);
        }
    }
    std::sort(ids, ids + n);
    return std::unique(ids, ids + n) - ids;
}

}  // namespace

void notice_claim_not_held(const char* function, Datum ids, uint64 changed, const char* hint) {
    ArrayType* array = DatumGetArrayTypeP(ids);
    const int elements = ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
    if (changed >= static_cast<uint64>(elements)) {
        return;  // every event given (the common case)
    }
    const int64 given = distinct_ids(array);
    if (changed >= static_cast<uint64>(given)) {
        return;  // repeated ids, every one held
    }
    const auto missing = static_cast<long long>(given - static_cast<int64>(changed));
    if (given == 1) {
        ereport(
            NOTICE,
            (errmsg("the claim token does not hold the event given: %s left it as it is", function),
             errhint("%s", hint)));
    } else if (changed == 0) {
        ereport(NOTICE, (errmsg("the claim token holds none of the %lld events given: %s left "
                                "them as they are",
                                static_cast<long long>(given), function),
                         errhint("%s", hint)));
    } else {
        ereport(NOTICE,
                (errmsg_plural("the claim token does not hold %lld of the %lld events given: %s "
                               "left it as it is",
                               "the claim token does not hold %lld of the %lld events given: %s "
                               "left them as they are",
                               static_cast<unsigned long>(missing), missing,
                               static_cast<long long>(given), function),
                 errhint("%s", hint)));
    }
}

}  // namespace pg_throttle::pg
