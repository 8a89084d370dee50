// The lease journal: what makes a lease of throttle.lock survive a crash.
//
// A lease is a promise to one holder for its whole ttl, so its grant (and
// every renew) is written to the journal and fsynced before the token is
// returned. PostgreSQL's WAL alone cannot carry it: crash recovery replays WAL
// only from the last checkpoint's redo point, and PostgreSQL 15 lets no
// extension add its state to a checkpoint. So the journal is pg_throttle's
// own, in the data directory, and WAL carries the same records to standbys
// (whose redo writes them to their own journal).
//
// Every record is the whole state of one name (its lease, or "free") with a
// sequence number taken, under the name's partition lock, from a counter
// shared by the server and carried by WAL. Replay keeps, per name, the record
// with the highest number: records may be written in any order by racing
// backends, replayed twice (journal, then WAL from the redo point) or copied
// mid-flight by a base backup, and the result is the same.
//
// Files: pg_throttle.lease_log.<generation> holds fixed-size records, each
// with its CRC, appended without a lock; pg_throttle.leases is the snapshot
// a compaction writes. A compaction starts a new generation (new appends go
// to its log), copies the leases from the registry, writes the snapshot
// durably and then removes the older logs. Startup reads the snapshot and
// the logs of its generation and later, and compacts.
//
// Releases are written but not fsynced: a release lost in a crash only lets
// a lease run to its end. Expiries need no record. Session locks and the
// queue's group leases are not journaled: no session survives a crash, and
// the event table is the durable truth of group claims.
#pragma once

// registry.hpp brings in src/core: before any PostgreSQL header.
#include "pg/registry/registry.hpp"

extern "C" {
#include "access/xlogdefs.h"
}

namespace pg_throttle::pg {

// A name's lease state, as the journal and WAL carry it. Plain data.
struct LeaseRecord {
    int64 seq;         // orders the changes of one name
    int64 token;       // the lease's fence token; 0: the name is free
    int64 granted_at;  // real clock
    int64 expires_at;  // real clock
    Oid dbid;
    int32 holder_pid;
    uint8 name_len;
    char name[core::kMaxNameBytes];
    char holder[core::kMaxHolderBytes + 1];
    // Added after the first release, past its last byte: a record written
    // before (kLeaseRecordV2Bytes long, in WAL and in the journal) reads as
    // owner InvalidOid.
    Oid owner;  // the role holding the lease (RegistryEntry::owner)
    uint32 reserved;
};
static_assert(std::is_trivially_copyable_v<LeaseRecord>);
// The size of a record before it had an owner; a record of this size is one.
inline constexpr size_t kLeaseRecordV2Bytes = 312;
static_assert(offsetof(LeaseRecord, owner) >=
              offsetof(LeaseRecord, holder) + core::kMaxHolderBytes + 1);
static_assert(sizeof(LeaseRecord) != kLeaseRecordV2Bytes);

// A record read from `len` bytes (sizeof(LeaseRecord), or kLeaseRecordV2Bytes
// for one written before owners); false for any other length or a name
// length out of range.
bool lease_record_read(const void* data, size_t len, LeaseRecord* record);

// Whether changes of `entry` go to the journal: leases of throttle.lock.
bool lease_is_journaled(const RegistryEntry& entry);

// shmem_request_hook / shmem_startup_hook halves.
void lease_journal_request_shmem();
void lease_journal_attach_shmem();

// In the postmaster at startup, before WAL redo: reads the journal into the
// registry (leases still in force) and compacts it. Returns whether it was
// read whole; when not (a damaged or missing file, a lease that did not fit
// in the registry) locks fall under the crash rule from now, and the
// journal's snapshot carries that until a later start applies it again.
// `tokens_were_issued`: the fence shows that some lease may exist.
bool lease_journal_startup(bool tokens_were_issued);

// The next sequence number; called under the name's partition lock, so the
// numbers of one name grow in the order of its changes.
int64 lease_next_seq();

// The record of `entry`'s current state (a lease, or free).
void lease_record_of(const RegistryEntry& entry, LeaseRecord* record);

// Writes `record` to the journal, fsynced when `sync`, then to WAL. Returns
// the WAL position, or InvalidXLogRecPtr when the journal write failed
// (errno tells why; nothing was written to WAL). No LWLock may be held.
XLogRecPtr lease_journal_write(const LeaseRecord& record, bool sync);

// Writes `record` to the journal only, not fsynced and not to WAL: for a
// release made while an error is being handled. False (errno) on failure.
bool lease_journal_append_only(const LeaseRecord& record);

// WAL redo of a lease record (standbys, crash recovery): applies it to the
// registry when it is newer than what the name has, and journals it.
void lease_journal_redo(const LeaseRecord& record);

// Compacts when the current log has grown past its threshold (or always
// when `force`). Called by the background worker; not concurrently.
void lease_journal_maybe_compact(bool force);

}  // namespace pg_throttle::pg
