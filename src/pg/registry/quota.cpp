#include "core/owner_counts.hpp"
#include "pg/registry/quota.hpp"

#include <limits>

namespace pg_throttle::pg {
namespace {

int role_quota_percent = 50;
int database_quota_percent = 75;
int64 max_entries_seen = 0;
int64 pool_room[2] = {0, 0};  // by QuotaPool
// The postmaster's own settings, kept by its assign hooks (a backend's differ
// once role and database settings apply) and published in shared memory.
int postmaster_role_percent = 50;
int postmaster_database_percent = 75;

struct QuotaShared {
    int64 entries[2];  // by QuotaPool
    uint32 capacity;   // slots per table; the role table, then the database table, follow
    // Slots of the table of group leases per role, which follows them: the
    // same role quota, in percent of the group leases' room, so that no role
    // holds the room that every queue's workers share.
    uint32 group_capacity;
    // The server's quotas, in percent: the postmaster's settings (its
    // configuration files and command line), which a session has unless a
    // role or database setting overrides them. Written by the postmaster.
    pg_atomic_uint32 server_role_percent;
    pg_atomic_uint32 server_database_percent;
};
static_assert(std::is_trivially_copyable_v<QuotaShared>);

QuotaShared* shared = nullptr;
core::OwnerCount* role_counts = nullptr;
core::OwnerCount* database_counts = nullptr;
core::OwnerCount* group_role_counts = nullptr;
LWLock* counts_lock = nullptr;

// 100%: no quota at all (the registry's own capacity is the limit, and a
// call beyond it is told the registry is full).
int64 limit_of(int percent, int64 room) {
    if (percent >= 100) {
        return std::numeric_limits<int64>::max();
    }
    return std::max<int64>(1, room * percent / 100);
}

int64 limit_of(int percent) {
    return limit_of(percent, max_entries_seen);
}

const char* role_name_or_oid(Oid role, char* buffer, size_t size) {
    // Called outside every LWLock: a catalog lookup may raise.
    const char* name = GetUserNameFromId(role, true);
    if (name != nullptr) {
        return name;
    }
    snprintf(buffer, size, "%u", role);
    return buffer;
}

void publish_role_percent(int percent, void* /*extra*/) {
    if (!IsUnderPostmaster) {
        postmaster_role_percent = percent;
        if (shared != nullptr) {
            pg_atomic_write_u32(&shared->server_role_percent, static_cast<uint32>(percent));
        }
    }
}

void publish_database_percent(int percent, void* /*extra*/) {
    if (!IsUnderPostmaster) {
        postmaster_database_percent = percent;
        if (shared != nullptr) {
            pg_atomic_write_u32(&shared->server_database_percent, static_cast<uint32>(percent));
        }
    }
}

}  // namespace

void quota_define_gucs() {
    DefineCustomIntVariable(
        "pg_throttle.role_quota",
        "Most registry entries one role may hold, in percent of pg_throttle.max_entries.",
        "Counted server-wide over every database. A superuser may give a role more with "
        "ALTER ROLE ... SET.",
        &role_quota_percent, 50, 1, 100, PGC_SUSET, 0, nullptr, publish_role_percent, nullptr);
    DefineCustomIntVariable(
        "pg_throttle.database_quota",
        "Most registry entries one database may hold, in percent of pg_throttle.max_entries.",
        "A superuser may give a database more with ALTER DATABASE ... SET.",
        &database_quota_percent, 75, 1, 100, PGC_SUSET, 0, nullptr, publish_database_percent,
        nullptr);
}

int64 quota_group_lease_room(int max_entries) {
    constexpr int64 kLeast = 100;
    return std::max<int64>(kLeast, max_entries / 10);
}

Size quota_shmem_size(int max_entries) {
    // Each entry counts against at most one role and one database: room for
    // as many owners of each as there can be entries.
    const uint32 capacity = core::owner_table_capacity(max_entries);
    const uint32 group_capacity = core::owner_table_capacity(quota_group_lease_room(max_entries));
    return add_size(
        MAXALIGN(sizeof(QuotaShared)),
        mul_size(2 * static_cast<Size>(capacity) + group_capacity, sizeof(core::OwnerCount)));
}

void quota_attach_shmem(int max_entries, LWLock* lock) {
    max_entries_seen = max_entries;
    pool_room[static_cast<int>(QuotaPool::kShared)] = max_entries;
    pool_room[static_cast<int>(QuotaPool::kGroupLeases)] = quota_group_lease_room(max_entries);
    counts_lock = lock;
    bool found = false;
    const Size size = quota_shmem_size(max_entries);
    auto* base = static_cast<char*>(ShmemInitStruct("pg_throttle quotas", size, &found));
    shared = reinterpret_cast<QuotaShared*>(base);
    if (!found) {
        memset(base, 0, size);
        shared->capacity = core::owner_table_capacity(max_entries);
        shared->group_capacity = core::owner_table_capacity(quota_group_lease_room(max_entries));
        pg_atomic_init_u32(&shared->server_role_percent,
                           static_cast<uint32>(postmaster_role_percent));
        pg_atomic_init_u32(&shared->server_database_percent,
                           static_cast<uint32>(postmaster_database_percent));
    }
    role_counts = reinterpret_cast<core::OwnerCount*>(base + MAXALIGN(sizeof(QuotaShared)));
    database_counts = role_counts + shared->capacity;
    group_role_counts = database_counts + shared->capacity;
}

QuotaCheck quota_charge(QuotaPool pool, Oid role, Oid db, bool enforce) {
    const int p = static_cast<int>(pool);
    const bool shared_pool = pool == QuotaPool::kShared;
    // A role's share of its pool: of the registry, or of the group leases' room.
    const int64 role_limit =
        shared_pool ? limit_of(role_quota_percent) : limit_of(role_quota_percent, pool_room[p]);
    const int64 database_limit = limit_of(database_quota_percent);
    core::OwnerCount* role_table = shared_pool ? role_counts : group_role_counts;
    const uint32 role_capacity = shared_pool ? shared->capacity : shared->group_capacity;
    QuotaCheck result = QuotaCheck::kOk;
    LWLockAcquire(counts_lock, LW_EXCLUSIVE);
    if (enforce && shared->entries[p] >= pool_room[p]) {
        result = QuotaCheck::kFull;
    } else if (enforce && OidIsValid(role) &&
               core::owner_count_of(role_table, role_capacity, role) >= role_limit) {
        result = QuotaCheck::kRoleQuota;
    } else if (enforce && shared_pool &&
               core::owner_count_of(database_counts, shared->capacity, db) >= database_limit) {
        result = QuotaCheck::kDatabaseQuota;
    } else {
        shared->entries[p]++;
        if (shared_pool) {
            // The tables have a slot for every entry the registry can hold.
            (void)core::owner_count_add(role_counts, shared->capacity, role, 1);
            (void)core::owner_count_add(database_counts, shared->capacity, db, 1);
        } else {
            (void)core::owner_count_add(group_role_counts, shared->group_capacity, role, 1);
        }
    }
    LWLockRelease(counts_lock);
    return result;
}

bool quota_pool_full(QuotaPool pool) {
    const int p = static_cast<int>(pool);
    LWLockAcquire(counts_lock, LW_SHARED);
    const bool full = shared->entries[p] >= pool_room[p];
    LWLockRelease(counts_lock);
    return full;
}

void quota_uncharge(QuotaPool pool, Oid role, Oid db) {
    LWLockAcquire(counts_lock, LW_EXCLUSIVE);
    shared->entries[static_cast<int>(pool)]--;
    if (pool == QuotaPool::kShared) {
        (void)core::owner_count_add(role_counts, shared->capacity, role, -1);
        (void)core::owner_count_add(database_counts, shared->capacity, db, -1);
    } else {
        (void)core::owner_count_add(group_role_counts, shared->group_capacity, role, -1);
    }
    LWLockRelease(counts_lock);
}

void quota_move(QuotaPool pool, Oid from, Oid to) {
    if (from == to) {
        return;
    }
    const bool shared_pool = pool == QuotaPool::kShared;
    core::OwnerCount* counts = shared_pool ? role_counts : group_role_counts;
    const uint32 capacity = shared_pool ? shared->capacity : shared->group_capacity;
    LWLockAcquire(counts_lock, LW_EXCLUSIVE);
    (void)core::owner_count_add(counts, capacity, from, -1);
    (void)core::owner_count_add(counts, capacity, to, 1);
    LWLockRelease(counts_lock);
}

void quota_raise(QuotaCheck refused, Oid role, Oid db, QuotaPool pool) {
    char buffer[16];
    if (refused == QuotaCheck::kRoleQuota && pool == QuotaPool::kGroupLeases) {
        ereport(ERROR,
                (errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
                 errmsg("role \"%s\" holds its quota of pg_throttle queue group leases",
                        role_name_or_oid(role, buffer, sizeof buffer)),
                 errdetail(
                     "A role may hold %lld group leases (pg_throttle.role_quota = %d%% of the "
                     "%lld kept for queue groups).",
                     static_cast<long long>(
                         limit_of(role_quota_percent, pool_room[static_cast<int>(pool)])),
                     role_quota_percent, static_cast<long long>(pool_room[static_cast<int>(pool)])),
                 errhint("Complete or release the groups it holds, or have a superuser raise "
                         "pg_throttle.role_quota for this role (ALTER ROLE ... SET).")));
    }
    if (refused == QuotaCheck::kRoleQuota) {
        ereport(ERROR, (errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
                        errmsg("role \"%s\" holds its quota of pg_throttle registry entries",
                               role_name_or_oid(role, buffer, sizeof buffer)),
                        errdetail("A role may hold %lld entries (pg_throttle.role_quota = %d%% of "
                                  "pg_throttle.max_entries).",
                                  static_cast<long long>(quota_role_limit()), role_quota_percent),
                        errhint("Let entries expire, reset them, or have a superuser raise "
                                "pg_throttle.role_quota for this role (ALTER ROLE ... SET).")));
    }
    const char* database = get_database_name(db);
    ereport(ERROR,
            (errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
             errmsg("database \"%s\" holds its quota of pg_throttle registry entries",
                    database != nullptr ? database : "?"),
             errdetail("A database may hold %lld entries (pg_throttle.database_quota = %d%% of "
                       "pg_throttle.max_entries).",
                       static_cast<long long>(quota_database_limit()), database_quota_percent),
             errhint("Let entries expire, reset them, or have a superuser raise "
                     "pg_throttle.database_quota for this database (ALTER DATABASE ... SET).")));
    pg_unreachable();
}

int64 quota_usage(QuotaUsage* rows, int64 capacity) {
    // In chunks, the lock released between them: entries are created (and
    // the counts changed) under it while a partition lock is held, and a
    // table holds 1.5 slots per registry entry.
    constexpr uint32 kChunk = 4096;
    int64 count = 0;
    for (int table = 0; table < 2; table++) {
        const core::OwnerCount* counts = table == 0 ? role_counts : database_counts;
        for (uint32 start = 0; start < shared->capacity; start += kChunk) {
            const uint32 end = std::min(shared->capacity, start + kChunk);
            LWLockAcquire(counts_lock, LW_SHARED);
            for (uint32 i = start; i < end; i++) {
                if (counts[i].owner == 0) {
                    continue;
                }
                if (count < capacity) {
                    rows[count] = QuotaUsage{table == 0, counts[i].owner, counts[i].count};
                }
                count++;
            }
            LWLockRelease(counts_lock);
        }
    }
    return count;
}

int64 quota_role_limit() {
    return limit_of(role_quota_percent);
}

int64 quota_database_limit() {
    return limit_of(database_quota_percent);
}

int quota_server_percent(bool role) {
    return static_cast<int>(
        pg_atomic_read_u32(role ? &shared->server_role_percent : &shared->server_database_percent));
}

int64 quota_limit_of(int percent) {
    return limit_of(percent);
}

}  // namespace pg_throttle::pg
