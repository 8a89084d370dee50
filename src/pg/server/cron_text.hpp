// A cron expression given as SQL text, parsed by the core (core/cron.hpp).
#pragma once

#include "core/cron.hpp"
#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// The parsed expression; raises 22023 with the field and the byte offset in
// its DETAIL when the core refuses it.
core::CronSpec cron_spec_from_text(const text* cron);

}  // namespace pg_throttle::pg
