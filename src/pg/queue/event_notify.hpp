// The queue's NOTIFY from C++ (event_notify.cpp): what pg_notify(queue,
// id::text) does, without a statement.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// The channel `queue` hears the event's id when the transaction commits
// (identical notifications of one transaction are sent once).
void notify_event(const char* queue, int64 id);

}  // namespace pg_throttle::pg
