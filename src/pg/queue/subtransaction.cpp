// run_in_subtransaction() (subtransaction.hpp), as a PL/pgSQL block with an
// exception handler runs its body.
#include "pg/queue/subtransaction.hpp"

extern "C" {
#include "utils/resowner.h"
}

namespace pg_throttle::pg {

bool run_in_subtransaction(bool (*step)(void* arg), void* arg,
                           bool (*absorb)(const ErrorData* error, void* arg)) {
    MemoryContext caller_context = CurrentMemoryContext;
    ResourceOwner caller_owner = CurrentResourceOwner;
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(caller_context);
    volatile bool keep = false;
    volatile bool absorbed = false;
    PG_TRY();
    { keep = step(arg); }
    PG_CATCH();
    {
        // Rolled back before the error reaches the caller: an exception
        // block of the caller's rolls back its own subtransaction, not this
        // one.
        MemoryContextSwitchTo(caller_context);
        ErrorData* error = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(caller_context);
        CurrentResourceOwner = caller_owner;
        if (absorb == nullptr || !absorb(error, arg)) {
            ReThrowError(error);
        }
        FreeErrorData(error);
        absorbed = true;
    }
    PG_END_TRY();
    if (absorbed) {
        return false;  // rolled back in PG_CATCH
    }
    if (keep) {
        ReleaseCurrentSubTransaction();
    } else {
        RollbackAndReleaseCurrentSubTransaction();
    }
    MemoryContextSwitchTo(caller_context);
    CurrentResourceOwner = caller_owner;
    return keep;
}

}  // namespace pg_throttle::pg
