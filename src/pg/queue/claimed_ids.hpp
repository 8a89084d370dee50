// The events a claim of throttle.claim has taken so far, in the order it
// took them: their ids (bigint Datums) and concurrency keys, growing lists
// in the claim's memory context.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

struct Ids {
    Datum* values;
    const text** keys;  // keys[i]: the concurrency_key of values[i]; nullptr: none
    int count;
    int capacity;
};

inline void append(Ids* ids, Datum id, const text* key) {
    if (ids->count == ids->capacity) {
        ids->capacity = ids->capacity == 0 ? 16 : ids->capacity * 2;
        const size_t size = sizeof(Datum) * static_cast<size_t>(ids->capacity);
        const size_t key_size = sizeof(const text*) * static_cast<size_t>(ids->capacity);
        ids->values = static_cast<Datum*>(ids->values == nullptr ? palloc(size)
                                                                 : repalloc(ids->values, size));
        ids->keys = static_cast<const text**>(ids->keys == nullptr ? palloc(key_size)
                                                                   : repalloc(ids->keys, key_size));
    }
    ids->keys[ids->count] = key;
    ids->values[ids->count++] = id;
}

}  // namespace pg_throttle::pg
