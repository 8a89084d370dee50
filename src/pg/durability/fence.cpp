// wal.hpp brings in src/core: before any PostgreSQL header.
#include "pg/durability/wal.hpp"

#include "pg/durability/fence.hpp"
#include "pg/durability/durable_file.hpp"
#include "pg/durability/sync_standbys.hpp"

extern "C" {
#include "access/xlog.h"
#include "port/pg_crc32c.h"
#include "storage/fd.h"
}

namespace pg_throttle::pg {
namespace {

// Tokens made durable at once. After a crash the counter resumes at the
// limit, so up to a block of numbers is skipped: tokens grow, not densely.
constexpr int64 kBlock = int64{1} << 20;
constexpr const char* kTrancheName = "pg_throttle fence";
constexpr const char* kFenceFile = "pg_throttle.fence";
constexpr const char* kFenceTemp = "pg_throttle.fence.tmp";
constexpr uint32 kFileMagic = 0x50474645;  // "PGFE"

struct FenceShared {
    int64 last_token;  // the counter; __atomic builtins
    int64 limit;       // no token above it is handed out; only grows
    // The highest limit written to the file (and WAL), under extend_lock. A
    // writer raises `limit` only after it has let the lock go and waited for
    // the synchronous standbys; a writer after it must never write a lower
    // limit over that one, which a checkpoint and a crash would then believe.
    int64 written_limit;
};
static_assert(std::is_trivially_copyable_v<FenceShared>);

FenceShared* fence = nullptr;
LWLock* extend_lock = nullptr;

int64 load(const int64* value) {
    return __atomic_load_n(value, __ATOMIC_ACQUIRE);
}

// Writes the limit durably. Reports at `elevel` and returns false when it
// cannot.
bool write_limit_file(int64 limit, int elevel) {
    return durable_value_write(kFenceFile, kFenceTemp, kFileMagic, limit, elevel);
}

constexpr int64 kNoFile = -2;
constexpr int64 kDamaged = -1;

// The limit in the file; kNoFile when there is none, kDamaged when it
// cannot be read.
int64 read_limit_file() {
    int64 limit = 0;
    switch (durable_value_read(kFenceFile, kFileMagic, &limit)) {
        case ValueFile::kMissing:
            return kNoFile;
        case ValueFile::kDamaged:
            return kDamaged;
        case ValueFile::kRead:
            break;
    }
    return limit < 0 ? kDamaged : limit;
}

// Whether the limit at startup was above zero: a token may exist.
bool started_with_tokens = false;

}  // namespace

void fence_redo_limit(int64 limit) {
    // The primary may have handed out every token up to the limit.
    if (limit > load(&fence->limit)) {
        (void)write_limit_file(limit, ERROR);
        atomic_raise(&fence->limit, limit);
    }
    atomic_raise(&fence->last_token, limit);
}

void fence_request_shmem() {
    RequestAddinShmemSpace(MAXALIGN(sizeof(FenceShared)));
    RequestNamedLWLockTranche(kTrancheName, 1);
}

void fence_attach_shmem() {
    bool found = false;
    fence = static_cast<FenceShared*>(
        ShmemInitStruct("pg_throttle fence", sizeof(FenceShared), &found));
    if (!found) {
        fence->last_token = 0;
        fence->limit = 0;
        fence->written_limit = 0;
    }
    extend_lock = &GetNamedLWLockTranche(kTrancheName)[0].lock;
}

void fence_startup(bool ran_before) {
    int64 limit = read_limit_file();
    if (limit == kNoFile && !ran_before) {
        // A cluster's first start: the file exists from now on, so that a
        // missing one is never mistaken for a fresh start.
        limit = 0;
        (void)write_limit_file(limit, LOG);
    }
    if (limit < 0) {
        // Without the mark, fall back on the real clock in microseconds:
        // above every earlier token unless grants outran one per microsecond.
        const char* problem = limit == kNoFile ? "missing" : "damaged";
        limit = GetCurrentTimestamp();
        ereport(
            WARNING,
            (errmsg("pg_throttle fence file \"%s\" is %s", kFenceFile, problem),
             errdetail("Fence tokens continue from the clock in microseconds, " INT64_FORMAT ".",
                       limit)));
        atomic_raise(&fence->last_token, limit);
    }
    started_with_tokens = limit > 0;
    fence->limit = limit;
    fence->written_limit = limit;
}

void fence_continue_from_limit() {
    atomic_raise(&fence->last_token, fence->limit);
}

namespace {

// With extend_lock held (released here): makes a limit of at least `wanted`
// durable and, once the synchronous standbys have it, the one in force. WAL
// first: a crash after it replays the new limit whatever the file holds.
// Never below a limit already written (written_limit), which a writer still
// waiting for the standbys has not put in force yet. Nothing under the lock
// raises an error; `failure` is the error when the file cannot be written.
void raise_limit_durably(int64 wanted, const char* failure) {
    const int64 new_limit = std::max(wanted, fence->written_limit);
    const XLogRecPtr lsn = wal_log_fence_limit(new_limit);
    XLogFlush(lsn);
    const bool written = write_limit_file(new_limit, LOG);
    if (written) {
        fence->written_limit = new_limit;
    }
    LWLockRelease(extend_lock);
    if (!written) {
        ereport(ERROR, (errcode(ERRCODE_IO_ERROR), errmsg("%s", failure)));
    }
    // Synchronous standbys must have the limit before tokens under it are
    // used: a promoted standby resumes above it. Until then nobody uses it (a
    // cancel raises an error here, and the next caller writes one of its own).
    wait_for_sync_standbys(lsn);
    atomic_raise(&fence->limit, new_limit);
}

}  // namespace

void fence_reserve_ahead() {
    if (RecoveryInProgress()) {
        ereport(ERROR, (errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
                        errmsg("cannot hand out fence tokens during recovery"),
                        errdetail("Fence tokens are made durable in WAL, which a standby cannot "
                                  "write."),
                        errhint("Take locks on the primary.")));
    }
    if (load(&fence->limit) - load(&fence->last_token) >= kBlock / 2) {
        return;
    }
    // One backend writes the block; the others wait for it on the lock.
    LWLockAcquire(extend_lock, LW_EXCLUSIVE);
    const int64 limit = load(&fence->limit);
    const int64 last = load(&fence->last_token);
    if (limit - last >= kBlock / 2) {
        LWLockRelease(extend_lock);
        return;
    }
    raise_limit_durably(std::max(limit, last) + kBlock,
                        "could not make a block of fence tokens durable");
}

int64 fence_advance_past(int64 past) {
    // Under the lock that orders writers of the limit: the limit is raised
    // (durably, then in shared memory) before the counter, so fence_next
    // never hands out a token above a limit not yet durable.
    LWLockAcquire(extend_lock, LW_EXCLUSIVE);
    const int64 limit = load(&fence->limit);
    if (past <= limit) {
        // The limit in shared memory is durable and on the synchronous
        // standbys already: after a crash or a promotion the counter resumes
        // at it, above `past`.
        LWLockRelease(extend_lock);
        atomic_raise(&fence->last_token, past);
        return fence_last();
    }
    // A block above `past`, so that the next grants need no write.
    raise_limit_durably(past + kBlock, "could not make the advanced fence limit durable");
    atomic_raise(&fence->last_token, past);
    return fence_last();
}

int64 fence_next() {
    const int64 token = __atomic_add_fetch(&fence->last_token, 1, __ATOMIC_ACQ_REL);
    return token <= load(&fence->limit) ? token : 0;
}

int64 fence_last() {
    return load(&fence->last_token);
}

void fence_raise_to(int64 token) {
    atomic_raise(&fence->last_token, token);
}

bool fence_tokens_were_issued() {
    return started_with_tokens || fence_last() > 0;
}

}  // namespace pg_throttle::pg
