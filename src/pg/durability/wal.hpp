// pg_throttle's WAL resource manager: the records that carry the fence mark
// and leases to standbys and through crash recovery.
//
// RM_EXPERIMENTAL_ID (128) until an id is reserved on the PostgreSQL wiki's
// list of custom WAL resource managers. WAL holding these records can only
// be replayed with pg_throttle in shared_preload_libraries.
#pragma once

// lease_journal.hpp brings in src/core: before any PostgreSQL header.
#include "pg/durability/lease_journal.hpp"

namespace pg_throttle::pg {

// _PG_init: registers the resource manager.
void wal_register();

// Insert a record and return its position; neither flushes.
XLogRecPtr wal_log_fence_limit(int64 limit);
XLogRecPtr wal_log_lease(const LeaseRecord& record);

}  // namespace pg_throttle::pg
