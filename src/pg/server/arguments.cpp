#include "pg/server/arguments.hpp"

#include "pg/server/compat.hpp"

namespace pg_throttle::pg {

void require_not_null(FunctionCallInfo fcinfo, int n, const char* what) {
    if (PG_ARGISNULL(n)) {
        ereport(ERROR,
                (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("%s must not be NULL", what)));
    }
}

namespace {

// A finite interval in microseconds; raises 22008 when it does not fit.
core::Micros finite_micros(const Interval* interval, const char* what) {
    const auto micros = core::interval_to_micros(interval->month, interval->day, interval->time);
    if (!micros.has_value()) {
        ereport(ERROR,
                (errcode(ERRCODE_DATETIME_FIELD_OVERFLOW), errmsg("%s is out of range", what)));
    }
    return *micros;
}

}  // namespace

void require_positive_interval(const Interval* interval, const char* what) {
    const int infinity = compat_interval_infinity(interval);
    Interval zero{};
    if (infinity < 0 ||
        (infinity == 0 && DatumGetBool(DirectFunctionCall2(interval_le, IntervalPGetDatum(interval),
                                                           IntervalPGetDatum(&zero))))) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s must be a positive interval", what)));
    }
    if (infinity > 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s must be a finite interval", what)));
    }
}

void require_ends_after(TimestampTz now, const Interval* interval, const char* what) {
    const TimestampTz end = DatumGetTimestampTz(DirectFunctionCall2(
        timestamptz_pl_interval, TimestampTzGetDatum(now), IntervalPGetDatum(interval)));
    if (end <= now) {
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s must end after now", what),
                 errdetail("Added to now on the calendar, it ends at or before now."),
                 errhint("Give it in days, hours or less rather than months minus days.")));
    }
}

core::Micros positive_interval(const Interval* interval, const char* what) {
    const int infinity = compat_interval_infinity(interval);
    if (infinity > 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s must be a finite interval", what)));
    }
    const core::Micros micros = infinity < 0 ? -1 : finite_micros(interval, what);
    if (micros <= 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s must be a positive interval", what)));
    }
    return micros;
}

core::Micros optional_wait(FunctionCallInfo fcinfo, int n, const char* what) {
    if (PG_ARGISNULL(n)) {
        return core::kNever;
    }
    const Interval* interval = PG_GETARG_INTERVAL_P(n);
    const int infinity = compat_interval_infinity(interval);
    if (infinity > 0) {
        return core::kNever;  // 'infinity': no limit, as NULL
    }
    const core::Micros micros = infinity < 0 ? -1 : finite_micros(interval, what);
    if (micros < 0) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s must not be negative", what)));
    }
    return micros;
}

void clip_text(const text* value, size_t limit, char* out) {
    const char* data = VARDATA_ANY(value);
    const int len = static_cast<int>(VARSIZE_ANY_EXHDR(value));
    const int kept = pg_mbcliplen(data, len, static_cast<int>(limit));
    memcpy(out, data, kept);
    out[kept] = '\0';
}

Datum interval_datum(core::Micros micros) {
    auto* value = static_cast<Interval*>(palloc(sizeof(Interval)));
    value->time = micros;
    value->day = 0;
    value->month = 0;
    return IntervalPGetDatum(value);
}

}  // namespace pg_throttle::pg
