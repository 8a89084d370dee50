// The core's headers (through bucket.hpp) come before PostgreSQL's.
#include "pg/bucket.hpp"
#include "pg/catalog.hpp"
#include "pg/queue/claim_limit.hpp"
#include "pg/queue/group_lease.hpp"

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

namespace {

BucketRequest group_bucket_request(const GroupLimit& limit, const text* queue,
                                   const text* group_key) {
    RegistryKey key;
    queue_group_key(EntryKind::kQueueGroupBucket, queue, group_key, 0, &key);
    BucketRequest request{};
    queue_kind_bucket_request(key, limit.declared, 0, &request);
    return request;
}

}  // namespace

GroupLimit group_limit_of(const text* queue) {
    GroupLimit limit{};
    limit.limited = group_bucket(queue, &limit.declared);
    return limit;
}

int64 group_limit_available(const GroupLimit& limit, const text* queue, const text* group_key,
                            TimestampTz now, int64 wanted) {
    if (!limit.limited) {
        return wanted;
    }
    return std::min(
        wanted, bucket_reserve(group_bucket_request(limit, queue, group_key), now, 0).remaining);
}

int64 group_limit_take(const GroupLimit& limit, const text* queue, const text* group_key,
                       TimestampTz now, int64 wanted) {
    if (!limit.limited) {
        return wanted;
    }
    return bucket_take_up_to(group_bucket_request(limit, queue, group_key), now, wanted);
}

}  // namespace pg_throttle::pg
