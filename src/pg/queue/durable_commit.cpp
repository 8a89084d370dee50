// require_durable_commit(), for claim, claim_group and extend.
#include "pg/queue/durable_commit.hpp"

#include "pg/boundary.hpp"

namespace pg_throttle::pg {

void require_durable_commit() {
    if (synchronous_commit < SYNCHRONOUS_COMMIT_REMOTE_FLUSH) {
        // A local setting: it lasts until the transaction ends, past the
        // SECURITY DEFINER function's own SET clause (which is search_path).
        (void)set_config_option("synchronous_commit", "on", PGC_USERSET, PGC_S_SESSION,
                                GUC_ACTION_LOCAL, true, 0, false);
    }
}

}  // namespace pg_throttle::pg
