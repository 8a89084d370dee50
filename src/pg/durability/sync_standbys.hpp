// Waiting for synchronous standbys before a promise is made: a fence block
// before its tokens are used, a lease before its token is returned. A
// promoted standby must know what the primary promised.
#pragma once

#include "pg/server/pg_headers.hpp"

extern "C" {
#include "access/xlogdefs.h"
}

namespace pg_throttle::pg {

// Flushes WAL up to `lsn` and, when synchronous standbys are configured
// (synchronous_standby_names), waits until they have flushed it too —
// whatever the calling session's synchronous_commit, since the promise is
// made to every session. A cancel (statement_timeout, pg_cancel_backend) or
// termination ends the wait with an error, never with the promise made.
// Call it with no LWLock held.
void wait_for_sync_standbys(XLogRecPtr lsn);

}  // namespace pg_throttle::pg
