// Rows of throttle.event in and out of the queue's native functions, and the
// NOTIFY of an event.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// Column `column` of SPI_tuptable's rows, of type `element_type` (a
// variable-length type or bigint), NULLs kept, as an array in the current
// memory context.
ArrayType* spi_column(int column, Oid element_type);

// Whether any row of SPI_tuptable has a value (not NULL) in `column`.
bool spi_any_not_null(int column);

// `n` bigint Datums as a bigint[] in the current memory context.
ArrayType* ids_array(const Datum* ids, int n);

// The first `count` ids of `ids` (0 < count <= its length), in the current
// memory context.
ArrayType* first_ids(ArrayType* ids, int count);

// Makes the SET-returning function's result (materialized) the first `count`
// rows of `rows`, whole rows of throttle.event: the function returns SETOF
// throttle.event and the statement returned e.*. Call inside SPI_connect,
// before SPI_finish.
void return_events(FunctionCallInfo fcinfo, const SPITupleTable* rows, uint64 count);

// The same, in parts: the result started once (InitMaterializedSRF), then
// rows added to it from one or more statements' results.
void add_events(FunctionCallInfo fcinfo, const SPITupleTable* rows, uint64 count);

// The queue's NOTIFY from C++: what pg_notify(queue, id::text) does, without
// a statement. The channel `queue` hears the event's id when the transaction
// commits (identical notifications of one transaction are sent once).
void notify_event(const char* queue, int64 id);

}  // namespace pg_throttle::pg
