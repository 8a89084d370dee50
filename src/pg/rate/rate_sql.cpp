// throttle.take and throttle.allow: GCRA token buckets, decided at once.
// A denial is decided under the partition's shared lock; only a request
// that passes writes (it moves the bucket's TAT).
#include "pg/rate/bucket.hpp"
#include "pg/server/clock.hpp"

#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"

namespace pg_throttle::pg {
namespace {

constexpr int kTakeColumns = 4;

// The blessed result descriptor of take's OUT parameters, built once per
// function and backend: a call site's fn_extra lives only as long as its
// executor state, which a prepared statement builds anew on every execution,
// and get_call_result_type rebuilds the descriptor from pg_proc each time
// (two thirds of a take's cost). Kept by the function's oid (the two takes,
// and those of an extension dropped and created again, build their own).
struct BuiltDesc {
    Oid function;
    TupleDesc desc;
};
constexpr int kBuiltDescs = 4;
BuiltDesc built_descs[kBuiltDescs] = {};
int next_built_desc = 0;

TupleDesc take_result_desc(FunctionCallInfo fcinfo) {
    const Oid function = fcinfo->flinfo->fn_oid;
    for (const BuiltDesc& built : built_descs) {
        if (built.desc != nullptr && built.function == function) {
            return built.desc;
        }
    }
    TupleDesc desc = nullptr;
    if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE) {
        elog(ERROR, "throttle.take must return a composite type");
    }
    const MemoryContext previous = MemoryContextSwitchTo(TopMemoryContext);
    TupleDesc copy = BlessTupleDesc(CreateTupleDescCopy(desc));
    MemoryContextSwitchTo(previous);
    BuiltDesc& slot = built_descs[next_built_desc];
    next_built_desc = (next_built_desc + 1) % kBuiltDescs;
    if (slot.desc != nullptr) {
        FreeTupleDesc(slot.desc);
    }
    slot = BuiltDesc{function, copy};
    return copy;
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
