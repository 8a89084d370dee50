// The shared-memory registry: one hash table of entries keyed by
// (database, kind, name), split into partitions that each have an LWLock.
// Each partition also keeps a list of its entries, so that a scan (status,
// checkpoint, sweep) holds one partition's lock at a time, never all of them.
//
// An entry whose expires_at has passed constrains nobody and is equivalent to
// an absent one; such entries are reclaimed when the table needs room.
//
// Every entry counts against its database and its owner role, which may hold
// at most their quotas of the registry, except a queue group's lease, which
// has room of its own beside it (registry/quota.hpp).
#pragma once

#include "core/names.hpp"
#include "core/time_math.hpp"
#include "pg/registry/quota.hpp"

#include <limits>
#include <optional>
#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// Each consumer of the registry has its own kind in the key, so that no name
// a caller passes can reach another kind's entries.
enum class EntryKind : uint8 {
    kResource = 1,          // throttle.acquire
    kBucket = 2,            // throttle.take, allow, wait
    kLock = 3,              // throttle.lock, unlock, renew
    kQueueGroup = 4,        // the lease that holds a group of the event queue
    kQueueBucket = 5,       // the bucket that limits a queue's claims (throttle.queue_bucket)
    kQueueGroupBucket = 6,  // a group's own bucket (throttle.group_bucket)
};
inline constexpr int kEntryKindCount = 7;  // indexed by value; 0 is unused

// Buckets of any kind: a queue's bucket, and a group's, are buckets that no
// name given to throttle.take reaches, so that only claims take from them.
inline bool entry_kind_is_bucket(EntryKind kind) {
    return kind == EntryKind::kBucket || kind == EntryKind::kQueueBucket ||
           kind == EntryKind::kQueueGroupBucket;
}

const char* entry_kind_name(EntryKind kind);

// The clock an entry is timed by. Resources and buckets follow
// pg_throttle's clock (clock.hpp); those made while pg_throttle.test_clock is
// set live apart from those made on the real clock, so that a test never
// constrains a caller on the real clock, nor the other way round. Locks
// and queue groups (whose claimed rows every clock shares) are always kReal.
enum class EntryClock : uint8 { kReal = 0, kTest = 1 };

// Whether entries of `kind` follow pg_throttle's clock (and so the test clock).
bool entry_kind_follows_clock(EntryKind kind);

struct RegistryKey {
    Oid dbid;
    uint8 kind;  // an EntryKind
    uint8 name_len;
    char name[core::kMaxNameBytes];  // not NUL-terminated; bytes past name_len are zero
    // An EntryClock. Last, in what was padding: state files written before it
    // existed hold zero here, the real clock.
    uint8 clock;
};

struct RegistryEntry {
    RegistryKey key;  // first: dynahash keeps the key at the start of the entry
    dlist_node link;  // in its partition's list; the registry's own, never copied back
    // The role the entry counts against (registry/quota.hpp): the role that
    // created it; for a lock, the role holding it (or that last held it).
    // InvalidOid when not known (restored from a file that did not say).
    Oid owner;
    core::Micros granted_at;
    core::Micros expires_at;  // the entry constrains callers strictly before this instant
    // Counters since the entry was created. Changed with __atomic builtins:
    // denials are counted under the partition's shared lock.
    uint64 grants;
    uint64 denials;
    union {
        struct {        // the shape of the last call; the bucket's TAT is expires_at
            int64 per;  // microseconds
            int32 rate;
            int32 burst;
        } bucket;
        struct {            // expires_at: the lease's end, kNever for a session lock
            int64 token;    // the fence token of the current grant; 0 when free
            int64 seq;      // lease journal sequence of the last change (lease_journal.hpp)
            int32 waiters;  // backends queued for it (see lock_waiters.hpp)
            bool session;   // held until unlock or the holder's session ends
        } lock;             // kLock and kQueueGroup
    } of;
    int32 holder_pid;
    // Set when the entry was born under a crash rule (EntryOp::born) and
    // nothing granted since: granted_at is the restart R, and each call
    // decides as if granted at R on its own terms (interval, bucket shape),
    // whatever the call that created the entry asked.
    bool born;
    char holder[core::kMaxHolderBytes + 1];
};

// The expiry of an entry in its empty state (a new entry, a released lock):
// before any clock reading, so it constrains nobody, whatever the clock.
inline constexpr core::Micros kLongExpired = std::numeric_limits<core::Micros>::min();

