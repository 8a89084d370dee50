// PostgreSQL's time zones as the cron core sees them (core/cron.hpp, Zone).
#pragma once

#include "core/cron.hpp"
#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// A zone of PostgreSQL's tzdata, read through pg_localtime and
// pg_next_dst_boundary, neither of which raises: the core can call it.
class PgZone final : public core::Zone {
public:
    explicit PgZone(const pg_tz* zone) : zone_(zone) {}

    std::int32_t offset_at(core::UnixSeconds utc) const noexcept override;
    bool next_transition(core::UnixSeconds utc, core::ZoneTransition* out) const noexcept override;

private:
    const pg_tz* zone_;
};

// The zone of that name, as AT TIME ZONE and the TimeZone setting know it;
// raises 22023 when PostgreSQL does not know it or will not use it (a zone
// with leap seconds). Before the core is entered.
const pg_tz* zone_by_name(const text* name);

}  // namespace pg_throttle::pg
