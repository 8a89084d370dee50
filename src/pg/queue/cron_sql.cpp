// throttle.cron_next and throttle.cron_firings: when a cron expression fires
// in a time zone (docs/recurring.md), computed by the core (core/cron.hpp)
// against PostgreSQL's tzdata (server/zone.hpp).
#include "core/cron.hpp"
#include "pg/server/arguments.hpp"
#include "pg/server/cron_text.hpp"
#include "pg/server/zone.hpp"

#include "pg/server/boundary.hpp"

namespace pg_throttle::pg {
namespace {

// At most this many rows from one cron_firings call.
constexpr int32 kMaxFirings = 100'000;

// The instant after which firings are wanted: finite (22008 otherwise).
TimestampTz finite_after(FunctionCallInfo fcinfo, int n) {
    require_not_null(fcinfo, n, "after");
    const TimestampTz after = PG_GETARG_TIMESTAMPTZ(n);
    if (TIMESTAMP_NOT_FINITE(after)) {
        ereport(ERROR, (errcode(ERRCODE_DATETIME_FIELD_OVERFLOW),
                        errmsg("after must be a finite timestamp")));
    }
    return after;
}

// The next firing, or false when none comes before PostgreSQL's timestamps end.
bool next_in_range(const core::CronSpec& spec, TimestampTz after, const PgZone& zone,
                   TimestampTz* out) {
    const auto next = core::next_firing(spec, after, zone);
    if (!next.has_value() || !IS_VALID_TIMESTAMP(*next)) {
        return false;
    }
    *out = *next;
    return true;
}

Datum cron_next(FunctionCallInfo fcinfo) {
    require_not_null(fcinfo, 0, "cron");
    require_not_null(fcinfo, 1, "time_zone");
    const core::CronSpec spec = cron_spec_from_text(PG_GETARG_TEXT_PP(0));
    const PgZone zone(zone_by_name(PG_GETARG_TEXT_PP(1)));
    const TimestampTz after = finite_after(fcinfo, 2);
    TimestampTz next = 0;
    if (!next_in_range(spec, after, zone, &next)) {
        PG_RETURN_NULL();
    }
    PG_RETURN_TIMESTAMPTZ(next);
}

Datum cron_firings(FunctionCallInfo fcinfo) {
    require_not_null(fcinfo, 0, "cron");
    require_not_null(fcinfo, 1, "time_zone");
    require_not_null(fcinfo, 3, "upto");
    require_not_null(fcinfo, 4, "max");
    const core::CronSpec spec = cron_spec_from_text(PG_GETARG_TEXT_PP(0));
    const PgZone zone(zone_by_name(PG_GETARG_TEXT_PP(1)));
    TimestampTz after = finite_after(fcinfo, 2);
    const TimestampTz upto = PG_GETARG_TIMESTAMPTZ(3);
    const int32 max = PG_GETARG_INT32(4);
    if (max < 1 || max > kMaxFirings) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("max must be between 1 and %d", kMaxFirings)));
    }
    // A set of a scalar: the executor's one-column descriptor.
    InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
    auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    for (int32 count = 0; count < max; ++count) {
        CHECK_FOR_INTERRUPTS();
        TimestampTz next = 0;
        if (!next_in_range(spec, after, zone, &next) || next > upto) {
            break;
        }
        Datum value = TimestampTzGetDatum(next);
        bool null = false;
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &value, &null);
        after = next;
    }
    return static_cast<Datum>(0);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_cron_next, pg_throttle::pg::cron_next)
PG_THROTTLE_SQL_FUNCTION(pg_throttle_cron_firings, pg_throttle::pg::cron_firings)
