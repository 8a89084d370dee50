// SQL the extension runs through SPI, with its plan prepared on first use in
// a backend and kept for the backend's life: one generic plan, no parse and
// no plan per call (unless the statement asks for custom plans).
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

inline constexpr int kMaxPlanArgs = 12;

struct KeptPlan {
    const char* sql;
    int nargs;
    Oid argtypes[kMaxPlanArgs];
    SPIPlanPtr plan;  // nullptr until first use
    // Plan each call for its parameters (whatever plan_cache_mode says),
    // for a statement whose best plan depends on them.
    bool custom_plans = false;
};

// The plan of `query`, prepared and kept on first use. Inside SPI_connect.
SPIPlanPtr kept_plan(KeptPlan* query);

// Runs `query` with `args` (`nulls` as SPI takes them: nullptr, or 'n' for a
// NULL and ' ' otherwise), at most `limit` rows (0: all); raises an internal
// error unless SPI answers `expected` (SPI_OK_SELECT, SPI_OK_UPDATE, ...).
// Inside SPI_connect; the rows are in SPI_tuptable.
void run_kept_plan(KeptPlan* query, const Datum* args, const char* nulls, int expected,
                   long limit = 0);

// A read (a SELECT) like run_kept_plan, in the latest snapshot rather than
// the transaction's: what the last committed change left, also under
// repeatable read (a read of a policy, or a count that a lock held until
// commit makes exact).
void run_kept_plan_latest(KeptPlan* query, const Datum* args, const char* nulls, int expected,
                          long limit = 0);

}  // namespace pg_throttle::pg
