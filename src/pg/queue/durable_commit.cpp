// require_durable_commit(), for claim, claim_group and extend.
//
// The setting is raised during the call, for the rest of the transaction,
// and again at the commit: a function's SET clause restores the value it
// found when the function returns, so the first raise, made inside a
// caller's function with SET synchronous_commit = off, would be gone before
// the commit. XACT_EVENT_PRE_COMMIT (and PRE_PREPARE) comes after every
// function has returned and before RecordTransactionCommit (EndPrepare)
// reads synchronous_commit, on 15 to 18; both settings are local to the
// transaction, which AtEOXact_GUC ends right after the commit.
#include "pg/queue/durable_commit.hpp"

#include "pg/server/boundary.hpp"

namespace pg_throttle::pg {
namespace {

bool required = false;  // this transaction made a claim or extended one
bool callback_registered = false;

// Raises synchronous_commit to on (remote flush) for the rest of the
// transaction, its commit, when it is lower; remote_apply stays.
void raise_synchronous_commit() {
    if (synchronous_commit < SYNCHRONOUS_COMMIT_REMOTE_FLUSH) {
        (void)set_config_option("synchronous_commit", "on", PGC_USERSET, PGC_S_SESSION,
                                GUC_ACTION_LOCAL, true, 0, false);
    }
}

void on_transaction(XactEvent event, void* /*arg*/) {
    switch (event) {
        case XACT_EVENT_PRE_COMMIT:
        case XACT_EVENT_PRE_PREPARE:
            if (required) {
                raise_synchronous_commit();
            }
            break;
        case XACT_EVENT_COMMIT:
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PREPARE:
        case XACT_EVENT_PARALLEL_COMMIT:
        case XACT_EVENT_PARALLEL_ABORT:
            required = false;
            break;
        case XACT_EVENT_PARALLEL_PRE_COMMIT:
            break;
    }
}

}  // namespace

void require_durable_commit() {
    if (!callback_registered) {
        RegisterXactCallback(on_transaction, nullptr);
        callback_registered = true;
    }
    required = true;
    raise_synchronous_commit();
}

}  // namespace pg_throttle::pg
