#include "pg/server/clock.hpp"

#include "pg/server/compat.hpp"
#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {
namespace {

char* test_clock_text = nullptr;  // the GUC's string, owned by guc.c
bool test_clock_set = false;
core::Micros test_clock_value = 0;

// Parses a timestamptz the way timestamptz_in does, but reports failure
// instead of raising an error: a check hook must not ereport.
bool parse_timestamptz(const char* text, TimestampTz* result) {
    char workbuf[MAXDATELEN + MAXDATEFIELDS];
    char* field[MAXDATEFIELDS];
    int ftype[MAXDATEFIELDS];
    int nf = 0;
    if (strlen(text) >= MAXDATELEN) {
        return false;
    }
    if (ParseDateTime(text, workbuf, sizeof workbuf, field, ftype, MAXDATEFIELDS, &nf) != 0) {
        return false;
    }
    pg_tm tm{};
    fsec_t fsec = 0;
    int dtype = 0;
    int tz = 0;
    if (compat_decode_datetime(field, ftype, nf, &dtype, &tm, &fsec, &tz) != 0 ||
        dtype != DTK_DATE) {
        return false;
    }
    return tm2timestamp(&tm, fsec, &tz, result) == 0 && IS_VALID_TIMESTAMP(*result);
}

bool check_test_clock(char** newval, void** extra, GucSource /*source*/) {
    if (*newval == nullptr || (*newval)[0] == '\0') {
        return true;
    }
    TimestampTz parsed = 0;
    if (!parse_timestamptz(*newval, &parsed)) {
        GUC_check_errdetail("pg_throttle.test_clock must be empty or a finite timestamptz.");
        return false;
    }
    auto* stored = static_cast<TimestampTz*>(compat_guc_extra_alloc(sizeof(TimestampTz)));
    if (stored == nullptr) {
        return false;
    }
    *stored = parsed;
    *extra = stored;
    return true;
}

void assign_test_clock(const char* /*newval*/, void* extra) {
    test_clock_set = extra != nullptr;
    test_clock_value = test_clock_set ? *static_cast<TimestampTz*>(extra) : 0;
}

}  // namespace

void define_clock_guc() {
    DefineCustomStringVariable(
        "pg_throttle.test_clock",
        "Replaces the real clock of pg_throttle with this timestamptz, for tests.",
        "Empty (the default) means the real clock. Only superusers may set it.", &test_clock_text,
        "", PGC_SUSET, 0, check_test_clock, assign_test_clock, nullptr);
}

core::Micros clock_now() {
    return test_clock_set ? test_clock_value : GetCurrentTimestamp();
}

bool clock_is_test() {
    return test_clock_set;
}

core::Micros real_now() {
    return GetCurrentTimestamp();
}

}  // namespace pg_throttle::pg
