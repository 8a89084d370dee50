#include "pg/registry.hpp"

extern "C" {
#include "access/xlog.h"
}

namespace pg_throttle::pg {
namespace {

constexpr int kPartitions = 16;
constexpr int kWaitersLock = kPartitions;  // after the partition locks in the tranche
constexpr const char* kTrancheName = "pg_throttle";

int max_entries = 100000;
int max_lease_seconds = 3600;
HTAB* registry = nullptr;
LWLockPadded* partition_locks = nullptr;

// Registry-wide state in shared memory.
struct RegistryShared {
    // No entry expires before this instant, so a reclaim before it would find
    // nothing. Lowered (under a partition's exclusive lock) whenever an entry
    // gets an earlier expiry; set by a reclaim (under every partition's lock)
    // to the earliest expiry that survived it. Keeps a full registry from
    // rescanning every entry on every call.
    core::Micros reclaim_not_before;
    // Per kind, after a crash: the restart time R; what was granted before
    // it is unknown, so an absent entry is born granted at R (registry.hpp).
    // kKnown while the kind's knowledge is complete.
    core::Micros unknown_since[kEntryKindCount];
    // Started as a standby (or from a backup): the first call after the
    // promotion forgets the standby's resources and buckets (registry.hpp).
    bool awaiting_promotion;
};
static_assert(std::is_trivially_copyable_v<RegistryShared>);
RegistryShared* shared_state = nullptr;

constexpr core::Micros kKnown = std::numeric_limits<core::Micros>::min();

void lower_reclaim_not_before(core::Micros expires_at) {
    core::Micros seen = __atomic_load_n(&shared_state->reclaim_not_before, __ATOMIC_RELAXED);
    while (expires_at < seen &&
           !__atomic_compare_exchange_n(&shared_state->reclaim_not_before, &seen, expires_at, true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

uint32 key_hash(const void* key_ptr, Size /*keysize*/) {
    const auto* key = static_cast<const RegistryKey*>(key_ptr);
    uint32 h = hash_uint32(key->dbid);
    h = hash_combine(h, key->kind);
    return hash_combine(
        h, hash_bytes(reinterpret_cast<const unsigned char*>(key->name), key->name_len));
}

int key_compare(const void* a_ptr, const void* b_ptr, Size /*keysize*/) {
    const auto* a = static_cast<const RegistryKey*>(a_ptr);
    const auto* b = static_cast<const RegistryKey*>(b_ptr);
    if (a->dbid != b->dbid || a->kind != b->kind || a->name_len != b->name_len) {
        return 1;
    }
    return memcmp(a->name, b->name, a->name_len);
}

LWLock* partition_lock(uint32 hash) {
    return &partition_locks[hash % kPartitions].lock;
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

// Drops every entry that no longer constrains anyone, by the real clock:
// whatever clock the calling session reads, another session's entry is
// dropped only when it has expired in real time. Returns how many.
long reclaim_expired() {
    const core::Micros now = GetCurrentTimestamp();
    long reclaimed = 0;
    lock_all_partitions(LW_EXCLUSIVE);
    if (now >= shared_state->reclaim_not_before) {
        core::Micros earliest_survivor = core::kNever;
        HASH_SEQ_STATUS scan;
        hash_seq_init(&scan, registry);
        while (auto* entry = static_cast<RegistryEntry*>(hash_seq_search(&scan))) {
            if (registry_reclaimable(*entry, now)) {
                hash_search(registry, &entry->key, HASH_REMOVE, nullptr);
                reclaimed++;
            } else if (entry->expires_at < earliest_survivor) {
                earliest_survivor = entry->expires_at;
            }
        }
        shared_state->reclaim_not_before = earliest_survivor;
    }
    unlock_all_partitions();
    return reclaimed;
}

// The empty state (registry.hpp): free for every kind.
void clear_state(RegistryEntry* entry) {
    memset(reinterpret_cast<char*>(entry) + sizeof(RegistryKey), 0,
           sizeof(RegistryEntry) - sizeof(RegistryKey));
    entry->expires_at = kLongExpired;
}

// The kind's crash rule, if its knowledge is incomplete (see EntryOp::born).
std::optional<core::Micros> unknown_since_of(uint8 kind) {
    const core::Micros since = shared_state->unknown_since[kind];
    if (since == kKnown) {
        return std::nullopt;
    }
    return since;
}

// One attempt: the shared read-only path, then the exclusive path.
bool try_apply(const RegistryKey& key, uint32 hash, const EntryOp& op, void* ctx) {
    LWLock* lock = partition_lock(hash);
    const std::optional<core::Micros> unknown_since = unknown_since_of(key.kind);
    {
        PartitionLock shared(lock, LW_SHARED);
        auto* entry = static_cast<RegistryEntry*>(
            hash_search_with_hash_value(registry, &key, hash, HASH_FIND, nullptr));
        if (entry != nullptr) {
            if (op.decide_shared(entry, ctx)) {
                return true;
            }
        } else if (!unknown_since.has_value()) {
            // Absent and nothing unknown: the entry would be born free, so
            // decide on a free entry; a call that must write one goes on
            // below. (An entry born under a crash rule is always stored.)
            RegistryEntry free_entry;
            free_entry.key = key;
            clear_state(&free_entry);
            if (op.decide_shared(&free_entry, ctx)) {
                return true;
            }
        }
    }
    PartitionLock exclusive(lock, LW_EXCLUSIVE);
    bool found = false;
    auto* entry = static_cast<RegistryEntry*>(
        hash_search_with_hash_value(registry, &key, hash, HASH_ENTER_NULL, &found));
    if (entry == nullptr) {
        return false;
    }
    if (!found) {
        clear_state(entry);
        if (unknown_since.has_value() && op.born != nullptr) {
            op.born(entry, *unknown_since, ctx);
            entry->born = true;
        }
    }
    op.apply_exclusive(entry, ctx);
    lower_reclaim_not_before(entry->expires_at);
    return true;
}

}  // namespace

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
    }
    return "unknown";
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
}

void registry_request_shmem() {
    RequestAddinShmemSpace(add_size(MAXALIGN(sizeof(RegistryShared)),
                                    hash_estimate_size(max_entries, sizeof(RegistryEntry))));
    RequestNamedLWLockTranche(kTrancheName, kPartitions + 1);
}

void registry_attach_shmem() {
    HASHCTL info{};
    info.keysize = sizeof(RegistryKey);
    info.entrysize = sizeof(RegistryEntry);
    info.hash = key_hash;
    info.match = key_compare;
    info.num_partitions = kPartitions;
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    partition_locks = GetNamedLWLockTranche(kTrancheName);
    bool found = false;
    shared_state = static_cast<RegistryShared*>(
        ShmemInitStruct("pg_throttle registry state", sizeof(RegistryShared), &found));
    if (!found) {
        shared_state->reclaim_not_before = core::kNever;
        for (core::Micros& since : shared_state->unknown_since) {
            since = kKnown;
        }
        shared_state->awaiting_promotion = false;
    }
    registry =
        ShmemInitHash("pg_throttle registry", max_entries, max_entries, &info,
                      HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_PARTITION | HASH_FIXED_SIZE);
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
}

ApplyResult registry_apply(const RegistryKey& key, const EntryOp& op, void* ctx) {
    registry_notice_promotion();
    const uint32 hash = get_hash_value(registry, &key);
    if (try_apply(key, hash, op, ctx)) {
        return ApplyResult::kDone;
    }
    reclaim_expired();
    return try_apply(key, hash, op, ctx) ? ApplyResult::kDone : ApplyResult::kFull;
}

void registry_update_existing(const RegistryKey& key,
                              void (*update)(RegistryEntry* entry, void* ctx), void* ctx) {
    registry_notice_promotion();
    const uint32 hash = get_hash_value(registry, &key);
    PartitionLock exclusive(partition_lock(hash), LW_EXCLUSIVE);
    auto* entry = static_cast<RegistryEntry*>(
        hash_search_with_hash_value(registry, &key, hash, HASH_FIND, nullptr));
    if (entry != nullptr) {
        update(entry, ctx);
        lower_reclaim_not_before(entry->expires_at);
    }
}

bool registry_upsert(const RegistryKey& key, void (*update)(RegistryEntry* entry, void* ctx),
                     void* ctx) {
    const uint32 hash = get_hash_value(registry, &key);
    for (int attempt = 0; attempt < 2; attempt++) {
        {
            PartitionLock exclusive(partition_lock(hash), LW_EXCLUSIVE);
            bool found = false;
            auto* entry = static_cast<RegistryEntry*>(
                hash_search_with_hash_value(registry, &key, hash, HASH_ENTER_NULL, &found));
            if (entry != nullptr) {
                if (!found) {
                    clear_state(entry);
                }
                update(entry, ctx);
                lower_reclaim_not_before(entry->expires_at);
                return true;
            }
        }
        reclaim_expired();
    }
    return false;
}

bool registry_reclaimable(const RegistryEntry& entry, core::Micros now) {
    if (now < entry.expires_at) {
        return false;
    }
    return static_cast<EntryKind>(entry.key.kind) != EntryKind::kLock || entry.of.lock.waiters == 0;
}

void registry_for_each_exclusive(void (*visit)(RegistryEntry* entry, void* ctx), void* ctx) {
    lock_all_partitions(LW_EXCLUSIVE);
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, registry);
    while (auto* entry = static_cast<RegistryEntry*>(hash_seq_search(&scan))) {
        visit(entry, ctx);
        lower_reclaim_not_before(entry->expires_at);
    }
    unlock_all_partitions();
}

void registry_visit_all(void (*visit)(const RegistryEntry& entry, void* ctx), void* ctx) {
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, registry);
    while (const auto* entry = static_cast<const RegistryEntry*>(hash_seq_search(&scan))) {
        visit(*entry, ctx);
    }
}

bool registry_restore(const RegistryEntry& saved) {
    bool found = false;
    auto* entry =
        static_cast<RegistryEntry*>(hash_search(registry, &saved.key, HASH_ENTER_NULL, &found));
    if (entry == nullptr) {
        return false;
    }
    *entry = saved;
    lower_reclaim_not_before(entry->expires_at);
    return true;
}

int64 registry_entry_count() {
    return hash_get_num_entries(registry);
}

bool registry_remove(const RegistryKey& key) {
    registry_notice_promotion();
    const uint32 hash = get_hash_value(registry, &key);
    PartitionLock exclusive(partition_lock(hash), LW_EXCLUSIVE);
    return hash_search_with_hash_value(registry, &key, hash, HASH_REMOVE, nullptr) != nullptr;
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

void registry_raise_full() {
    ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY),  // 53200, as "out of shared memory"
                    errmsg("pg_throttle registry is full"),
                    errdetail("All %d entries are in force; none can be reclaimed.", max_entries),
                    errhint("Increase pg_throttle.max_entries and restart the server.")));
    pg_unreachable();
}

