// What a pg_throttle backend waits for, as pg_stat_activity shows it.
//
// On PostgreSQL 17 and later each wait has a name of its own (wait_event_type
// "Extension", wait_event "ThrottleLock" or "ThrottleWait", listed in
// pg_wait_events); on 15 and 16 both show as wait_event "Extension". (The
// checkpointer worker has no database connection, so pg_stat_activity does
// not list it; it waits as plain "Extension".) A name is
// registered the first time this backend waits for it; registering can raise
// an error, so call these before any LWLock is taken and outside critical
// sections.
#pragma once

#include "pg/pg_headers.hpp"

namespace pg_throttle::pg {

// throttle.lock waiting in the queue of a lock held by another session.
uint32 wait_event_lock();
// throttle.wait sleeping until its bucket lets the request pass.
uint32 wait_event_wait();

}  // namespace pg_throttle::pg