static_assert(std::is_trivially_copyable_v<RegistryKey>);
static_assert(sizeof(RegistryKey) == 208, "the state file stores keys as they are");
static_assert(std::is_trivially_copyable_v<RegistryEntry>);
static_assert(offsetof(RegistryEntry, key) == 0);
// Everything from here is the entry's state; before it, what the registry keeps.
inline constexpr size_t kEntryStateOffset = offsetof(RegistryEntry, owner);

// What one call does to one entry. No callback may raise an error: they run
// under an LWLock. None of them is told whether the entry was just created:
// an entry the registry has no record of is "born" in the state the rules
// give a name nobody has seen, and from then on it is an entry like any other.
struct EntryOp {
    // Sets the state of a name unknown since `unknown_since` (the restart
    // after a crash, or a promotion): the kind's crash rule, as if granted
    // then. Called only while the kind's knowledge is incomplete; otherwise a
    // new entry is all zero, which every kind reads as free. Null for kinds
    // whose knowledge is never incomplete. The registry then sets `born`.
    void (*born)(RegistryEntry* entry, core::Micros unknown_since, void* ctx);
    // Under the shared lock. Returns true when the call is decided without
    // changing anything but counters.
    bool (*decide_shared)(RegistryEntry* entry, void* ctx);
    // Under the exclusive lock. May change the entry's owner (a lock granted
    // to another role): the registry moves its count to the new owner.
    void (*apply_exclusive)(RegistryEntry* entry, void* ctx);
};

// shmem_request_hook / shmem_startup_hook halves.
void registry_define_gucs();
void registry_request_shmem();
void registry_attach_shmem();

// Raises SQLSTATE 55000 unless the library was preloaded.
void registry_require();

// The registry's hash and match functions of RegistryKey (dynahash's
// HASH_FUNCTION and HASH_COMPARE): they read the name's name_len bytes only,
// where HASH_BLOBS would hash and compare the whole name buffer.
uint32 registry_key_hash(const void* key_ptr, Size keysize);
int registry_key_compare(const void* a_ptr, const void* b_ptr, Size keysize);

// Builds the key of `name` in the current database, on the session's clock
// (EntryClock); raises 22023 for an empty or over-long name, naming the
// argument `what`.
void registry_make_key(EntryKind kind, const char* name, size_t len, const char* what,
                       RegistryKey* key);

// The role a call acts as, which owns the entries it creates and the locks
// it takes: current_user; for a queue group (taken inside the queue's
// SECURITY DEFINER functions) the role outside them.
Oid registry_caller_role(EntryKind kind);

// When the key arrived on this node, for a key whose shard a Citus cluster
// moved here (the move rule, scale_out/placement.hpp, whose
// placement_moved_in_at the callers pass down): entries granted before then
// are stale, and a key nobody has asked for since is born as granted then.
// kNeverMoved: the key was always here (also every key of a database that is
// not distributed).
inline constexpr core::Micros kNeverMoved = std::numeric_limits<core::Micros>::min();

// Runs `op` on the entry of `key`, creating it (born, see EntryOp) when
// absent, owned by registry_caller_role(); `moved_in_at` as above. Reclaims
// expired entries when the table is full or the caller's role or database
// holds its quota; raises 53200 (full) or 53400 (quota) when that made no
// room.
void registry_apply(const RegistryKey& key, const EntryOp& op, void* ctx, core::Micros moved_in_at);

// Whether an entry constrains nobody at `now` (the real clock: the decision
// is shared by every session) and may be dropped: its expiry has passed and
// no backend is queued for it. An entry of the test clock (EntryClock::kTest),
// which the real clock cannot judge, only once no session has used the test
// clock for 10 minutes (a sweep run by a session on the test clock also drops
// those its clock says have expired).
bool registry_reclaimable(const RegistryEntry& entry, core::Micros now);

// Runs `update` on the entry of `key` only if it exists, under the exclusive
// lock; an entry granted before `moved_in_at` (see kNeverMoved) is as absent.
void registry_update_existing(const RegistryKey& key,
                              void (*update)(RegistryEntry* entry, void* ctx), void* ctx,
                              core::Micros moved_in_at);

// Runs `update` on the entry of `key` under the exclusive lock, creating it
// all zero when absent (no crash rule: for WAL redo, which restores what a
// primary knew). False when the table is full of entries in force.
bool registry_upsert(const RegistryKey& key, void (*update)(RegistryEntry* entry, void* ctx),
                     void* ctx);

// The lock that guards the lock waiter slots; taken after a partition lock.
LWLock* registry_waiters_lock();

// The partition lock of `key` (for code that keeps state beside the entry).
LWLock* registry_partition_lock(const RegistryKey& key);

