// A claim, and a lease that extend lengthens, is a promise that no other
// worker gets the events before the lease ends: the commit that makes it
// must be on disk (and on the synchronous standbys) before the worker acts
// on it, whatever the session's synchronous_commit says.
#pragma once

namespace pg_throttle::pg {

// Raises synchronous_commit to on (remote flush) for the rest of the calling
// transaction when it is lower (off, local, remote_write), and again at its
// commit (or PREPARE), whatever a function's SET clause or a SET LOCAL did to
// it after the call; a higher setting (remote_apply) stays. A rollback to a
// savepoint does not undo the request: such a commit is durable too.
void require_durable_commit();

}  // namespace pg_throttle::pg
