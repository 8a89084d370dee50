// Raising a 64-bit counter in shared memory to at least a value, without a
// lock (the fence counter and limit, the lease journal's sequence).
#pragma once

#include "pg/pg_headers.hpp"

namespace pg_throttle::pg {

inline void atomic_raise(int64* value, int64 to) {
    int64 seen = __atomic_load_n(value, __ATOMIC_ACQUIRE);
    while (seen < to && !__atomic_compare_exchange_n(value, &seen, to, true, __ATOMIC_ACQ_REL,
                                                     __ATOMIC_ACQUIRE)) {
    }
}

}  // namespace pg_throttle::pg
