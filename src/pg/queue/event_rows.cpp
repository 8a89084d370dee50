#include "pg/queue/event_rows.hpp"

extern "C" {
#include "commands/async.h"
#include "utils/array.h"
#include "utils/lsyscache.h"
}

namespace pg_throttle::pg {
ArrayType* ids_array(const Datum* ids, int n) {
    return construct_array(const_cast<Datum*>(ids), n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
                           TYPALIGN_DOUBLE);
}

ArrayType* spi_column(int column, Oid element_type) {
    const uint64 n = SPI_processed;
    auto* values = static_cast<Datum*>(palloc(sizeof(Datum) * (n == 0 ? 1 : n)));
    auto* nulls = static_cast<bool*>(palloc(sizeof(bool) * (n == 0 ? 1 : n)));
    for (uint64 i = 0; i < n; ++i) {
        values[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, column, &nulls[i]);
    }
    int16 length = 0;
    bool by_value = false;
    char align = 'i';
    get_typlenbyvalalign(element_type, &length, &by_value, &align);
    int dims[1] = {static_cast<int>(n)};
    int lower_bounds[1] = {1};
    return construct_md_array(values, nulls, 1, dims, lower_bounds, element_type, length, by_value,
                              align);
}

bool spi_any_not_null(int column) {
    for (uint64 i = 0; i < SPI_processed; ++i) {
        bool is_null = true;
        (void)SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, column, &is_null);
        if (!is_null) {
            return true;
        }
    }
    return false;
}

ArrayType* first_ids(ArrayType* ids, int count) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int total = 0;
    deconstruct_array(ids, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &elements,
                      &nulls, &total);
    return ids_array(elements, std::min(std::max(count, 0), total));
}

void return_events(FunctionCallInfo fcinfo, const SPITupleTable* rows, uint64 count) {
    // The tuplestore lives in the query's memory, past SPI_finish.
    InitMaterializedSRF(fcinfo, 0);
    add_events(fcinfo, rows, count);
}

void add_events(FunctionCallInfo fcinfo, const SPITupleTable* rows, uint64 count) {
    auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    const TupleDesc expected = rsinfo->setDesc;
    const TupleDesc got = rows->tupdesc;
    auto* values = static_cast<Datum*>(palloc(sizeof(Datum) * expected->natts));
    auto* nulls = static_cast<bool*>(palloc(sizeof(bool) * expected->natts));
    for (uint64 row = 0; row < count; ++row) {
        // e.* has no dropped columns; the row type may have some (NULL there).
        int column = 0;
        for (int i = 0; i < expected->natts; ++i) {
            if (TupleDescAttr(expected, i)->attisdropped) {
                values[i] = 0;
                nulls[i] = true;
                continue;
            }
            if (column >= got->natts) {
                elog(ERROR, "throttle.event row has fewer columns than its type");
            }
            ++column;
            values[i] = SPI_getbinval(rows->vals[row], got, column, &nulls[i]);
        }
        tuplestore_putvalues(rsinfo->setResult, expected, values, nulls);
    }
}

void notify_event(const char* queue, int64 id) {
    PreventCommandDuringRecovery("NOTIFY");
    Async_Notify(queue, psprintf(INT64_FORMAT, id));
}

}  // namespace pg_throttle::pg
