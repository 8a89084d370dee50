#include "pg/rate/bucket.hpp"

#include "pg/server/arguments.hpp"
#include "pg/server/catalog.hpp"
#include "pg/registry/holder.hpp"
#include "pg/scale_out/placement.hpp"

namespace pg_throttle::pg {
namespace {

// Checks the shape and cost and fills them in; the caller sets the key.
void fill_shape(int32 rate, const Interval* per, bool burst_is_null, int32 burst, int32 cost,
                BucketRequest* request) {
    if (rate <= 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("rate must be positive"),
                        errdetail("rate is %d.", rate)));
    }
    const core::Micros per_us = positive_interval(per, "per");
    if (burst_is_null) {
        burst = rate;
    }
    if (burst <= 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("burst must be positive"),
                        errdetail("burst is %d.", burst)));
    }
    if (cost < 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("cost must not be negative"), errdetail("cost is %d.", cost)));
    }
    if (cost > burst) {
        ereport(
            ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("cost must not exceed burst"),
             errdetail("cost is %d and burst is %d: the request could never pass.", cost, burst)));
    }
    const core::BucketShapeResult shape = core::make_bucket_shape(rate, per_us, burst);
    if (shape.error == core::BucketShapeError::kRateTooHigh) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("rate must not exceed one per microsecond"),
                        errdetail("rate is %d per %lld microseconds.", rate,
                                  static_cast<long long>(per_us))));
    }
    if (shape.error == core::BucketShapeError::kTooLarge) {
        ereport(ERROR, (errcode(ERRCODE_DATETIME_FIELD_OVERFLOW),
                        errmsg("burst times per / rate is out of range")));
    }
    request->shape = shape.shape;
    request->per = per_us;
    request->rate = rate;
    request->burst = burst;
    request->cost = cost;
}

void bucket_key(const text* key, BucketRequest* request) {
    registry_make_key(EntryKind::kBucket, VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), "bucket",
                      &request->key);
    placement_enter(EntryKind::kBucket, VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
}

struct ReserveCall {
    const BucketRequest* request;
    core::Micros now;
    core::Micros max_wait;
    core::GcraDecision decision;
};

// A bucket's state is its TAT, kept in expires_at; kLongExpired (a new
// entry) is a full bucket. A bucket born under the crash rule is empty at the
// restart (granted_at) for every caller's shape: a TAT past the range is
// clamped to kNever, on which nothing passes (core/gcra.hpp).
core::Micros tat_of(const ReserveCall& call, const RegistryEntry& entry) {
    if (!entry.born) {
        return entry.expires_at;
    }
    return std::max(entry.expires_at,
                    core::saturating_add(entry.granted_at, call.request->shape.tolerance));
}

core::GcraDecision decide(const ReserveCall& call, const RegistryEntry& entry) {
    return core::gcra_reserve(tat_of(call, entry), call.now, call.request->shape,
                              call.request->cost, call.max_wait);
}

void set_shape(RegistryEntry* entry, const BucketRequest& request) {
    entry->of.bucket.per = request.per;
    entry->of.bucket.rate = request.rate;
    entry->of.bucket.burst = request.burst;
}

// After a crash, a bucket nobody has used since the restart counts as emptied
// at the restart: full again one burst later.
void reserve_born(RegistryEntry* entry, core::Micros restart, void* ctx) {
    const auto* call = static_cast<const ReserveCall*>(ctx);
    entry->granted_at = restart;
    entry->expires_at = core::saturating_add(restart, call->request->shape.tolerance);
    set_shape(entry, *call->request);
    strlcpy(entry->holder, "[unknown: granted before a crash]", sizeof entry->holder);
}

bool reserve_decide_shared(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<ReserveCall*>(ctx);
    call->decision = decide(*call, *entry);
    if (call->request->cost == 0 || call->decision.out_of_range) {
        return true;  // a peek changes nothing and counts nothing; nor does an error
    }
    if (call->decision.allowed) {
        return false;  // the TAT must move: decide again under the exclusive lock
    }
    __atomic_fetch_add(&entry->denials, 1, __ATOMIC_RELAXED);
    return true;
}

void reserve_apply_exclusive(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<ReserveCall*>(ctx);
    call->decision = decide(*call, *entry);
    const BucketRequest& request = *call->request;
    if (request.cost == 0 || call->decision.out_of_range) {
        return;  // a peek (of a bucket just born under the crash rule), or an error
    }
    set_shape(entry, request);
    if (!call->decision.allowed) {
        __atomic_fetch_add(&entry->denials, 1, __ATOMIC_RELAXED);
        return;
    }
    entry->expires_at = call->decision.tat;
    // A grant replaces the born state; a reservation a waiter may still give
    // back (throttle.wait) does not: a bucket born empty at R stays so, and
    // keeps R in granted_at.
    if (call->max_wait == 0) {
        entry->born = false;
    }
    if (!entry->born) {
        entry->granted_at = call->now;
    }
    // A reservation a waiter sleeps for counts as granted now, and stays
    // counted if the wait is cancelled and gives its units back: counters
    // only grow (throttle.registry_metrics), and the count lands on the entry
    // that granted it, whatever happens to it during the sleep.
    __atomic_fetch_add(&entry->grants, 1, __ATOMIC_RELAXED);
    entry->holder_pid = MyProcPid;
    memcpy(entry->holder, caller_holder().text, sizeof entry->holder);
}

constexpr EntryOp kReserveOp{reserve_born, reserve_decide_shared, reserve_apply_exclusive};

