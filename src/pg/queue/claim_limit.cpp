// The core's headers (through bucket.hpp) come before PostgreSQL's.
#include "pg/bucket.hpp"
#include "pg/catalog.hpp"
#include "pg/queue/claim_limit.hpp"

namespace pg_throttle::pg {

int64 claim_limit(const text* queue, int64 wanted, TimestampTz now) {
    text* name = nullptr;
    DeclaredBucket declared{};
    if (!queue_bucket(queue, &name, &declared)) {
        return wanted;
    }
    BucketRequest request{};
    bucket_request_from_declared(name, declared, 0, &request);
    return bucket_take_up_to(request, now, wanted);
}

ArrayType* first_ids(ArrayType* ids, int count) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int total = 0;
    deconstruct_array(ids, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE, &elements, &nulls,
                      &total);
    Assert(count > 0 && count <= total);
    return construct_array(elements, std::min(count, total), INT8OID, sizeof(int64), true,
                           TYPALIGN_DOUBLE);
}

}  // namespace pg_throttle::pg
