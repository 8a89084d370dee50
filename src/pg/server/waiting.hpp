// A backend that sleeps in pg_throttle (throttle.wait, a lock's queue): what
// it waits for, as pg_stat_activity shows it, and whether its client is still
// there.
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

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// throttle.lock waiting in the queue of a lock held by another session.
uint32 wait_event_lock();
// throttle.wait sleeping until its bucket lets the request pass.
uint32 wait_event_wait();

// A sleeping backend reads nothing from its socket, so it would not notice
// its client leaving: it would then be handed a lease, or pass on units, for
// nobody. The longest it goes without looking at its client:
inline constexpr long kClientCheckMs = 1000;

// Raises FATAL (08006) when this backend's client has closed its connection,
// as PostgreSQL does with client_connection_check_interval. Backends with no
// client (background workers) never raise.
void raise_if_client_gone();

}  // namespace pg_throttle::pg
