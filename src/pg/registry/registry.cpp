#include "pg/registry/registry.hpp"
#include "pg/server/clock.hpp"

#include "pg/registry/quota.hpp"
#include "pg/registry/standby.hpp"

extern "C" {
#include "access/xlog.h"
}

namespace pg_throttle::pg {
namespace {

constexpr int kPartitions = 16;
constexpr int kWaitersLock = kPartitions;  // after the partition locks in the tranche
constexpr int kQuotaLock = kPartitions + 1;
constexpr int kTrancheLocks = kPartitions + 2;
constexpr const char* kTrancheName = "pg_throttle";

int max_entries = 100000;
int max_lease_seconds = 3600;
HTAB* registry = nullptr;

// The hash table's slots: pg_throttle.max_entries, and the room kept beside
// it for queue groups' leases (registry/quota.hpp counts both pools).
long table_size() {
    return static_cast<long>(max_entries + quota_group_lease_room(max_entries));
}
LWLockPadded* partition_locks = nullptr;

// One partition's own state, guarded by its lock.
struct PartitionState {
    dlist_head entries;  // every entry of the partition
    // No entry of the partition expires before this instant, so a reclaim
    // before it would find nothing. Lowered (under the partition's exclusive
    // lock) whenever an entry gets an earlier expiry; set by a reclaim to the
    // earliest expiry that survived it. Keeps a full registry from rescanning
    // every entry on every call.
    core::Micros reclaim_not_before;
    // Per kind, the grants and denials of entries dropped since the start
    // (and of calls decided on an entry never stored), so that the totals
    // of throttle.registry_metrics survive reclaim. Added to with __atomic
    // builtins: calls decided under the shared lock add to them too.
    uint64 retired_grants[kEntryKindCount];
    uint64 retired_denials[kEntryKindCount];
};

// Registry-wide state in shared memory.
struct RegistryShared {
    PartitionState partitions[kPartitions];
    // Per kind, after a crash: the restart time R; what was granted before
    // it is unknown, so an absent entry is born granted at R (registry.hpp).
    // kKnown while the kind's knowledge is complete.
    core::Micros unknown_since[kEntryKindCount];
    // Started as a standby (or from a backup): the first call after the
    // promotion forgets the standby's resources and buckets (registry.hpp).
    bool awaiting_promotion;
    // When a call refused by a quota last swept the registry (real clock):
    // a role that keeps asking beyond its quota sweeps at most every
    // kQuotaSweepEvery, not on every call.
    core::Micros last_quota_sweep;
    // When a call last used an entry of the test clock (real clock, to the
    // second): while one did within kTestClockQuiet, no real-clock sweep
    // drops a test clock's entry (registry_reclaimable).
    core::Micros last_test_clock_use;
};
static_assert(std::is_trivially_copyable_v<RegistryShared>);
RegistryShared* shared_state = nullptr;

constexpr core::Micros kKnown = std::numeric_limits<core::Micros>::min();
constexpr core::Micros kQuotaSweepEvery = 50'000;                                 // 50 ms
constexpr core::Micros kTestClockQuiet = core::Micros{600} * core::kUsPerSecond;  // 10 min
constexpr core::Micros kClearedKept = core::Micros{600} * core::kUsPerSecond;     // 10 min

// ilist.h's iteration macros assert types in a way C++ cannot compile: the
// list is walked here, and an entry found from its link by its offset.
RegistryEntry* entry_of(dlist_node* node) {
    return reinterpret_cast<RegistryEntry*>(reinterpret_cast<char*>(node) -
                                            offsetof(RegistryEntry, link));
}

// Calls `visit` for each entry of `list`; `visit` may remove the entry it is given.
template <typename Visit>
void for_each_entry(dlist_head* list, Visit visit) {
    dlist_node* node = list->head.next;
    while (node != &list->head) {
        dlist_node* next = node->next;
        visit(entry_of(node));
        node = next;
    }
}

int partition_of(uint32 hash) {
    return static_cast<int>(hash % kPartitions);
}

PartitionState& partition_state(int partition) {
    return shared_state->partitions[partition];
}

PartitionState& partition_state_of(const RegistryEntry& entry) {
    return partition_state(partition_of(get_hash_value(registry, &entry.key)));
}

// Under the entry's partition lock, shared or exclusive: the CAS keeps two
// holders of the shared lock from losing each other's lowering.
void lower_reclaim_not_before(PartitionState& partition, core::Micros at) {
    core::Micros seen = __atomic_load_n(&partition.reclaim_not_before, __ATOMIC_RELAXED);
    while (at < seen && !__atomic_compare_exchange_n(&partition.reclaim_not_before, &seen, at, true,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

// Whether the entry is timed by the test clock (EntryClock::kTest).
bool on_test_clock(const RegistryEntry& entry) {
    return entry.key.clock == static_cast<uint8>(EntryClock::kTest);
}

// When a real-clock sweep may first drop `entry` (registry_reclaimable): its
// expiry; for a test clock's entry, the end of the test clock's quiet period;
// for a resource or bucket that throttle.reset left free under a crash rule
// (registry_clear: never granted since, its granted_at the reset),
// kClearedKept after the reset, so that the name stays clear for that long
// whatever the pressure on the registry.
core::Micros reclaim_time(const RegistryEntry& entry) {
    if (on_test_clock(entry)) {
        return core::saturating_add(
            __atomic_load_n(&shared_state->last_test_clock_use, __ATOMIC_RELAXED), kTestClockQuiet);
    }
    const auto kind = static_cast<EntryKind>(entry.key.kind);
    if (entry.expires_at == kLongExpired && !entry.born &&
        (kind == EntryKind::kResource || entry_kind_is_bucket(kind))) {
        return core::saturating_add(entry.granted_at, kClearedKept);
    }
    return entry.expires_at;
}

// The clock of the entries this session makes and sees, for kinds that
// follow pg_throttle's clock.
uint8 session_clock() {
    return static_cast<uint8>(clock_is_test() ? EntryClock::kTest : EntryClock::kReal);
}

LWLock* partition_lock(uint32 hash) {
    return &partition_locks[partition_of(hash)].lock;
}

LWLock* partition_lock_at(int partition) {
    return &partition_locks[partition].lock;
}

// Holds one partition lock for a scope in which nothing raises an error.
// Error abort releases all LWLocks itself, hence the LWLockHeldByMe check.
class PartitionLock {
public:
    PartitionLock(LWLock* lock, LWLockMode mode) : lock_(lock) { LWLockAcquire(lock_, mode); }
    PartitionLock(const PartitionLock&) = delete;
    PartitionLock& operator=(const PartitionLock&) = delete;
    ~PartitionLock() { release(); }
    void release() {
        if (LWLockHeldByMe(lock_)) {
            LWLockRelease(lock_);
        }
    }

private:
    LWLock* lock_;
};

void lock_all_partitions(LWLockMode mode) {
    for (int i = 0; i < kPartitions; i++) {
        LWLockAcquire(&partition_locks[i].lock, mode);
    }
}

void unlock_all_partitions() {
    for (int i = kPartitions - 1; i >= 0; i--) {
        LWLockRelease(&partition_locks[i].lock);
    }
}

// The empty state (registry.hpp): free for every kind, owned by nobody. The
// key and the partition link stay.
void clear_state(RegistryEntry* entry) {
    memset(reinterpret_cast<char*>(entry) + kEntryStateOffset, 0,
           sizeof(RegistryEntry) - kEntryStateOffset);
    entry->expires_at = kLongExpired;
}

// clear_state for an entry that stays in the table: its owner keeps paying
// for it, and its grants and denials go on counting.
void clear_state_keeping_owner(RegistryEntry* entry) {
    const Oid owner = entry->owner;
    const uint64 grants = entry->grants;
    const uint64 denials = entry->denials;
    clear_state(entry);
    entry->owner = owner;
    entry->grants = grants;
    entry->denials = denials;
}

// Adds the entry just entered in the hash table to its partition (whose
// exclusive lock the caller holds, or the postmaster alone).
void link_entry(PartitionState& partition, RegistryEntry* entry) {
    dlist_push_tail(&partition.entries, &entry->link);
}

// A kind as an index of the per-kind arrays (0, unused, for a value no
// EntryKind has).
int kind_index(const RegistryKey& key) {
    return key.kind < kEntryKindCount ? key.kind : 0;
}

// Keeps the counters of an entry that is about to be dropped, or of a copy
// that a call was decided on without storing it (registry_metrics).
// A call that counted nothing (a peek) writes nothing: the partition's
// counters are shared by every backend, and peeks of absent keys are hot.
void retire_counters(PartitionState& partition, const RegistryEntry& entry) {
    const int kind = kind_index(entry.key);
    const uint64 grants = __atomic_load_n(&entry.grants, __ATOMIC_RELAXED);
    const uint64 denials = __atomic_load_n(&entry.denials, __ATOMIC_RELAXED);
    if (grants != 0) {
        __atomic_fetch_add(&partition.retired_grants[kind], grants, __ATOMIC_RELAXED);
    }
    if (denials != 0) {
        __atomic_fetch_add(&partition.retired_denials[kind], denials, __ATOMIC_RELAXED);
    }
}

// Queue groups' leases have room of their own, with a per-role share of it
// (registry/quota.hpp); every other kind shares pg_throttle.max_entries.
QuotaPool pool_of(const RegistryKey& key) {
    return key.kind == static_cast<uint8>(EntryKind::kQueueGroup) ? QuotaPool::kGroupLeases
                                                                  : QuotaPool::kShared;
}

// Drops an entry of `partition`: from its list, its owner's and database's
// counts and the hash table, keeping its counters. The caller holds the
// partition's exclusive lock.
void remove_entry(PartitionState& partition, RegistryEntry* entry) {
    retire_counters(partition, *entry);
    dlist_delete(&entry->link);
    quota_uncharge(pool_of(entry->key), entry->owner, entry->key.dbid);
    hash_search(registry, &entry->key, HASH_REMOVE, nullptr);
}

// After a callback that may have handed a lock to another role.
void settle_owner(const RegistryEntry& entry, Oid owner_before) {
    if (entry.owner != owner_before) {
        quota_move(pool_of(entry.key), owner_before, entry.owner);
    }
}

// Written at most once a second: tests are not a hot path, but many
// sessions may run them at once.
void note_test_clock_use() {
    const core::Micros now = GetCurrentTimestamp();
    if (now - __atomic_load_n(&shared_state->last_test_clock_use, __ATOMIC_RELAXED) >=
        core::kUsPerSecond) {
        __atomic_store_n(&shared_state->last_test_clock_use, now, __ATOMIC_RELAXED);
    }
}

// Drops every entry of one partition that no longer constrains anyone, by
// the real clock: whatever clock the calling session reads, another
// session's entry is dropped only when it has expired in real time. A test
// clock's entries, which the real clock cannot judge, are dropped only by a
// session on the test clock (`test_now`), by its clock. Holds that
// partition's lock only. Returns how many.
long reclaim_partition(int index, core::Micros now, std::optional<core::Micros> test_now) {
    PartitionState& partition = partition_state(index);
    if (!test_now.has_value() &&
        now < __atomic_load_n(&partition.reclaim_not_before, __ATOMIC_RELAXED)) {
        return 0;
    }
    long reclaimed = 0;
    LWLockAcquire(partition_lock_at(index), LW_EXCLUSIVE);
    if (test_now.has_value() || now >= partition.reclaim_not_before) {
        core::Micros earliest_survivor = core::kNever;
        for_each_entry(&partition.entries, [&](RegistryEntry* entry) {
            const bool reclaimable =
                (on_test_clock(*entry) && test_now.has_value() && *test_now >= entry->expires_at) ||
                registry_reclaimable(*entry, now);
            if (reclaimable) {
                remove_entry(partition, entry);
                reclaimed++;
            } else {
                earliest_survivor = std::min(earliest_survivor, reclaim_time(*entry));
            }
        });
        partition.reclaim_not_before = earliest_survivor;
    }
    LWLockRelease(partition_lock_at(index));
    return reclaimed;
}

// The sweep, when the table or a quota has no room: one partition at a time.
long reclaim_expired() {
    const core::Micros now = GetCurrentTimestamp();
    const std::optional<core::Micros> test_now =
        clock_is_test() ? std::optional<core::Micros>(clock_now()) : std::nullopt;
    long reclaimed = 0;
    for (int i = 0; i < kPartitions; i++) {
        reclaimed += reclaim_partition(i, now, test_now);
    }
    return reclaimed;
}

// The kind's crash rule, if its knowledge is incomplete (see EntryOp::born).
// A queue's bucket, and a group's, follow the rule of buckets.
std::optional<core::Micros> unknown_since_of(uint8 kind) {
    if (entry_kind_is_bucket(static_cast<EntryKind>(kind))) {
        kind = static_cast<uint8>(EntryKind::kBucket);
    }
    const core::Micros since = shared_state->unknown_since[kind];
    if (since == kKnown) {
        return std::nullopt;
    }
    return since;
}

// Whether `entry` was last granted before its key's shard moved to this node
// (a lock with backends queued for it is in use here, so never).
bool stale_after_move(const RegistryEntry& entry, core::Micros moved_in_at) {
    if (moved_in_at == kNeverMoved || entry.granted_at >= moved_in_at) {
        return false;
    }
    return entry.key.kind != static_cast<uint8>(EntryKind::kLock) || entry.of.lock.waiters == 0;
}

// Sets `entry` to the state its kind's rule gives a name unknown since
// `unknown_since` (EntryOp::born); throttle.status names the move rule when
// that is the one in force.
void bear(RegistryEntry* entry, const EntryOp& op, core::Micros unknown_since,
          core::Micros moved_in_at, void* ctx) {
    op.born(entry, unknown_since, ctx);
    entry->born = true;
    if (moved_in_at != kNeverMoved && moved_in_at == unknown_since) {
        strlcpy(entry->holder, "[unknown: granted before its shard moved here]",
                sizeof entry->holder);
    }
}

// 53200, with a hint naming pg_throttle.max_entries.
[[noreturn]] void raise_full(QuotaPool pool) {
    if (pool == QuotaPool::kGroupLeases) {
        ereport(ERROR,
                (errcode(ERRCODE_OUT_OF_MEMORY),
                 errmsg("pg_throttle registry is full of queue group leases"),
                 errdetail("All %lld entries kept for the leases of claimed groups are in force.",
                           static_cast<long long>(quota_group_lease_room(max_entries))),
                 errhint("Increase pg_throttle.max_entries (a tenth of it, at least 100, is kept "
                         "for group leases) and restart the server.")));
    }
    ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY),  // 53200, as "out of shared memory"
                    errmsg("pg_throttle registry is full"),
                    errdetail("All %d entries are in force; none can be reclaimed.", max_entries),
                    errhint("Increase pg_throttle.max_entries and restart the server.")));
    pg_unreachable();
}

enum class Attempt { kDone, kFull, kRoleQuota, kDatabaseQuota };

// Enters a new, free entry of `key` (clear_state) owned by `role`, counted
// against its pool and, with their limits, the quotas; the caller holds the
// partition's exclusive lock. nullptr, with the refusal in `refused`, when
// there is no room.
RegistryEntry* enter_entry(PartitionState& partition, const RegistryKey& key, uint32 hash, Oid role,
                           QuotaCheck* refused) {
    *refused = quota_charge(pool_of(key), role, key.dbid, true);
    if (*refused != QuotaCheck::kOk) {
        return nullptr;
    }
    auto* entry = static_cast<RegistryEntry*>(
        hash_search_with_hash_value(registry, &key, hash, HASH_ENTER_NULL, nullptr));
    if (entry == nullptr) {
        quota_uncharge(pool_of(key), role, key.dbid);
        *refused = QuotaCheck::kFull;
        return nullptr;
    }
    link_entry(partition, entry);
    clear_state(entry);
    entry->owner = role;
    return entry;
}

// One attempt: the shared read-only path, then the exclusive path.
Attempt try_apply(const RegistryKey& key, uint32 hash, Oid role, const EntryOp& op, void* ctx,
                  core::Micros moved_in_at) {
    LWLock* lock = partition_lock(hash);
    PartitionState& partition = partition_state(partition_of(hash));
    // A key whose shard moved here is known no better than after a crash at
    // the arrival (the caller's moved_in_at): the later of the two rules.
    std::optional<core::Micros> unknown_since = unknown_since_of(key.kind);
    if (moved_in_at != kNeverMoved) {
        unknown_since = std::max(unknown_since.value_or(moved_in_at), moved_in_at);
    }
    {
        PartitionLock shared(lock, LW_SHARED);
        auto* entry = static_cast<RegistryEntry*>(
            hash_search_with_hash_value(registry, &key, hash, HASH_FIND, nullptr));
        if (entry != nullptr && stale_after_move(*entry, moved_in_at)) {
            // Born again under the move rule: only under the exclusive lock.
        } else if (entry != nullptr) {
            if (op.decide_shared(entry, ctx)) {
                return Attempt::kDone;
            }
        } else if (!unknown_since.has_value()) {
            // Absent and nothing unknown: the entry would be born free, so
            // decide on a free entry; a call that must write one goes on
            // below. (An entry born under a crash rule is always stored.)
            RegistryEntry free_entry;
            free_entry.key = key;
            clear_state(&free_entry);
            if (op.decide_shared(&free_entry, ctx)) {
                retire_counters(partition, free_entry);
                return Attempt::kDone;
            }
        } else if (op.born != nullptr &&
                   (key.kind == static_cast<uint8>(EntryKind::kQueueBucket) ||
                    key.kind == static_cast<uint8>(EntryKind::kQueueGroupBucket))) {
            // A queue's or a group's bucket nobody has seen, under the crash
            // rule: it is born from unknown_since alone, which only ever moves
            // later, so a claim's look that needs no write (a peek, a take from
            // an empty bucket) decides on that born entry without storing it.
            // Otherwise every peek at a group's bucket after a crash would cost
            // the claiming role an entry of its quota.
            RegistryEntry born_entry;
            born_entry.key = key;
            clear_state(&born_entry);
            bear(&born_entry, op, *unknown_since, moved_in_at, ctx);
            if (op.decide_shared(&born_entry, ctx)) {
                retire_counters(partition, born_entry);
                return Attempt::kDone;
            }
        }
    }
    PartitionLock exclusive(lock, LW_EXCLUSIVE);
    auto* entry = static_cast<RegistryEntry*>(
        hash_search_with_hash_value(registry, &key, hash, HASH_FIND, nullptr));
    if (entry == nullptr) {
        QuotaCheck refused = QuotaCheck::kOk;
        entry = enter_entry(partition, key, hash, role, &refused);
        switch (refused) {
            case QuotaCheck::kRoleQuota:
                return Attempt::kRoleQuota;
            case QuotaCheck::kDatabaseQuota:
                return Attempt::kDatabaseQuota;
            case QuotaCheck::kFull:
                return Attempt::kFull;
            case QuotaCheck::kOk:
                break;
        }
        if (unknown_since.has_value() && op.born != nullptr) {
            bear(entry, op, *unknown_since, moved_in_at, ctx);
        }
        settle_owner(*entry, role);  // a lock born held by nobody known
    } else if (stale_after_move(*entry, moved_in_at) && op.born != nullptr) {
        // Left from before the key's shard moved away and back: what it says
        // was overtaken on the other node. Born again at the arrival,
        // keeping its owner (who pays for it) and its counters.
        const Oid owner = entry->owner;
        clear_state_keeping_owner(entry);
        bear(entry, op, *unknown_since, moved_in_at, ctx);
        settle_owner(*entry, owner);
    }
    const Oid owner_before = entry->owner;
    op.apply_exclusive(entry, ctx);
    settle_owner(*entry, owner_before);
    lower_reclaim_not_before(partition, reclaim_time(*entry));
    return Attempt::kDone;
}

}  // namespace

uint32 registry_key_hash(const void* key_ptr, Size /*keysize*/) {
    const auto* key = static_cast<const RegistryKey*>(key_ptr);
    uint32 h = hash_uint32(key->dbid);
    h = hash_combine(h, key->kind);
    h = hash_combine(h, key->clock);
    return hash_combine(
        h, hash_bytes(reinterpret_cast<const unsigned char*>(key->name), key->name_len));
}

int registry_key_compare(const void* a_ptr, const void* b_ptr, Size /*keysize*/) {
    const auto* a = static_cast<const RegistryKey*>(a_ptr);
    const auto* b = static_cast<const RegistryKey*>(b_ptr);
    if (a->dbid != b->dbid || a->kind != b->kind || a->clock != b->clock ||
        a->name_len != b->name_len) {
        return 1;
    }
    return memcmp(a->name, b->name, a->name_len);
}

const char* entry_kind_name(EntryKind kind) {
    switch (kind) {
        case EntryKind::kResource:
            return "resource";
        case EntryKind::kBucket:
            return "bucket";
        case EntryKind::kLock:
            return "lock";
        case EntryKind::kQueueGroup:
            return "group";
        case EntryKind::kQueueBucket:
            return "queue_bucket";
        case EntryKind::kQueueGroupBucket:
            return "group_bucket";
    }
    return "unknown";
}

bool entry_kind_follows_clock(EntryKind kind) {
    // Queue groups stand for throttle.event rows that every clock shares:
    // one key for both, or two workers could hold one group.
    return kind == EntryKind::kResource || entry_kind_is_bucket(kind);
}

void registry_define_gucs() {
    DefineCustomIntVariable(
        "pg_throttle.max_entries", "Most entries the shared-memory registry holds.",
        "Each resource, bucket or lock in force takes one entry. Set at server start.",
        &max_entries, 100000, 100, 50000000, PGC_POSTMASTER, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "pg_throttle.max_lease", "Longest ttl a lease may have.",
        "After a crash, a lock not known since the restart counts as leased until the restart "
        "plus this: a lease given before the crash cannot be handed to a second holder.",
        &max_lease_seconds, 3600, 1, INT_MAX, PGC_POSTMASTER, GUC_UNIT_S, nullptr, nullptr,
        nullptr);
    quota_define_gucs();
}

void registry_request_shmem() {
    RequestAddinShmemSpace(
        add_size(add_size(MAXALIGN(sizeof(RegistryShared)),
                          hash_estimate_size(table_size(), sizeof(RegistryEntry))),
                 quota_shmem_size(max_entries)));
    RequestNamedLWLockTranche(kTrancheName, kTrancheLocks);
}

void registry_attach_shmem() {
    HASHCTL info{};
    info.keysize = sizeof(RegistryKey);
    info.entrysize = sizeof(RegistryEntry);
    info.hash = registry_key_hash;
    info.match = registry_key_compare;
    info.num_partitions = kPartitions;
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    partition_locks = GetNamedLWLockTranche(kTrancheName);
    bool found = false;
    shared_state = static_cast<RegistryShared*>(
        ShmemInitStruct("pg_throttle registry state", sizeof(RegistryShared), &found));
    if (!found) {
        for (PartitionState& partition : shared_state->partitions) {
            dlist_init(&partition.entries);
            partition.reclaim_not_before = core::kNever;
            memset(partition.retired_grants, 0, sizeof(partition.retired_grants));
            memset(partition.retired_denials, 0, sizeof(partition.retired_denials));
        }
        for (core::Micros& since : shared_state->unknown_since) {
            since = kKnown;
        }
        shared_state->awaiting_promotion = false;
        shared_state->last_quota_sweep = 0;
    }
    registry =
        ShmemInitHash("pg_throttle registry", table_size(), table_size(), &info,
                      HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_PARTITION | HASH_FIXED_SIZE);
    quota_attach_shmem(max_entries, &partition_locks[kQuotaLock].lock);
    LWLockRelease(AddinShmemInitLock);
}

void registry_require() {
    if (registry == nullptr) {
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                 errmsg("pg_throttle must be loaded via shared_preload_libraries"),
                 errhint("Add pg_throttle to shared_preload_libraries in postgresql.conf and "
                         "restart the server.")));
    }
}

