// The quota that applies to a role or a database, as its sessions get it:
// the settings an ALTER ROLE or ALTER DATABASE ... SET stored in
// pg_db_role_setting, most specific first, then the server's own.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// pg_throttle.role_quota (`role_quota`) or pg_throttle.database_quota, in
// percent, for a session of `role` in database `db` (InvalidOid: no role of
// its own), by PostgreSQL's order: ALTER ROLE role IN DATABASE db, ALTER ROLE
// role, ALTER DATABASE db, ALTER ROLE ALL, then the server's configuration.
// A session's SET (superusers only) is not seen. Reads the catalog: call it
// outside every LWLock.
int quota_percent_for(Oid db, Oid role, bool role_quota);

}  // namespace pg_throttle::pg
