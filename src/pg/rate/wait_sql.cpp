// throttle.wait: block until a bucket lets the request pass.
//
// The request is reserved at call time (the bucket's TAT moves at once, as
// Go's rate.Limiter.ReserveN does), so waiters of one key pass in the order
// they arrived; then the backend sleeps on its latch until the reserved time.
// A wait that is cancelled (statement_timeout, pg_cancel_backend) or ended
// (pg_terminate_backend, its client gone) gives its reservation back when no
// later waiter has queued behind it.
#include "pg/rate/bucket.hpp"
#include "pg/server/arguments.hpp"
#include "pg/server/waiting.hpp"
#include "pg/server/clock.hpp"
#include "pg/scale_out/placement.hpp"

#include "pg/server/boundary.hpp"

extern "C" {
#include "storage/ipc.h"
}

#include <algorithm>

namespace pg_throttle::pg {
namespace {

// Sleeps `wait_us` of real time. Whatever the extension's clock says (the
// test clock stands still), the wait itself is measured on the real clock.
// A client that leaves meanwhile ends the backend (raise_if_client_gone).
void sleep_for(core::Micros wait_us, uint32 event) {
    const TimestampTz deadline = core::saturating_add(GetCurrentTimestamp(), wait_us);
    for (;;) {
        CHECK_FOR_INTERRUPTS();
        raise_if_client_gone();
        const TimestampTz now = GetCurrentTimestamp();
        if (now >= deadline) {
            return;
        }
        // Rounded up, so the loop never wakes before the deadline more than once.
        const long timeout_ms = TimestampDifferenceMilliseconds(now, deadline);
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                        std::clamp(timeout_ms, 1L, kClientCheckMs), event);
        ResetLatch(MyLatch);
    }
}

struct Reservation {
    const BucketRequest* request;
    core::Micros tat;
};

// On an error (a cancel, statement_timeout) and on FATAL (pg_terminate_backend,
// a client gone), which ends the backend without unwinding to a PG_CATCH.
void give_back(int /*code*/, Datum arg) {
    const auto* reservation = reinterpret_cast<const Reservation*>(DatumGetPointer(arg));
    LWLockReleaseAll();
    bucket_give_back(*reservation->request, reservation->tat);
}

// Only trivially destructible objects live here: PG_TRY is a sigsetjmp. On a
// Citus cluster the sleep holds no move of the key's shard back, and a wait
// whose shard moved meanwhile does not pass (55000): its units were reserved
// on the old node, which the new one does not know of (it counts the bucket
// as emptied at the arrival). Waiting to take the shard's lock again is part
// of the sleep: a cancel there gives the reservation back too.
void sleep_or_give_back(const BucketRequest& request, core::Micros reserved_tat,
                        core::Micros wait_us, uint32 event) {
    const Reservation reservation{&request, reserved_tat};
    placement_pause();
    PG_ENSURE_ERROR_CLEANUP(give_back, PointerGetDatum(&reservation));
    {
        sleep_for(wait_us, event);
        placement_resume();
    }
    PG_END_ENSURE_ERROR_CLEANUP(give_back, PointerGetDatum(&reservation));
}

// Reserves `request` and sleeps until it passes; false at once, with nothing
// reserved, when that would take longer than `max_wait`. A peek (cost 0)
// reserves nothing: it sleeps until one unit is available and takes none.
bool wait_for(const BucketRequest& request, core::Micros max_wait) {
    // Before reserving: naming the wait event can raise an error.
    const uint32 event = wait_event_wait();
    const core::GcraDecision decision = bucket_reserve(request, clock_now(), max_wait);
    if (!decision.allowed) {
        return false;  // the wait would exceed the timeout: nothing reserved
    }
    if (decision.retry_after > 0) {
        sleep_or_give_back(request, decision.tat, decision.retry_after, event);
    }
    return true;
}

// throttle.wait(key, rate, per, burst, cost, timeout)
Datum wait(FunctionCallInfo fcinfo) {
    registry_require();
    BucketRequest request;
    bucket_request_from_arguments(fcinfo, &request);
    PG_RETURN_BOOL(wait_for(request, optional_wait(fcinfo, 5, "timeout")));
}

// throttle.wait(key, timeout, cost): the shape declared in throttle.bucket.
Datum wait_declared(FunctionCallInfo fcinfo) {
    registry_require();
    BucketRequest request;
    bucket_request_from_declaration(fcinfo, 2, &request);
    PG_RETURN_BOOL(wait_for(request, optional_wait(fcinfo, 1, "timeout")));
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_wait, pg_throttle::pg::wait)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_wait_declared, pg_throttle::pg::wait_declared)
