// Marks the events a claim has locked: when all of them are pending (the
// common case) with two statements of its own, kept plans; when some are
// expired claims, through throttle._mark_claimed, whose three statements
// also cancel expired claims that a newer run supersedes.
//
// The plans are generic and kept for the backend's life, so the statements
// test the state as upper(state): the planner then finds the rows by primary
// key, never through a partial index on state.
#include "pg/queue/mark_claimed.hpp"

#include "pg/server/kept_plan.hpp"

namespace pg_throttle::pg {
namespace {

// The order ($7, a ClaimOrder): by priority first (claim), by id (a strict
// group), else by run_at (claim_group).
// Due pending events only (no expired claim among them): claimed.
KeptPlan mark_pending_claimed{
    "WITH claimed AS ("
    "  UPDATE throttle.event"
    "  SET state = 'claimed', claimed_at = $5, claimed_by = $2, lease_until = $5 + $3,"
    "      claim_token = $4, claimed_role = $6, attempts = attempts + 1"
    "  WHERE id = ANY ($1) AND upper(state) = 'PENDING' AND attempts < max_attempts"
    "  RETURNING *)"
    " SELECT * FROM claimed"
    " ORDER BY CASE WHEN $7 = 1 THEN priority END DESC, CASE WHEN $7 = 2 THEN id END, run_at, id",
    7,
    {INT8ARRAYOID, TEXTOID, INTERVALOID, INT8OID, TIMESTAMPTZOID, OIDOID, INT4OID},
    nullptr};

// The rest of them, pending with their attempts used up: dead. No call
// leaves an event so any more (throttle._fence_claims makes it dead, a
// replacing schedule starts its attempts again); this is for events that
// an earlier version left so.
KeptPlan mark_pending_dead{
    "UPDATE throttle.event SET state = 'dead', completed_at = $2, completed_by = claimed_by,"
    "       last_error = coalesce(last_error, 'lease expired ' || attempts || ' times')"
    " WHERE id = ANY ($1) AND upper(state) = 'PENDING' AND attempts >= max_attempts",
    2,
    {INT8ARRAYOID, TIMESTAMPTZOID},
    nullptr};

// With expired claims among them: throttle._mark_claimed's rules.
KeptPlan mark_with_expired{
    "SELECT * FROM throttle._mark_claimed($1, $2, $3, $4, $5, coalesce($7, '{}'))"
    " ORDER BY CASE WHEN $6 = 1 THEN priority END DESC, CASE WHEN $6 = 2 THEN id END, run_at, id",
    7,
    {INT8ARRAYOID, TEXTOID, INTERVALOID, INT8OID, TIMESTAMPTZOID, INT4OID, INT8ARRAYOID},
    nullptr};

}  // namespace

uint64 mark_claimed(const ClaimRequest& request, const SPITupleTable** rows) {
    const Datum order = Int32GetDatum(static_cast<int32>(request.order));
    const Datum ids = PointerGetDatum(request.ids);
    const Datum now = TimestampTzGetDatum(request.now);
    if (request.any_expired) {
        Datum args[7] = {ids,
                         request.worker,
                         request.lease,
                         Int64GetDatum(request.token),
                         now,
                         order,
                         PointerGetDatum(request.uncharged)};
        const char nulls[7] = {
            ' ', ' ', ' ', ' ', ' ', ' ', request.uncharged == nullptr ? 'n' : ' '};
        run_kept_plan(&mark_with_expired, args, nulls, SPI_OK_SELECT);
        *rows = SPI_tuptable;
        return SPI_processed;
    }
    Datum args[7] = {ids,           request.worker,
                     request.lease, Int64GetDatum(request.token),
                     now,           ObjectIdGetDatum(GetOuterUserId()),
                     order};
    run_kept_plan(&mark_pending_claimed, args, nullptr, SPI_OK_SELECT);
    *rows = SPI_tuptable;  // kept until SPI_finish
    const uint64 claimed = SPI_processed;
    const int nids = ArrayGetNItems(ARR_NDIM(request.ids), ARR_DIMS(request.ids));
    if (claimed < static_cast<uint64>(nids)) {
        Datum dead_args[2] = {ids, now};
        run_kept_plan(&mark_pending_dead, dead_args, nullptr, SPI_OK_UPDATE);
    }
    return claimed;
}

}  // namespace pg_throttle::pg