void registry_make_key(EntryKind kind, const char* name, size_t len, const char* what,
                       RegistryKey* key) {
    switch (core::check_name_length(len)) {
        case core::NameCheck::kEmpty:
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("%s name must not be empty", what)));
            break;
        case core::NameCheck::kTooLong:
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s name is too long", what),
                     errdetail("The name has %zu bytes; the limit is %zu bytes.", len,
                               core::kMaxNameBytes)));
            break;
        case core::NameCheck::kOk:
            break;
    }
    memset(key, 0, sizeof *key);
    key->dbid = MyDatabaseId;
    key->kind = static_cast<uint8>(kind);
    key->name_len = static_cast<uint8>(len);
    memcpy(key->name, name, len);
    key->clock =
        entry_kind_follows_clock(kind) ? session_clock() : static_cast<uint8>(EntryClock::kReal);
}

Oid registry_caller_role(EntryKind kind) {
    // The queue's kinds are made inside its SECURITY DEFINER functions: they
    // count for the session's role, not the extension's owner.
    const bool queue_kind = kind == EntryKind::kQueueGroup || kind == EntryKind::kQueueBucket ||
                            kind == EntryKind::kQueueGroupBucket;
    return queue_kind ? GetOuterUserId() : GetUserId();
}

void registry_apply(const RegistryKey& key, const EntryOp& op, void* ctx,
                    core::Micros moved_in_at) {
    // Only a standby (or a server no call has told of its promotion yet)
    // awaits its promotion, and only there may a call have to be refused: a
    // primary pays one load of the flag, as before.
    if (registry_awaiting_promotion()) {
        standby_check_local_decision(static_cast<EntryKind>(key.kind));
        registry_notice_promotion();
    }
    if (key.clock == static_cast<uint8>(EntryClock::kTest)) {
        note_test_clock_use();
    }
    const uint32 hash = get_hash_value(registry, &key);
    const Oid role = registry_caller_role(static_cast<EntryKind>(key.kind));
    Attempt attempt = try_apply(key, hash, role, op, ctx, moved_in_at);
    if (attempt == Attempt::kDone) {
        return;
    }
    // Expired entries, of this role and database among them, make room.
    // (Beyond a quota, at most one sweep per kQuotaSweepEvery.)
    bool sweep = true;
    if (attempt == Attempt::kRoleQuota || attempt == Attempt::kDatabaseQuota) {
        const core::Micros now = GetCurrentTimestamp();
        core::Micros last = __atomic_load_n(&shared_state->last_quota_sweep, __ATOMIC_RELAXED);
        sweep = now - last >= kQuotaSweepEvery &&
                __atomic_compare_exchange_n(&shared_state->last_quota_sweep, &last, now, false,
                                            __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    }
    if (sweep) {
        reclaim_expired();
        attempt = try_apply(key, hash, role, op, ctx, moved_in_at);
    }
    switch (attempt) {
        case Attempt::kDone:
            return;
        case Attempt::kFull:
            raise_full(pool_of(key));
        case Attempt::kRoleQuota:
            quota_raise(QuotaCheck::kRoleQuota, role, key.dbid, pool_of(key));
        case Attempt::kDatabaseQuota:
            quota_raise(QuotaCheck::kDatabaseQuota, role, key.dbid);
    }
}

void registry_update_existing(const RegistryKey& key,
                              void (*update)(RegistryEntry* entry, void* ctx), void* ctx,
                              core::Micros moved_in_at) {
    registry_notice_promotion();
    const uint32 hash = get_hash_value(registry, &key);
    PartitionLock exclusive(partition_lock(hash), LW_EXCLUSIVE);
    auto* entry = static_cast<RegistryEntry*>(
        hash_search_with_hash_value(registry, &key, hash, HASH_FIND, nullptr));
    // An entry left from before the key's shard moved here is no record of
    // what it holds now: as absent.
    if (entry != nullptr && !stale_after_move(*entry, moved_in_at)) {
        const Oid owner_before = entry->owner;
        update(entry, ctx);
        settle_owner(*entry, owner_before);
        lower_reclaim_not_before(partition_state(partition_of(hash)), reclaim_time(*entry));
    }
}

bool registry_upsert(const RegistryKey& key, void (*update)(RegistryEntry* entry, void* ctx),
                     void* ctx) {
    const uint32 hash = get_hash_value(registry, &key);
    PartitionState& partition = partition_state(partition_of(hash));
    for (int attempt = 0; attempt < 2; attempt++) {
        {
            PartitionLock exclusive(partition_lock(hash), LW_EXCLUSIVE);
            bool found = false;
            auto* entry = static_cast<RegistryEntry*>(
                hash_search_with_hash_value(registry, &key, hash, HASH_ENTER_NULL, &found));
            if (entry != nullptr) {
                if (!found) {
                    // What a primary knew, replayed: counted, never refused.
                    link_entry(partition, entry);
                    clear_state(entry);
                    (void)quota_charge(pool_of(key), InvalidOid, key.dbid, false);
                }
                const Oid owner_before = entry->owner;
                update(entry, ctx);
                settle_owner(*entry, owner_before);
                lower_reclaim_not_before(partition, reclaim_time(*entry));
                return true;
            }
        }
        reclaim_expired();
    }
    return false;
}

bool registry_reclaimable(const RegistryEntry& entry, core::Micros now) {
    if (on_test_clock(entry)) {
        // Whatever its time on the test clock: no test has used that clock
        // for kTestClockQuiet (none since the server started, after a restart).
        return now >= reclaim_time(entry);
    }
    if (now < reclaim_time(entry)) {
        return false;
    }
    const auto kind = static_cast<EntryKind>(entry.key.kind);
    const bool lock_kind = kind == EntryKind::kLock || kind == EntryKind::kQueueGroup;
    return !lock_kind || entry.of.lock.waiters == 0;  // a waiter's entry stays
}

void registry_visit_all(void (*visit)(const RegistryEntry& entry, void* ctx), void* ctx) {
    for (PartitionState& partition : shared_state->partitions) {
        for_each_entry(&partition.entries, [&](RegistryEntry* entry) { visit(*entry, ctx); });
    }
}

bool registry_restore(const RegistryEntry& saved) {
    // Beyond its pool's room an entry would take the room of another pool
    // (the hash table holds both): it is not restored, and falls under the
    // crash rule like any other that does not fit.
    if (quota_pool_full(pool_of(saved.key)) &&
        hash_search(registry, &saved.key, HASH_FIND, nullptr) == nullptr) {
        return false;
    }
    bool found = false;
    auto* entry =
        static_cast<RegistryEntry*>(hash_search(registry, &saved.key, HASH_ENTER_NULL, &found));
    if (entry == nullptr) {
        return false;
    }
    PartitionState& partition = partition_state_of(*entry);
    if (found) {
        quota_uncharge(pool_of(entry->key), entry->owner, entry->key.dbid);
    } else {
        link_entry(partition, entry);
    }
    memcpy(reinterpret_cast<char*>(entry) + kEntryStateOffset,
           reinterpret_cast<const char*>(&saved) + kEntryStateOffset,
           sizeof(RegistryEntry) - kEntryStateOffset);
    (void)quota_charge(pool_of(entry->key), entry->owner, entry->key.dbid, false);
    lower_reclaim_not_before(partition, reclaim_time(*entry));
    return true;
}

int64 registry_entry_count() {
    return hash_get_num_entries(registry);
}

int64 registry_capacity(EntryKind kind) {
    return kind == EntryKind::kQueueGroup ? quota_group_lease_room(max_entries) : max_entries;
}

bool registry_remove(const RegistryKey& key) {
    registry_notice_promotion();
    const uint32 hash = get_hash_value(registry, &key);
    PartitionLock exclusive(partition_lock(hash), LW_EXCLUSIVE);
    auto* entry = static_cast<RegistryEntry*>(
        hash_search_with_hash_value(registry, &key, hash, HASH_FIND, nullptr));
    if (entry == nullptr) {
        return false;
    }
    remove_entry(partition_state(partition_of(hash)), entry);
    return true;
}

namespace {

ClearResult clear_once(const RegistryKey& key, bool create_if_absent, QuotaCheck* refused) {
    const uint32 hash = get_hash_value(registry, &key);
    const bool rule = unknown_since_of(key.kind).has_value();
    const Oid role = GetUserId();
    ClearResult result = ClearResult::kAbsent;
    {
        PartitionLock exclusive(partition_lock(hash), LW_EXCLUSIVE);
        PartitionState& partition = partition_state(partition_of(hash));
        auto* entry = static_cast<RegistryEntry*>(
            hash_search_with_hash_value(registry, &key, hash, HASH_FIND, nullptr));
        const bool lock_kind = key.kind == static_cast<uint8>(EntryKind::kLock) ||
                               key.kind == static_cast<uint8>(EntryKind::kQueueGroup);
        if (entry != nullptr && lock_kind) {
            // A lock's entry is lock_reset's alone: by now it may be held
            // again, or have waiters.
            return ClearResult::kAbsent;
        }
        if (entry != nullptr && !rule) {
            remove_entry(partition, entry);
            return ClearResult::kCleared;
        }
        if (entry == nullptr && !(rule && create_if_absent)) {
            return ClearResult::kAbsent;
        }
        if (entry == nullptr) {
            // Counted against the operator's role, within its quotas.
            entry = enter_entry(partition, key, hash, role, refused);
            if (entry == nullptr) {
                return ClearResult::kNoRoom;
            }
            result = ClearResult::kMadeFree;
        } else {
            // Known free from now on, not born: the rule does not bring it
            // back. Its owner keeps paying for it; its counters stay.
            clear_state_keeping_owner(entry);
            result = ClearResult::kCleared;
        }
        entry->granted_at = GetCurrentTimestamp();
        // A sweep for room may take it kClearedKept from now.
        lower_reclaim_not_before(partition, reclaim_time(*entry));
    }
    return result;
}

}  // namespace

ClearResult registry_clear(const RegistryKey& key, bool create_if_absent, QuotaCheck* refused) {
    // Its caller noticed the promotion (registry.hpp): not here, where the
    // checkpoint's file lock may be held.
    ClearResult result = clear_once(key, create_if_absent, refused);
    if (result == ClearResult::kNoRoom) {
        // As registry_apply: expired entries make room, then once more.
        reclaim_expired();
        result = clear_once(key, create_if_absent, refused);
    }
    return result;
}

void registry_raise_no_room(QuotaCheck refused) {
    Assert(refused != QuotaCheck::kOk);
    if (refused == QuotaCheck::kFull) {
        raise_full(QuotaPool::kShared);
    }
    quota_raise(refused, GetUserId(), MyDatabaseId);
}

void registry_mark_unknown_since(EntryKind kind, core::Micros restart) {
    shared_state->unknown_since[static_cast<uint8>(kind)] = restart;
}

std::optional<core::Micros> registry_unknown_since(EntryKind kind) {
    return unknown_since_of(static_cast<uint8>(kind));
}

core::Micros registry_max_lease() {
    return max_lease_seconds * core::kUsPerSecond;
}

LWLock* registry_waiters_lock() {
    return &partition_locks[kWaitersLock].lock;
}

LWLock* registry_partition_lock(const RegistryKey& key) {
    return partition_lock(get_hash_value(registry, &key));
}

namespace {

bool in_force(const RegistryEntry& entry, Oid dbid, core::Micros now, core::Micros real_now) {
    // throttle.lock's locks expire by the real clock, whatever the
    // session's clock says (locks.cpp).
    const bool real_time = static_cast<EntryKind>(entry.key.kind) == EntryKind::kLock;
    return (dbid == InvalidOid || entry.key.dbid == dbid) &&
           (real_time ? real_now : now) < entry.expires_at;
}

// Under each partition's shared lock in turn; `visit` may not raise.
void scan_partitions(Oid dbid, bool live_only, core::Micros now,
                     void (*visit)(const RegistryEntry& entry, void* ctx), void* ctx) {
    const core::Micros real_now = GetCurrentTimestamp();
    for (int i = 0; i < kPartitions; i++) {
        PartitionLock shared(partition_lock_at(i), LW_SHARED);
        for_each_entry(&partition_state(i).entries, [&](RegistryEntry* entry) {
            if (!live_only || in_force(*entry, dbid, now, real_now)) {
                visit(*entry, ctx);
            }
        });
    }
}

}  // namespace

void registry_scan(core::Micros now, void (*visit)(const RegistryEntry& entry, void* ctx),
                   void* ctx) {
    registry_notice_promotion();
    const core::Micros real_now = GetCurrentTimestamp();
    // One partition at a time: its entries of this database in force are
    // copied under its shared lock into memory allocated with no lock held
    // (when they do not fit, counted meanwhile, the copy is made again into
    // more) and visited once it is released. Memory follows what this
    // database shows, not what the partition holds for every database.
    int64 capacity = 64;
    auto* copies = static_cast<RegistryEntry*>(palloc(capacity * sizeof(RegistryEntry)));
    // A session sees the entries of its own clock (EntryClock): a test's
    // resources and buckets are not the real clock's, nor the other way round.
    const uint8 clock = session_clock();
    const auto matches = [&](const RegistryEntry& entry) {
        const bool own_clock = !entry_kind_follows_clock(static_cast<EntryKind>(entry.key.kind)) ||
                               entry.key.clock == clock;
        return own_clock && in_force(entry, MyDatabaseId, now, real_now);
    };
    for (int i = 0; i < kPartitions; i++) {
        PartitionState& partition = partition_state(i);
        int64 copied = 0;
        for (;;) {
            int64 needed = 0;
            LWLockAcquire(partition_lock_at(i), LW_SHARED);
            for_each_entry(&partition.entries, [&](RegistryEntry* entry) {
                if (matches(*entry)) {
                    if (needed < capacity) {
                        copies[needed] = *entry;
                    }
                    needed++;
                }
            });
            LWLockRelease(partition_lock_at(i));
            if (needed <= capacity) {
                copied = needed;
                break;
            }
            pfree(copies);
            capacity = needed + needed / 4 + 16;
            copies = static_cast<RegistryEntry*>(
                palloc_extended(capacity * sizeof(RegistryEntry), MCXT_ALLOC_HUGE));
        }
        for (int64 j = 0; j < copied; j++) {
            visit(copies[j], ctx);
        }
    }
    pfree(copies);
}

void registry_scan_all(core::Micros now, void (*visit)(const RegistryEntry& entry, void* ctx),
                       void* ctx) {
    scan_partitions(InvalidOid, true, now, visit, ctx);
}

void registry_scan_every(void (*visit)(const RegistryEntry& entry, void* ctx), void* ctx) {
    scan_partitions(InvalidOid, false, 0, visit, ctx);
}

void registry_await_promotion() {
    shared_state->awaiting_promotion = true;
}

bool registry_awaiting_promotion() {
    return __atomic_load_n(&shared_state->awaiting_promotion, __ATOMIC_ACQUIRE);
}

void registry_notice_promotion() {
    if (!__atomic_load_n(&shared_state->awaiting_promotion, __ATOMIC_ACQUIRE) ||
        RecoveryInProgress()) {
        return;
    }
    bool forgot = false;
    lock_all_partitions(LW_EXCLUSIVE);
    if (shared_state->awaiting_promotion) {
        // The resources and buckets this server granted as a standby say
        // nothing of what the old primary granted: forget them and count
        // those kinds as granted now, as after a crash. Its locks are the
        // primary's leases, replayed from WAL; they stay.
        const core::Micros now = GetCurrentTimestamp();
        for (PartitionState& partition : shared_state->partitions) {
            for_each_entry(&partition.entries, [&](RegistryEntry* entry) {
                const auto kind = static_cast<EntryKind>(entry->key.kind);
                if (kind == EntryKind::kResource || entry_kind_is_bucket(kind)) {
                    remove_entry(partition, entry);
                }
            });
        }
        shared_state->unknown_since[static_cast<uint8>(EntryKind::kResource)] = now;
        shared_state->unknown_since[static_cast<uint8>(EntryKind::kBucket)] = now;
        // Locks keep the rule they have: a lease the standby could not know
        // was granted before its start (later ones reach it through WAL, or
        // it says so itself), so it ends before the rule's end.
        __atomic_store_n(&shared_state->awaiting_promotion, false, __ATOMIC_RELEASE);
        forgot = true;
    }
    unlock_all_partitions();
    if (forgot) {
        ereport(LOG, (errmsg("pg_throttle noticed the promotion: resources and buckets not known "
                             "since now count as granted now; leases stay as replayed")));
    }
}

void registry_metrics(RegistryKindMetrics* kinds) {
    registry_notice_promotion();
    memset(kinds, 0, sizeof(RegistryKindMetrics) * kEntryKindCount);
    const core::Micros real_now = GetCurrentTimestamp();
    for (int i = 0; i < kPartitions; i++) {
        PartitionState& partition = partition_state(i);
        PartitionLock shared(partition_lock_at(i), LW_SHARED);
        for (int kind = 0; kind < kEntryKindCount; kind++) {
            kinds[kind].grants +=
                __atomic_load_n(&partition.retired_grants[kind], __ATOMIC_RELAXED);
            kinds[kind].denials +=
                __atomic_load_n(&partition.retired_denials[kind], __ATOMIC_RELAXED);
        }
        for_each_entry(&partition.entries, [&](RegistryEntry* entry) {
            const auto kind = static_cast<EntryKind>(entry->key.kind);
            RegistryKindMetrics& totals = kinds[kind_index(entry->key)];
            totals.entries++;
            // In force by the real clock: a test clock is one session's.
            totals.in_force += real_now < entry->expires_at ? 1 : 0;
            totals.grants += __atomic_load_n(&entry->grants, __ATOMIC_RELAXED);
            totals.denials += __atomic_load_n(&entry->denials, __ATOMIC_RELAXED);
            if (kind == EntryKind::kLock || kind == EntryKind::kQueueGroup) {
                totals.waiters += __atomic_load_n(&entry->of.lock.waiters, __ATOMIC_RELAXED);
            }
        });
    }
}

}  // namespace pg_throttle::pg
