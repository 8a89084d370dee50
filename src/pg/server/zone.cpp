#include "pg/server/zone.hpp"

namespace pg_throttle::pg {

std::int32_t PgZone::offset_at(core::UnixSeconds utc) const noexcept {
    const pg_time_t at = utc;
    const pg_tm* local = pg_localtime(&at, zone_);
    // Only times far outside PostgreSQL's range have no local time.
    return local != nullptr ? static_cast<std::int32_t>(local->tm_gmtoff) : 0;
}

bool PgZone::next_transition(core::UnixSeconds utc, core::ZoneTransition* out) const noexcept {
    const pg_time_t at = utc;
    long before_offset = 0;
    int before_dst = 0;
    pg_time_t boundary = 0;
    long after_offset = 0;
    int after_dst = 0;
    // 1: a boundary after `at`; 0: none; -1: `at` is out of range. Beyond
    // its table, PostgreSQL answers 0 at an instant that falls exactly on its
    // 400-year repetition boundary, and the right answer one second later:
    // ask again there.
    int found = pg_next_dst_boundary(&at, &before_offset, &before_dst, &boundary, &after_offset,
                                     &after_dst, zone_);
    if (found == 0) {
        const pg_time_t next = at + 1;
        found = pg_next_dst_boundary(&next, &before_offset, &before_dst, &boundary, &after_offset,
                                     &after_dst, zone_);
    }
    if (found != 1 || boundary <= at) {
        return false;
    }
    out->at = boundary;
    out->offset_after = static_cast<std::int32_t>(after_offset);
    return true;
}

const pg_tz* zone_by_name(const text* name) {
    const char* zone_name = text_to_cstring(name);
    pg_tz* zone = pg_tzset(zone_name);
    if (zone == nullptr) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("time zone \"%s\" not recognized", zone_name)));
    }
    if (!pg_tz_acceptable(zone)) {
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("time zone \"%s\" appears to use leap seconds", zone_name),
                        errdetail("PostgreSQL does not support leap seconds.")));
    }
    return zone;
}

}  // namespace pg_throttle::pg
