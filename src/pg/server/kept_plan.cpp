#include "pg/server/kept_plan.hpp"

extern "C" {
#include "utils/snapmgr.h"
}

namespace pg_throttle::pg {

SPIPlanPtr kept_plan(KeptPlan* query) {
    if (query->plan == nullptr) {
        // A generic plan, made once: the queue's statements find their rows
        // along one index whatever the parameters, and a custom plan per
        // call would cost more than the statement itself.
        SPIPlanPtr plan = SPI_prepare_cursor(
            query->sql, query->nargs, query->argtypes,
            query->custom_plans ? CURSOR_OPT_CUSTOM_PLAN : CURSOR_OPT_GENERIC_PLAN);
        if (plan == nullptr) {
            elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        }
        if (SPI_keepplan(plan) != 0) {
            elog(ERROR, "SPI_keepplan failed");
        }
        query->plan = plan;
    }
    return query->plan;
}

void run_kept_plan(KeptPlan* query, const Datum* args, const char* nulls, int expected,
                   long limit) {
    const int rc =
        SPI_execute_plan(kept_plan(query), const_cast<Datum*>(args), nulls, false, limit);
    if (rc != expected) {
        elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
    }
}

void run_kept_plan_latest(KeptPlan* query, const Datum* args, const char* nulls, int expected,
                          long limit) {
    const int rc = SPI_execute_snapshot(kept_plan(query), const_cast<Datum*>(args), nulls,
                                        GetLatestSnapshot(), InvalidSnapshot, true, false, limit);
    if (rc != expected) {
        elog(ERROR, "SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
    }
}

}  // namespace pg_throttle::pg