// For startup and shutdown, when the postmaster is alone: every entry of
// every database (no locks), and putting a saved entry back (counted against
// its owner and database, whatever their quotas). registry_restore returns
// false when the registry has no room for it.
void registry_visit_all(void (*visit)(const RegistryEntry& entry, void* ctx), void* ctx);
bool registry_restore(const RegistryEntry& saved);

// After a crash the registry may not know what was granted before the
// restart R. A kind whose knowledge is incomplete treats a name it has no
// entry for as granted at R (EntryOp::born): a resource until R + every, a
// bucket as emptied at R, a lock (only when the lease journal could not be
// read whole) as leased until R + pg_throttle.max_lease. Nothing is marked
// when the kind's knowledge is complete (first start, a clean restart, a
// lease journal read whole).
void registry_mark_unknown_since(EntryKind kind, core::Micros restart);
std::optional<core::Micros> registry_unknown_since(EntryKind kind);
core::Micros registry_max_lease();

// How many entries the registry holds (live or not yet reclaimed), and
// how many of `kind` it can hold: pg_throttle.max_entries, shared by every
// kind but queue groups, whose leases have room of their own.
int64 registry_entry_count();
int64 registry_capacity(EntryKind kind);

// Server-wide totals of one kind of entry (throttle.registry_metrics).
struct RegistryKindMetrics {
    int64 entries;   // held, in force or not yet reclaimed
    int64 in_force;  // by the real clock
    // Since the server started: of the entries held, and of those dropped
    // since (entries restored from a checkpoint bring their own counts).
    uint64 grants;
    uint64 denials;
    int64 waiters;  // backends queued for a lock or a group
};

// Fills `kinds[kind]` for every EntryKind value (index 0 unused), one
// partition at a time under its shared lock.
void registry_metrics(RegistryKindMetrics* kinds);

// Drops the entry of `key` if there is one; returns whether there was.
bool registry_remove(const RegistryKey& key);

// throttle.reset of a resource or a bucket, or of a lock name with no entry.
// Without a crash rule in force for the kind, drops the entry (kCleared) if
// there is one. Under one, an absent name would be born again in the rule's
// state, so the entry is left free and known instead (not born: a resource
// grantable at once, a bucket full), and an absent name is given such an
// entry when `create_if_absent` (kMadeFree; counted against the caller's
// role and database like any new entry: kNoRoom, with the refusal in
// `refused`, when there is none after a sweep for room). A lock's existing entry is never touched
// here (lock_reset ends its grant). Raises nothing. A sweep for room leaves a free entry alone for
// 10 minutes after the reset, then may reclaim it as any entry that constrains nobody. Unlike the
// other entry points it does not notice a promotion (which takes every partition lock and logs):
// its caller does that first, with no lock held, and may then hold the checkpoint's file lock.
enum class ClearResult { kAbsent, kCleared, kMadeFree, kNoRoom };
ClearResult registry_clear(const RegistryKey& key, bool create_if_absent, QuotaCheck* refused);

// The error of a refusal for want of room (never kOk): 53200 (full) or
// 53400 (a quota of the calling role or of the current database).
[[noreturn]] void registry_raise_no_room(QuotaCheck refused);

// Calls `visit` for each entry of the current database still in force at
// `now` (throttle.lock's locks: in real time). Each partition's entries are
// copied under its shared lock and visited after it is released: `visit`
// may raise an error, and sees each entry as it was when its partition was
// copied.
void registry_scan(core::Micros now, void (*visit)(const RegistryEntry& entry, void* ctx),
                   void* ctx);

// Calls `visit` for each entry of every database still in force at `now`
// (registry_scan_all), or for every entry whatever its state
// (registry_scan_every), under each partition's shared lock in turn.
// `visit` may not raise an error.
void registry_scan_all(core::Micros now, void (*visit)(const RegistryEntry& entry, void* ctx),
                       void* ctx);
void registry_scan_every(void (*visit)(const RegistryEntry& entry, void* ctx), void* ctx);

// A standby knows nothing of the resources and buckets the primary granted
// (its leases it knows, from WAL). Started as one, the registry waits for the
// promotion; the first call after it (every entry point checks, cheaply;
// throttle.reset for registry_clear)
// forgets its own resources and buckets and counts those kinds as unknown
// since then, and the locks too when the standby's lease journal was not
// read whole.
void registry_await_promotion();
void registry_notice_promotion();
// Whether the registry still waits for its promotion (no call noticed it).
bool registry_awaiting_promotion();

}  // namespace pg_throttle::pg
