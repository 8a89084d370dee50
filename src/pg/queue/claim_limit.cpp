// The core's headers (through bucket.hpp) come before PostgreSQL's.
#include "pg/bucket.hpp"
#include "pg/catalog.hpp"
#include "pg/queue/claim_limit.hpp"

namespace pg_throttle::pg {

ClaimLimit claim_limit_of(const text* queue) {
    ClaimLimit limit{};
    text* name = nullptr;
    DeclaredBucket declared{};
    limit.limited = queue_bucket(queue, &name, &declared);
    if (limit.limited) {
        queue_bucket_request(name, declared, 0, &limit.bucket);
    }
    return limit;
}

int64 claim_limit_available(const ClaimLimit& limit, TimestampTz now, int64 wanted) {
    if (!limit.limited) {
        return wanted;
    }
    BucketRequest peek = limit.bucket;
    peek.cost = 0;
    return std::min(wanted, bucket_reserve(peek, now, 0).remaining);
}

int64 claim_limit_take(const ClaimLimit& limit, TimestampTz now, int64 wanted) {
    return limit.limited ? bucket_take_up_to(limit.bucket, now, wanted) : wanted;
}

ArrayType* ids_after(ArrayType* ids, int from, int to) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int total = 0;
    deconstruct_array(ids, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &elements,
                      &nulls, &total);
    to = std::min(to, total);
    from = std::min(std::max(from, 0), to);
    return construct_array(elements + from, to - from, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
                           TYPALIGN_DOUBLE);
}

ArrayType* first_ids(ArrayType* ids, int count) {
    return ids_after(ids, 0, count);
}

}  // namespace pg_throttle::pg
