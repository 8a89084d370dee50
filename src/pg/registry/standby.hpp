// What pg_throttle does on a hot standby. A standby's registry is its own:
// the primary never sees what it grants, nor it what the primary grants. So
// acquire, take, allow and wait refuse there (25006), as lock does, unless the
// session asks for a standby-local decision (pg_throttle.standby_local = on),
// which is documented as shared with nobody. The queue's functions write
// events and refuse with a message that says why.
#pragma once

#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {

// _PG_init: pg_throttle.standby_local.
void standby_define_guc();

// Raises 25006 when this server is a standby and a call of `kind` (a resource
// or bucket) must not decide from its registry. Cheap on a primary.
void standby_check_local_decision(EntryKind kind);

// Raises 25006, naming `function`, when this server is a standby.
void standby_refuse(const char* function);

}  // namespace pg_throttle::pg
