// Quotas on the registry: how many entries each role and each database
// holds, and the most each may hold (pg_throttle.role_quota,
// pg_throttle.database_quota, in percent of pg_throttle.max_entries), so
// that no role and no database can fill the registry for the others.
//
// An entry counts against its database and its owner (RegistryEntry::owner:
// the role that created it; for a lock, the role holding it), and against
// the room of its pool: pg_throttle.max_entries for every kind but one, and
// room of its own beside it for the queue groups' leases, which count
// against neither quota of the shared registry, only against their owner's
// share of their own room (pg_throttle.role_quota percent of it): neither a
// role's own keys, nor a registry full of other roles' entries, nor one role
// holding every group can stop a role's queue workers. The
// counts live in shared memory under a lock of their own, taken after a
// partition lock and never before one; nothing here raises or sleeps under it.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

void quota_define_gucs();
Size quota_shmem_size(int max_entries);
// `lock`: the LWLock that guards the counts.
void quota_attach_shmem(int max_entries, LWLock* lock);

// Where an entry has its room: kShared (pg_throttle.max_entries, under the
// quotas) or kGroupLeases (quota_group_lease_room, under the role share alone).
enum class QuotaPool : uint8 { kShared = 0, kGroupLeases = 1 };

// The room kept for queue groups' leases beside pg_throttle.max_entries: a
// tenth of it, at least 100 (a group may have 64 workers).
int64 quota_group_lease_room(int max_entries);

enum class QuotaCheck { kOk, kRoleQuota, kDatabaseQuota, kFull };

// Counts a new entry of database `db` owned by `role` (InvalidOid: counted
// against the database only) in `pool`. With `enforce`, refuses it (and
// counts nothing) when its pool is full (kFull) or, in kShared, the role or
// the database already holds its quota, or, in kGroupLeases, the role holds
// its quota of that pool's room (pg_throttle.role_quota percent of it: no
// role holds the room every queue's workers share), by the calling session's
// settings.
// Without, as when the server restores what it held, it always counts.
QuotaCheck quota_charge(QuotaPool pool, Oid role, Oid db, bool enforce);
// Whether `pool` holds as many entries as it has room for: the server puts
// back no more than that at its start (a registry made smaller).
bool quota_pool_full(QuotaPool pool);
// The entry is gone.
void quota_uncharge(QuotaPool pool, Oid role, Oid db);
// The entry now belongs to `to` (a lock granted to another role). Not
// enforced: the entry exists already.
void quota_move(QuotaPool pool, Oid from, Oid to);

// Raises SQLSTATE 53400 for a refused charge, with a hint naming the GUC.
[[noreturn]] void quota_raise(QuotaCheck refused, Oid role, Oid db,
                              QuotaPool pool = QuotaPool::kShared);

// One row of throttle.usage.
struct QuotaUsage {
    bool is_role;  // else a database
    Oid owner;
    int32 entries;
};
// Copies every nonzero count into `rows` (room for `capacity`); returns how
// many there are, which may exceed `capacity` (then call again with more).
int64 quota_usage(QuotaUsage* rows, int64 capacity);
// The quotas, in entries, by the calling session's settings.
int64 quota_role_limit();
int64 quota_database_limit();
// The server's pg_throttle.role_quota (`role`) or pg_throttle.database_quota,
// in percent: its configuration files' and command line's, without the role
// and database settings a session applies.
int quota_server_percent(bool role);
// A quota in percent, in entries (INT64_MAX at 100: no quota).
int64 quota_limit_of(int percent);

// The quota that applies to a role or a database, as its sessions get it
// (quota_settings.cpp): pg_throttle.role_quota (`role_quota`) or
// pg_throttle.database_quota, in percent, for a session of `role` in database
// `db` (InvalidOid: no role of its own), by PostgreSQL's order: ALTER ROLE
// role IN DATABASE db, ALTER ROLE role, ALTER DATABASE db, ALTER ROLE ALL,
// then the server's configuration (the settings an ALTER ROLE or ALTER
// DATABASE ... SET stored in pg_db_role_setting). A session's SET
// (superusers only) is not seen. Reads the catalog: call it outside every
// LWLock.
int quota_percent_for(Oid db, Oid role, bool role_quota);

}  // namespace pg_throttle::pg
