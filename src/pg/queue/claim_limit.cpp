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

}  // namespace pg_throttle::pg
