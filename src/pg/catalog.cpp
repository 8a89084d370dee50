#include "pg/catalog.hpp"

namespace pg_throttle::pg {
namespace {

SPIPlanPtr resource_interval_plan = nullptr;

SPIPlanPtr prepared_resource_interval_plan() {
    if (resource_interval_plan == nullptr) {
        Oid argtypes[1] = {TEXTOID};
        SPIPlanPtr plan =
            SPI_prepare("SELECT every FROM throttle.resource WHERE name = $1", 1, argtypes);
        if (plan == nullptr) {
            elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        }
        if (SPI_keepplan(plan) != 0) {
            elog(ERROR, "SPI_keepplan failed");
        }
        resource_interval_plan = plan;
    }
    return resource_interval_plan;
}

}  // namespace

Interval declared_resource_interval(const text* resource) {
    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    Datum args[1] = {PointerGetDatum(resource)};
    const int rc = SPI_execute_plan(prepared_resource_interval_plan(), args, nullptr, false, 1);
    if (rc != SPI_OK_SELECT) {
        elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
    }
    bool found = SPI_processed == 1;
    bool is_null = true;
    Interval every{};
    if (found) {
        Datum value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null);
        if (!is_null) {
            every = *DatumGetIntervalP(value);
        }
    }
    SPI_finish();
    if (!found || is_null) {
        ereport(ERROR,
                (errcode(ERRCODE_UNDEFINED_OBJECT),
                 errmsg("resource \"%s\" has no declared interval", text_to_cstring(resource)),
                 errhint("Pass the interval as \"every\", or declare it with INSERT INTO "
                         "throttle.resource (name, every) VALUES (...).")));
    }
    return every;
}

}  // namespace pg_throttle::pg