namespace {

void scan_live(Oid dbid, core::Micros now, void (*visit)(const RegistryEntry& entry, void* ctx),
               void* ctx) {
    // throttle.lock's locks expire by the real clock, whatever the
    // session's clock says (locks.cpp).
    const core::Micros real_now = GetCurrentTimestamp();
    // No RAII here: `visit` may raise an error, and error abort releases the locks.
    lock_all_partitions(LW_SHARED);
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, registry);
    while (const auto* entry = static_cast<const RegistryEntry*>(hash_seq_search(&scan))) {
        const auto kind = static_cast<EntryKind>(entry->key.kind);
        const bool real_time = kind == EntryKind::kLock;
        if ((dbid == InvalidOid || entry->key.dbid == dbid) &&
            (real_time ? real_now : now) < entry->expires_at) {
            visit(*entry, ctx);
        }
    }
    unlock_all_partitions();
}

}  // namespace

void registry_scan(core::Micros now, void (*visit)(const RegistryEntry& entry, void* ctx),
                   void* ctx) {
    registry_notice_promotion();
    scan_live(MyDatabaseId, now, visit, ctx);
}

void registry_scan_all(core::Micros now, void (*visit)(const RegistryEntry& entry, void* ctx),
                       void* ctx) {
    scan_live(InvalidOid, now, visit, ctx);
}

void registry_scan_every(void (*visit)(const RegistryEntry& entry, void* ctx), void* ctx) {
    lock_all_partitions(LW_SHARED);
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, registry);
    while (const auto* entry = static_cast<const RegistryEntry*>(hash_seq_search(&scan))) {
        visit(*entry, ctx);
    }
    unlock_all_partitions();
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
        HASH_SEQ_STATUS scan;
        hash_seq_init(&scan, registry);
        while (auto* entry = static_cast<RegistryEntry*>(hash_seq_search(&scan))) {
            const auto kind = static_cast<EntryKind>(entry->key.kind);
            if (kind == EntryKind::kResource || kind == EntryKind::kBucket) {
                hash_search(registry, &entry->key, HASH_REMOVE, nullptr);
            }
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

}  // namespace pg_throttle::pg