// Takes as many units as there are, at most `want`, in one visit: what is
// there is read and taken under one exclusive lock, so a session that
// contends with others still gets what it read (a peek and a take apart
// could find the units gone, again and again).
struct TakeUpToCall {
    BucketRequest* request;  // cost is set to the units taken
    core::Micros now;
    int64 want;
    int64 taken;
    bool out_of_range;  // the units there are would move the TAT past the range
};

ReserveCall reserve_call_of(const TakeUpToCall& call) {
    return ReserveCall{call.request, call.now, 0, {}};
}

void take_up_to_born(RegistryEntry* entry, core::Micros restart, void* ctx) {
    ReserveCall reserve = reserve_call_of(*static_cast<TakeUpToCall*>(ctx));
    reserve_born(entry, restart, &reserve);
}

// Under the shared lock: an empty bucket is decided here (a peek, counted
// as nothing, as bucket_take_up_to's callers peeked before).
bool take_up_to_decide_shared(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<TakeUpToCall*>(ctx);
    call->request->cost = 0;
    const ReserveCall peek = reserve_call_of(*call);
    return decide(peek, *entry).remaining <= 0;
}

void take_up_to_apply_exclusive(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<TakeUpToCall*>(ctx);
    call->request->cost = 0;
    ReserveCall reserve = reserve_call_of(*call);
    const int64 units = std::min(call->want, decide(reserve, *entry).remaining);
    if (units <= 0) {
        return;
    }
    call->request->cost = static_cast<int32>(units);
    reserve_apply_exclusive(entry, &reserve);
    call->taken = reserve.decision.allowed ? units : 0;
    call->out_of_range = reserve.decision.out_of_range;
}

constexpr EntryOp kTakeUpToOp{take_up_to_born, take_up_to_decide_shared,
                              take_up_to_apply_exclusive};

struct GiveBackCall {
    const BucketRequest* request;
    core::Micros reserved;
};

void give_back_update(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<GiveBackCall*>(ctx);
    const auto restored = core::gcra_give_back(entry->expires_at, call->reserved,
                                               call->request->shape, call->request->cost);
    if (restored.has_value()) {
        entry->expires_at = *restored;  // the grant stays counted
    }
}

// A request the bucket would pass whose new TAT would be past the last
// microsecond (core::GcraDecision::out_of_range): neither a grant on a
// clamped TAT nor a denial of units the bucket may have, but 22008, as for
// a tolerance that does not fit at all.
[[noreturn]] void raise_out_of_range() {
    ereport(ERROR,
            (errcode(ERRCODE_DATETIME_FIELD_OVERFLOW),
             errmsg("burst times per / rate is out of range at this time"),
             errdetail("Passing the request would move the bucket's theoretical arrival time "
                       "past 294277-01-09 04:00:54.775807+00, the last microsecond "
                       "pg_throttle can count.")));
    pg_unreachable();
}

}  // namespace

void bucket_request_from_arguments(FunctionCallInfo fcinfo, BucketRequest* request) {
    require_not_null(fcinfo, 0, "key");
    require_not_null(fcinfo, 1, "rate");
    require_not_null(fcinfo, 2, "per");
    require_not_null(fcinfo, 4, "cost");
    fill_shape(PG_GETARG_INT32(1), PG_GETARG_INTERVAL_P(2), PG_ARGISNULL(3),
               PG_ARGISNULL(3) ? 0 : PG_GETARG_INT32(3), PG_GETARG_INT32(4), request);
    bucket_key(PG_GETARG_TEXT_PP(0), request);
}

void bucket_request_from_declaration(FunctionCallInfo fcinfo, int cost_arg,
                                     BucketRequest* request) {
    require_not_null(fcinfo, 0, "key");
    require_not_null(fcinfo, cost_arg, "cost");
    const text* key = PG_GETARG_TEXT_PP(0);
    bucket_key(key, request);  // checks the name before looking it up
    const DeclaredBucket declared = declared_bucket(key);
    fill_shape(declared.rate, &declared.per, declared.burst_is_null, declared.burst,
               PG_GETARG_INT32(cost_arg), request);
}

void bucket_request_for_key(const RegistryKey& key, const DeclaredBucket& declared, int32 cost,
                            BucketRequest* request) {
    request->key = key;
    fill_shape(declared.rate, &declared.per, declared.burst_is_null, declared.burst, cost, request);
}

void queue_bucket_request(const text* name, const DeclaredBucket& declared, int32 cost,
                          BucketRequest* request) {
    RegistryKey key;
    registry_make_key(EntryKind::kQueueBucket, VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name), "bucket",
                      &key);
    bucket_request_for_key(key, declared, cost, request);
}

int64 bucket_take_up_to(BucketRequest request, core::Micros now, int64 want) {
    TakeUpToCall call{&request, now, want, 0, false};
    registry_apply(request.key, kTakeUpToOp, &call, placement_moved_in_at(request.key));
    if (call.out_of_range) {
        raise_out_of_range();
    }
    return call.taken;
}

core::GcraDecision bucket_reserve(const BucketRequest& request, core::Micros now,
                                  core::Micros max_wait) {
    ReserveCall call{&request, now, max_wait, {}};
    registry_apply(request.key, kReserveOp, &call, placement_moved_in_at(request.key));
    if (call.decision.out_of_range) {
        raise_out_of_range();
    }
    return call.decision;
}

void bucket_give_back(const BucketRequest& request, core::Micros reserved) {
    GiveBackCall call{&request, reserved};
    registry_update_existing(request.key, give_back_update, &call,
                             placement_moved_in_at(request.key));
}

}  // namespace pg_throttle::pg
