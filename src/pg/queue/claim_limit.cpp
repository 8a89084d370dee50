// The core's headers (through bucket.hpp) come before PostgreSQL's.
#include "pg/rate/bucket.hpp"
#include "pg/server/catalog.hpp"
#include "pg/queue/claim_limit.hpp"
#include "pg/queue/group_lease.hpp"

namespace pg_throttle::pg {
namespace {

// How many of `wanted` events the bucket of `request` has units for at
// `now`, without taking them.
int64 units_for(BucketRequest request, TimestampTz now, int64 wanted) {
    request.cost = 0;
    return std::min(wanted, bucket_reserve(request, now, 0).remaining);
}

BucketRequest group_bucket_request(const GroupLimit& limit, const text* queue,
                                   const text* group_key) {
    RegistryKey key;
    queue_group_key(EntryKind::kQueueGroupBucket, queue, group_key, 0, &key);
    BucketRequest request{};
    bucket_request_for_key(key, limit.declared, 0, &request);
    return request;
}

}  // namespace

ClaimLimit claim_limit_declared(const text* name, const DeclaredBucket* declared) {
    ClaimLimit limit{};
    limit.limited = declared != nullptr;
    if (limit.limited) {
        queue_bucket_request(name, *declared, 0, &limit.bucket);
    }
    return limit;
}

ClaimLimits claim_limits_of(const text* queue) {
    const QueueBuckets declared = queue_buckets(queue);
    ClaimLimits limits{};
    limits.queue = claim_limit_declared(declared.queue_bucket_name,
                                        declared.queue_limited ? &declared.queue_bucket : nullptr);
    limits.groups.limited = declared.groups_limited;
    limits.groups.declared = declared.group_bucket;
    return limits;
}

int64 claim_limit_available(const ClaimLimit& limit, TimestampTz now, int64 wanted) {
    return limit.limited ? units_for(limit.bucket, now, wanted) : wanted;
}

int64 claim_limit_take(const ClaimLimit& limit, TimestampTz now, int64 wanted) {
    return limit.limited ? bucket_take_up_to(limit.bucket, now, wanted) : wanted;
}

int64 group_limit_available(const GroupLimit& limit, const text* queue, const text* group_key,
                            TimestampTz now, int64 wanted) {
    return limit.limited ? units_for(group_bucket_request(limit, queue, group_key), now, wanted)
                         : wanted;
}

int64 group_limit_take(const GroupLimit& limit, const text* queue, const text* group_key,
                       TimestampTz now, int64 wanted) {
    return limit.limited
               ? bucket_take_up_to(group_bucket_request(limit, queue, group_key), now, wanted)
               : wanted;
}

}  // namespace pg_throttle::pg
