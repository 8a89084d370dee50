#include "pg/durability/lease_journal.hpp"

#include "pg/durability/fence.hpp"
#include "pg/durability/durable_file.hpp"
#include "pg/durability/wal.hpp"

extern "C" {
#include "access/xlog.h"
#include "port/pg_crc32c.h"
#include "storage/fd.h"
#include "storage/spin.h"
#include "utils/memutils.h"
}

namespace pg_throttle::pg {
namespace {

constexpr const char* kSnapshotFile = "pg_throttle.leases";
constexpr const char* kSnapshotTemp = "pg_throttle.leases.tmp";
constexpr const char* kLogPrefix = "pg_throttle.lease_log.";
// Written (durably) when a running server stops knowing some lease (a
// replayed lease that did not fit, a record it could not journal): the time
// locks fall under the crash rule from, until a start carries it into the
// snapshot.
constexpr const char* kLocksUnknownFile = "pg_throttle.locks_unknown";
constexpr const char* kLocksUnknownTemp = "pg_throttle.locks_unknown.tmp";
constexpr uint32 kLocksUnknownMagic = 0x50474c55;  // "PGLU"
constexpr uint32 kRecordMagic = 0x50474c33;        // "PGL3": records with their owner
constexpr uint32 kRecordMagicV2 = 0x50474c52;      // "PGLR": kLeaseRecordV2Bytes, no owner
constexpr uint32 kSnapshotMagic = 0x50474c53;      // "PGLS"
constexpr uint32 kFormatVersion = 3;  // 3: records with their owner (2: without, still read)
// A record is one aligned 512-byte block: a torn or never-written block is
// recognised by its CRC, and the next record is found anyway.
constexpr size_t kRecordBytes = 512;
// A log is compacted once it is this long, twice the last snapshot, or 16
// bytes per registry entry: a compaction scans the whole registry, and that
// scan is then paid for by at least one record per 32 entries.
constexpr uint64 kCompactAtBytes = uint64{256} * 1024;  // 512 records
constexpr uint64 kCompactBytesPerEntry = 16;

struct DiskRecord {
    uint32 magic;
    pg_crc32c crc;  // of everything after it
    LeaseRecord lease;
};
static_assert(sizeof(DiskRecord) <= kRecordBytes);
static_assert(std::is_trivially_copyable_v<DiskRecord>);

struct SnapshotHeader {
    uint32 magic;
    uint32 format_version;
    uint64 generation;  // the log that continues this snapshot
    int64 records;
    // The last sequence number handed out before the snapshot. Its records
    // hold only live leases, but a standby may know a freed name by a higher
    // number: numbers must never go back, or the standby ignores what follows.
    int64 seq;
    // Since when locks count as leased under the crash rule (a journal once
    // read incomplete), or 0: carried until the next start re-applies it.
    int64 locks_unknown_since;
    pg_crc32c crc;  // of the fields above
};
static_assert(std::is_trivially_copyable_v<SnapshotHeader>);

struct JournalShared {
    slock_t mutex;          // guards generation and offset, read and moved together
    uint64 generation;      // the log appends go to
    uint64 offset;          // where the next record goes in it
    int64 seq;              // the last sequence number handed out; __atomic builtins
    uint64 snapshot_bytes;  // size of the last snapshot, for the compaction threshold
};
static_assert(std::is_trivially_copyable_v<JournalShared>);

JournalShared* journal = nullptr;

// The newest sequence number the journal held for each name at startup, in
// the postmaster's memory (the startup process inherits it): WAL redo must
// not bring back an older state of a name the journal knows newer, even a
// name now free that the registry no longer has.
struct JournalSeq {
    RegistryKey key;
    int64 seq;
};
HTAB* journal_seqs = nullptr;

struct Place {
    uint64 generation;
    uint64 offset;
};

// Reserves the place of one record.
Place reserve_place() {
    SpinLockAcquire(&journal->mutex);
    const Place place{journal->generation, journal->offset};
    journal->offset += kRecordBytes;
    SpinLockRelease(&journal->mutex);
    return place;
}

Place current_place() {
    SpinLockAcquire(&journal->mutex);
    const Place place{journal->generation, journal->offset};
    SpinLockRelease(&journal->mutex);
    return place;
}

// From now on, appends go to the log of `generation`.
void start_generation(uint64 generation) {
    SpinLockAcquire(&journal->mutex);
    journal->generation = generation;
    journal->offset = 0;
    SpinLockRelease(&journal->mutex);
}

void log_path(uint64 generation, char* path) {
    snprintf(path, MAXPGPATH, "%s" UINT64_FORMAT, kLogPrefix, generation);
}

pg_crc32c record_crc(const DiskRecord& disk, size_t lease_bytes) {
    return crc32c_of(&disk.lease, lease_bytes);
}

void encode(const LeaseRecord& lease, char* block) {
    memset(block, 0, kRecordBytes);
    DiskRecord disk;
    memset(&disk, 0, sizeof disk);
    disk.magic = kRecordMagic;
    disk.lease = lease;
    disk.crc = record_crc(disk, sizeof disk.lease);
    memcpy(block, &disk, sizeof disk);
}

// The record in `block`; false for a torn, damaged or never-written block.
bool decode(const char* block, LeaseRecord* lease) {
    DiskRecord disk;
    memcpy(&disk, block, sizeof disk);
    const size_t bytes = disk.magic == kRecordMagic     ? sizeof disk.lease
                         : disk.magic == kRecordMagicV2 ? kLeaseRecordV2Bytes
                                                        : 0;
    if (bytes == 0 || !EQ_CRC32C(disk.crc, record_crc(disk, bytes))) {
        return false;
    }
    return lease_record_read(&disk.lease, bytes, lease);
}

pg_crc32c header_crc(const SnapshotHeader& header) {
    return crc32c_of(&header, offsetof(SnapshotHeader, crc));
}

void key_of(const LeaseRecord& lease, RegistryKey* key) {
    memset(key, 0, sizeof *key);
    key->dbid = lease.dbid;
    key->kind = static_cast<uint8>(EntryKind::kLock);
    key->name_len = lease.name_len;
    memcpy(key->name, lease.name, lease.name_len);
}

bool in_force(const LeaseRecord& lease, core::Micros now) {
    return lease.token != 0 && now < lease.expires_at;
}

// Sets a lock entry to the state `lease` describes.
void set_entry(RegistryEntry* entry, const LeaseRecord& lease) {
    entry->of.lock.seq = lease.seq;
    entry->of.lock.token = lease.token;
    entry->of.lock.session = false;
    entry->granted_at = lease.granted_at;
    entry->expires_at = lease.token != 0 ? lease.expires_at : kLongExpired;
    entry->holder_pid = lease.holder_pid;
    entry->owner = lease.owner;
    memcpy(entry->holder, lease.holder, sizeof entry->holder);
    entry->holder[core::kMaxHolderBytes] = '\0';
}

// --- writing ------------------------------------------------------------------

bool append(const LeaseRecord& lease, bool sync) {
    alignas(8) char block[kRecordBytes];
    encode(lease, block);
    const Place place = reserve_place();
    char path[MAXPGPATH];
    log_path(place.generation, path);
    // The log of the current generation exists (a compaction creates it
    // durably before appends go to it); O_CREAT only matters to a record
    // that reserved its place just before a compaction removed the log, and
    // that record is in the compaction's snapshot.
    const int fd = OpenTransientFile(path, O_RDWR | O_CREAT | PG_BINARY);
    if (fd < 0) {
        return false;
    }
    const off_t offset = static_cast<off_t>(place.offset);
    bool written = pg_pwrite(fd, block, kRecordBytes, offset) == static_cast<ssize_t>(kRecordBytes);
    if (!written && errno == 0) {
        errno = ENOSPC;  // a short write sets no errno: assume a full disk
    }
    if (written && sync) {
        written = pg_fdatasync(fd) == 0;
    }
    const int saved = errno;
    (void)CloseTransientFile(fd);
    errno = saved;
    return written;
}

// Creates the (empty) log of `generation` durably.
bool create_log(uint64 generation, int elevel) {
    char path[MAXPGPATH];
    log_path(generation, path);
    const int fd = OpenTransientFile(path, O_RDWR | O_CREAT | PG_BINARY);
    if (fd < 0 || pg_fsync(fd) != 0) {
        ereport(elevel, (errcode_for_file_access(), errmsg("could not create \"%s\": %m", path)));
        if (fd >= 0) {
            (void)CloseTransientFile(fd);
        }
        return false;
    }
    (void)CloseTransientFile(fd);
    fsync_fname(".", true);
    return true;
}

// Since when locks fall under the crash rule, or 0 when they do not, or no
// longer can: a lock born at R is free from R + pg_throttle.max_lease on.
core::Micros locks_rule_in_force(core::Micros now) {
    const std::optional<core::Micros> since = registry_unknown_since(EntryKind::kLock);
    if (!since.has_value() || core::saturating_add(*since, registry_max_lease()) <= now) {
        return 0;
    }
    return *since;
}

// The time in pg_throttle.locks_unknown: 0 when there is none, `now` when
// it cannot be read (the rule then starts at this start).
core::Micros read_locks_unknown_file(core::Micros now) {
    int64 since = 0;
    switch (durable_value_read(kLocksUnknownFile, kLocksUnknownMagic, &since)) {
        case ValueFile::kMissing:
            return 0;
        case ValueFile::kDamaged:
            return now;
        case ValueFile::kRead:
            break;
    }
    return since;
}

// Writes the snapshot of `count` records (already encoded) as the start of
// `generation`, durably. Reports at LOG and returns false when it cannot.
bool write_snapshot(uint64 generation, const char* blocks, int64 count) {
    SnapshotHeader header{kSnapshotMagic,
                          kFormatVersion,
                          generation,
                          count,
                          __atomic_load_n(&journal->seq, __ATOMIC_ACQUIRE),
                          locks_rule_in_force(GetCurrentTimestamp()),
                          0};
    header.crc = header_crc(header);
    FILE* file = durable_file_create(kSnapshotTemp, LOG);
    if (file == nullptr) {
        return false;
    }
    const size_t bytes = static_cast<size_t>(count) * kRecordBytes;
    const bool written = fwrite(&header, 1, sizeof header, file) == sizeof header &&
                         (bytes == 0 || fwrite(blocks, 1, bytes, file) == bytes);
    if (!durable_file_close(file, kSnapshotTemp, written, LOG) ||
        durable_rename(kSnapshotTemp, kSnapshotFile, LOG) != 0) {
        return false;
    }
    __atomic_store_n(&journal->snapshot_bytes, bytes, __ATOMIC_RELAXED);
    return true;
}

// The generation of a log file's name, or false for any other file.
bool log_generation(const char* name, uint64* generation) {
    const size_t prefix = strlen(kLogPrefix);
    if (strncmp(name, kLogPrefix, prefix) != 0 || name[prefix] == '\0') {
        return false;
    }
    char* end = nullptr;
    errno = 0;
    const unsigned long long value = strtoull(name + prefix, &end, 10);
    if (errno != 0 || *end != '\0') {
        return false;
    }
    *generation = value;
    return true;
}

// Calls `visit` for each log file in the data directory.
void for_each_log(void (*visit)(const char* name, uint64 generation, void* ctx), void* ctx) {
    DIR* dir = AllocateDir(".");
    while (struct dirent* de = ReadDir(dir, ".")) {
        uint64 generation = 0;
        if (log_generation(de->d_name, &generation)) {
            visit(de->d_name, generation, ctx);
        }
    }
    FreeDir(dir);
}

void remove_if_older(const char* name, uint64 generation, void* ctx) {
    if (generation < *static_cast<uint64*>(ctx) && unlink(name) != 0) {
        ereport(LOG, (errcode_for_file_access(), errmsg("could not remove \"%s\": %m", name)));
    }
}

// Makes `generation` current, with `blocks` as its snapshot, and removes
// the older logs. False (logged) when the snapshot could not be written.
bool switch_generation(uint64 generation, const char* blocks, int64 count) {
    if (!write_snapshot(generation, blocks, count)) {
        return false;
    }
    for_each_log(remove_if_older, &generation);
    fsync_fname(".", true);
    return true;
}

// --- reading at startup ---------------------------------------------------------

// The newest record of each name read so far: a hash table in the
// postmaster's memory, keyed like the registry.
struct Latest {
    RegistryKey key;
    LeaseRecord lease;
};

struct StartupRead {
    HTAB* latest;
    int64 max_seq;
    int64 max_token;
    int64 torn;     // damaged blocks at the end of a log: writes a crash cut short
    int64 damaged;  // damaged blocks anywhere else
    core::Micros locks_unknown_since;  // from the snapshot; 0 if none
    uint64 max_generation;
    uint64 snapshot_generation;
    bool have_snapshot;
    bool log_of_snapshot_seen;
    bool complete;
};

void keep_if_newer(StartupRead* read, const LeaseRecord& lease) {
    RegistryKey key;
    key_of(lease, &key);
    bool found = false;
    auto* latest = static_cast<Latest*>(hash_search(read->latest, &key, HASH_ENTER, &found));
    if (!found || lease.seq > latest->lease.seq) {
        latest->lease = lease;
    }
    read->max_seq = std::max(read->max_seq, lease.seq);
    read->max_token = std::max(read->max_token, lease.token);
}

// Reads every block of `file` from where it stands; returns how many held a
// record. A crash can tear only writes still in flight, at the end of a log:
// a damaged block with a whole record after it was damaged after it was
// written (and perhaps fsynced), and its lease may be lost.
int64 read_blocks(StartupRead* read, FILE* file) {
    alignas(8) char block[kRecordBytes];
    size_t got = 0;
    int64 records = 0;
    int64 damaged_since_last_record = 0;
    while ((got = fread(block, 1, kRecordBytes, file)) == kRecordBytes) {
        LeaseRecord lease;
        if (decode(block, &lease)) {
            keep_if_newer(read, lease);
            records++;
            read->damaged += damaged_since_last_record;
            damaged_since_last_record = 0;
        } else if (memcmp(block, "\0\0\0\0", 4) != 0) {
            damaged_since_last_record++;  // a block never written reads as zeros
        }
    }
    if (got != 0) {
        damaged_since_last_record++;  // a torn last block
    }
    read->torn += damaged_since_last_record;
    return records;
}

void read_snapshot(StartupRead* read) {
    FILE* file = AllocateFile(kSnapshotFile, PG_BINARY_R);
    if (file == nullptr) {
        if (errno != ENOENT) {
            read->complete = false;
        }
        return;
    }
    SnapshotHeader header{};
    if (fread(&header, 1, sizeof header, file) != sizeof header || header.magic != kSnapshotMagic ||
        (header.format_version != kFormatVersion && header.format_version != 2) ||
        !EQ_CRC32C(header.crc, header_crc(header))) {
        ereport(WARNING, (errmsg("pg_throttle lease snapshot \"%s\" is damaged", kSnapshotFile)));
        read->complete = false;
        FreeFile(file);
        return;
    }
    read->have_snapshot = true;
    read->snapshot_generation = header.generation;
    read->max_seq = std::max(read->max_seq, header.seq);
    read->locks_unknown_since = header.locks_unknown_since;
    read->max_generation = std::max(read->max_generation, header.generation);
    const int64 bad_before = read->torn + read->damaged;
    const int64 records = read_blocks(read, file);
    FreeFile(file);
    // A snapshot must hold exactly its records, all of them whole.
    if (read->torn + read->damaged != bad_before || records != header.records) {
        ereport(WARNING, (errmsg("pg_throttle lease snapshot \"%s\" is damaged", kSnapshotFile)));
        read->complete = false;
    }
}

void read_log(const char* name, uint64 generation, void* ctx) {
    auto* read = static_cast<StartupRead*>(ctx);
    read->max_generation = std::max(read->max_generation, generation);
    if (read->have_snapshot && generation < read->snapshot_generation) {
        return;  // older than the snapshot, which holds all it said
    }
    if (read->have_snapshot && generation == read->snapshot_generation) {
        read->log_of_snapshot_seen = true;
    }
    FILE* file = AllocateFile(name, PG_BINARY_R);
    if (file == nullptr) {
        ereport(WARNING, (errcode_for_file_access(), errmsg("could not read \"%s\": %m", name)));
        read->complete = false;
        return;
    }
    (void)read_blocks(read, file);
    FreeFile(file);
}

// --- redo -----------------------------------------------------------------------

struct RedoCall {
    const LeaseRecord* lease;
    int64 journal_seq;  // the name's number in the journal at startup
    bool applied;
};

void apply_if_newer(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<RedoCall*>(ctx);
    if (call->lease->seq > entry->of.lock.seq) {
        set_entry(entry, *call->lease);
        call->applied = true;
    }
}

// --- compaction -----------------------------------------------------------------

struct SnapshotBuffer {
    char* blocks;
    int64 capacity;
    int64 count;
    int64 left_out;
};

// Leases, and the names a journaled change made free: their numbers keep an
// older record written late from bringing a lease back.
bool belongs_in_snapshot(const RegistryEntry& entry) {
    return static_cast<EntryKind>(entry.key.kind) == EntryKind::kLock && entry.of.lock.seq != 0 &&
           !(entry.of.lock.token != 0 && entry.of.lock.session);
}

void count_lock_entry(const RegistryEntry& entry, void* ctx) {
    if (belongs_in_snapshot(entry)) {
        (*static_cast<int64*>(ctx))++;
    }
}

void add_lock_entry(const RegistryEntry& entry, void* ctx) {
    auto* buffer = static_cast<SnapshotBuffer*>(ctx);
    if (!belongs_in_snapshot(entry)) {
        return;
    }
    if (buffer->count == buffer->capacity) {
        buffer->left_out++;
        return;
    }
    LeaseRecord lease;
    lease_record_of(entry, &lease);
    encode(lease, buffer->blocks + buffer->count * kRecordBytes);
    buffer->count++;
}

// A running server no longer knows some lease: locks fall under the crash
// rule from now, and a file says so to every later start (a restart would
// otherwise read the journal as whole). If even that file cannot be
// written, the server cannot keep the promise across a restart: PANIC, as
// PostgreSQL does when it cannot write its own state.
void lose_track_of_leases() {
    const core::Micros now = GetCurrentTimestamp();
    registry_mark_unknown_since(EntryKind::kLock, now);
    (void)durable_value_write(kLocksUnknownFile, kLocksUnknownTemp, kLocksUnknownMagic, now, PANIC);
}

}  // namespace

bool lease_is_journaled(const RegistryEntry& entry) {
    return static_cast<EntryKind>(entry.key.kind) == EntryKind::kLock && !entry.of.lock.session;
}

void lease_journal_request_shmem() {
    RequestAddinShmemSpace(MAXALIGN(sizeof(JournalShared)));
}

void lease_journal_attach_shmem() {
    bool found = false;
    journal = static_cast<JournalShared*>(
        ShmemInitStruct("pg_throttle lease journal", sizeof(JournalShared), &found));
    if (!found) {
        memset(journal, 0, sizeof *journal);
        SpinLockInit(&journal->mutex);
    }
}

bool lease_record_read(const void* data, size_t len, LeaseRecord* record) {
    if (len != sizeof(LeaseRecord) && len != kLeaseRecordV2Bytes) {
        return false;
    }
    memset(record, 0, sizeof *record);
    memcpy(record, data, len);
    if (len == kLeaseRecordV2Bytes) {
        record->owner = InvalidOid;
        record->reserved = 0;
    }
    return record->name_len > 0 && record->name_len <= core::kMaxNameBytes;
}

int64 lease_next_seq() {
    return __atomic_add_fetch(&journal->seq, 1, __ATOMIC_ACQ_REL);
}

void lease_record_of(const RegistryEntry& entry, LeaseRecord* record) {
    memset(record, 0, sizeof *record);
    record->seq = entry.of.lock.seq;
    const bool leased = entry.of.lock.token != 0 && !entry.of.lock.session;
    record->token = leased ? entry.of.lock.token : 0;
    record->granted_at = entry.granted_at;
    record->expires_at = leased ? entry.expires_at : kLongExpired;
    record->dbid = entry.key.dbid;
    record->holder_pid = entry.holder_pid;
    record->owner = entry.owner;
    record->name_len = entry.key.name_len;
    memcpy(record->name, entry.key.name, entry.key.name_len);
    memcpy(record->holder, entry.holder, sizeof record->holder);
}

XLogRecPtr lease_journal_write(const LeaseRecord& record, bool sync) {
    if (!append(record, sync)) {
        return InvalidXLogRecPtr;
    }
    return wal_log_lease(record);
}

bool lease_journal_append_only(const LeaseRecord& record) {
    return append(record, false);
}

bool lease_journal_startup(bool tokens_were_issued) {
    constexpr Size kKiB = 1024;
    MemoryContext work = AllocSetContextCreate(CurrentMemoryContext, "pg_throttle lease journal", 0,
                                               8 * kKiB, 8 * kKiB * kKiB);
    const MemoryContext previous = MemoryContextSwitchTo(work);
    HASHCTL info{};
    info.keysize = sizeof(RegistryKey);
    info.entrysize = sizeof(Latest);
    info.hcxt = work;
    StartupRead read{};
    read.latest = hash_create("pg_throttle lease journal", 1024, &info,
                              HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    read.complete = true;
    read_snapshot(&read);
    for_each_log(read_log, &read);
    bool found_any = read.have_snapshot || read.max_generation > 0;
    if (read.have_snapshot && !read.log_of_snapshot_seen) {
        // The log of a snapshot is created before the snapshot: a copy
        // taken while a compaction ran (a base backup) may miss records.
        ereport(WARNING, (errmsg("pg_throttle lease journal is incomplete: the log of its "
                                 "snapshot is missing")));
        read.complete = false;
    }
    if (!found_any && tokens_were_issued) {
        // Fence tokens were handed out here, but there is no journal: it was
        // removed, or written by a version of pg_throttle without one.
        ereport(WARNING, (errmsg("pg_throttle lease journal \"%s\" is missing", kSnapshotFile)));
        read.complete = false;
    }
    if (read.damaged > 0) {
        ereport(WARNING, (errmsg("pg_throttle lease journal has %lld damaged records",
                                 static_cast<long long>(read.damaged)),
                          errdetail("Records were damaged after they were written: their leases "
                                    "are not known.")));
        read.complete = false;
    }
    if (read.torn > 0) {
        ereport(LOG, (errmsg("pg_throttle lease journal: skipped %lld torn records at the end of "
                             "a log",
                             static_cast<long long>(read.torn)),
                      errdetail("A record being written when the server stopped is torn; its "
                                "lease was never returned to anyone.")));
    }

    // The leases still in force go back into the registry, and into the
    // snapshot that starts the next generation. The newest number of every
    // name stays for WAL redo (journal_seqs).
    if (journal_seqs != nullptr) {
        hash_destroy(journal_seqs);  // from the start before a reinitialisation
    }
    HASHCTL seqs_info{};
    seqs_info.keysize = sizeof(RegistryKey);
    seqs_info.entrysize = sizeof(JournalSeq);
    seqs_info.hcxt = TopMemoryContext;
    const int64 names = hash_get_num_entries(read.latest);
    journal_seqs = hash_create("pg_throttle lease journal numbers", std::max<int64>(names, 16),
                               &seqs_info, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    const core::Micros now = GetCurrentTimestamp();
    char* blocks = static_cast<char*>(
        palloc_extended(std::max<int64>(names, 1) * kRecordBytes, MCXT_ALLOC_HUGE));
    int64 restored = 0;
    int64 dropped = 0;
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, read.latest);
    while (auto* latest = static_cast<Latest*>(hash_seq_search(&scan))) {
        auto* seq =
            static_cast<JournalSeq*>(hash_search(journal_seqs, &latest->key, HASH_ENTER, nullptr));
        seq->seq = latest->lease.seq;
        if (!in_force(latest->lease, now)) {
            continue;
        }
        RegistryEntry entry;
        memset(&entry, 0, sizeof entry);
        entry.key = latest->key;
        set_entry(&entry, latest->lease);
        if (!registry_restore(entry)) {
            dropped++;
            continue;
        }
        encode(latest->lease, blocks + restored * kRecordBytes);
        restored++;
    }
    if (dropped > 0) {
        ereport(WARNING, (errmsg("pg_throttle could not restore %lld leases: the registry is full",
                                 static_cast<long long>(dropped)),
                          errhint("Increase pg_throttle.max_entries.")));
        read.complete = false;
    }
    // Locks fall under the crash rule from now when the journal was not read
    // whole, or still from an earlier start or a running server that lost
    // track of a lease: the snapshot carries that time until it has passed.
    const core::Micros carried = std::max(read.locks_unknown_since, read_locks_unknown_file(now));
    if (!read.complete) {
        registry_mark_unknown_since(EntryKind::kLock, now);
    } else if (carried != 0 && core::saturating_add(carried, registry_max_lease()) > now) {
        registry_mark_unknown_since(EntryKind::kLock, carried);
    }
    // Sequence numbers never go back, even when the journal that knew the
    // last one cannot be read (a standby still knows names by it): the
    // clock in microseconds is above any number handed out unless changes
    // outran one per microsecond.
    atomic_raise(&journal->seq, std::max(read.max_seq, now));
    fence_raise_to(read.max_token);
    const uint64 generation = read.max_generation + 1;
    start_generation(generation);
    if (!create_log(generation, WARNING) || !switch_generation(generation, blocks, restored)) {
        // The older files stay; the next start reads them again.
        registry_mark_unknown_since(EntryKind::kLock, now);
        read.complete = false;
    } else if (carried != 0 && unlink(kLocksUnknownFile) == 0) {
        fsync_fname(".", true);  // the snapshot carries it now
    }
    if (found_any) {
        ereport(LOG, (errmsg("pg_throttle restored %lld leases from its lease journal",
                             static_cast<long long>(restored))));
    }
    MemoryContextSwitchTo(previous);
    MemoryContextDelete(work);
    return read.complete;
}

void lease_journal_redo(const LeaseRecord& record) {
    atomic_raise(&journal->seq, record.seq);
    fence_raise_to(record.token);
    RegistryKey key;
    key_of(record, &key);
    RedoCall call{&record, 0, false};
    if (journal_seqs != nullptr) {
        const auto* known =
            static_cast<const JournalSeq*>(hash_search(journal_seqs, &key, HASH_FIND, nullptr));
        call.journal_seq = known != nullptr ? known->seq : 0;
    }
    if (record.seq <= call.journal_seq) {
        return;  // the journal had this name's state, or a newer one, at startup
    }
    if (!registry_upsert(key, apply_if_newer, &call)) {
        ereport(WARNING, (errmsg("pg_throttle registry is full: a replayed lease is not kept"),
                          errdetail("Locks count as held until pg_throttle.max_lease from now."),
                          errhint("Increase pg_throttle.max_entries.")));
        lose_track_of_leases();
        return;
    }
    if (call.applied && !append(record, record.token != 0)) {
        ereport(WARNING, (errcode_for_file_access(),
                          errmsg("could not write the pg_throttle lease journal: %m"),
                          errdetail("Locks count as held until pg_throttle.max_lease from now.")));
        lose_track_of_leases();
    }
}

void lease_journal_maybe_compact(bool force) {
    const Place place = current_place();
    const uint64 threshold =
        std::max({kCompactAtBytes, 2 * __atomic_load_n(&journal->snapshot_bytes, __ATOMIC_RELAXED),
                  kCompactBytesPerEntry * static_cast<uint64>(registry_entry_count())});
    if (!force && place.offset < threshold) {
        return;
    }
    const uint64 generation = place.generation + 1;
    if (!create_log(generation, LOG)) {
        return;
    }
    // From here appends go to the new log. Every change whose record went to
    // an older log was made in the registry before its place was reserved,
    // so the copy below holds it.
    start_generation(generation);
    // Sized (and touched) before the copy, with room for leases added meanwhile.
    int64 leases = 0;
    registry_scan_every(count_lock_entry, &leases);
    SnapshotBuffer buffer{};
    buffer.capacity = leases + leases / 8 + 64;
    buffer.blocks = static_cast<char*>(
        palloc_extended(buffer.capacity * kRecordBytes, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO));
    registry_scan_every(add_lock_entry, &buffer);
    if (buffer.left_out > 0) {
        // The older logs stay until a snapshot holds every lease.
        ereport(LOG, (errmsg("pg_throttle lease journal compaction postponed: %lld more leases "
                             "than expected",
                             static_cast<long long>(buffer.left_out))));
    } else {
        (void)switch_generation(generation, buffer.blocks, buffer.count);
    }
    pfree(buffer.blocks);
}

}  // namespace pg_throttle::pg
