// The ids a claim of throttle.claim has taken so far, in the order it took
// them: a growing list of bigint Datums in the claim's memory context.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

struct Ids {
    Datum* values;
    int count;
    int capacity;
    // The concurrency_key of the last event taken that had one ('' for an
    // event without one taken in its turn by round robin); nullptr: none.
    const text* last_key;
};

inline void append(Ids* ids, Datum id) {
    if (ids->count == ids->capacity) {
        ids->capacity = ids->capacity == 0 ? 16 : ids->capacity * 2;
        const size_t size = sizeof(Datum) * static_cast<size_t>(ids->capacity);
        ids->values = static_cast<Datum*>(ids->values == nullptr ? palloc(size)
                                                                 : repalloc(ids->values, size));
    }
    ids->values[ids->count++] = id;
}

}  // namespace pg_throttle::pg
