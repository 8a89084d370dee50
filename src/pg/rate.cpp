// throttle.take and throttle.allow: GCRA token buckets, decided at once.
// A denial is decided under the partition's shared lock; only a request
// that passes writes (it moves the bucket's TAT).
#include "pg/bucket.hpp"
#include "pg/clock.hpp"

#include "pg/arguments.hpp"
#include "pg/boundary.hpp"

namespace pg_throttle::pg {
namespace {

constexpr int kTakeColumns = 4;

// The blessed result descriptor, built once per call site (fn_extra).
TupleDesc take_result_desc(FunctionCallInfo fcinfo) {
    if (fcinfo->flinfo->fn_extra == nullptr) {
        TupleDesc desc = nullptr;
        if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE) {
            elog(ERROR, "throttle.take must return a composite type");
        }
        const MemoryContext previous = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
        fcinfo->flinfo->fn_extra = BlessTupleDesc(CreateTupleDescCopy(desc));
        MemoryContextSwitchTo(previous);
    }
    return static_cast<TupleDesc>(fcinfo->flinfo->fn_extra);
}

Datum take_result(FunctionCallInfo fcinfo, const core::GcraDecision& decision) {
    TupleDesc desc = take_result_desc(fcinfo);
    Datum values[kTakeColumns];
    bool nulls[kTakeColumns] = {};
    values[0] = BoolGetDatum(decision.allowed);
    values[1] = Int32GetDatum(static_cast<int32>(decision.remaining));
    values[2] = interval_datum(decision.retry_after);
    values[3] = interval_datum(decision.reset_after);
    return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

core::GcraDecision decide_now(const BucketRequest& request) {
    return bucket_reserve(request, clock_now(), 0);
}

Datum take(FunctionCallInfo fcinfo) {
    registry_require();
    BucketRequest request;
    bucket_request_from_arguments(fcinfo, &request);
    return take_result(fcinfo, decide_now(request));
}

Datum take_declared(FunctionCallInfo fcinfo) {
    registry_require();
    BucketRequest request;
    bucket_request_from_declaration(fcinfo, 1, &request);
    return take_result(fcinfo, decide_now(request));
}

Datum allow(FunctionCallInfo fcinfo) {
    registry_require();
    BucketRequest request;
    bucket_request_from_arguments(fcinfo, &request);
    PG_RETURN_BOOL(decide_now(request).allowed);
}

Datum allow_declared(FunctionCallInfo fcinfo) {
    registry_require();
    BucketRequest request;
    bucket_request_from_declaration(fcinfo, 1, &request);
    PG_RETURN_BOOL(decide_now(request).allowed);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_take, pg_throttle::pg::take)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_take_declared, pg_throttle::pg::take_declared)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_allow, pg_throttle::pg::allow)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_allow_declared, pg_throttle::pg::allow_declared)
