#include "pg/durability/checkpoint.hpp"

// checkpoint_file.hpp brings in src/core: before any PostgreSQL header.
#include "pg/durability/checkpoint_file.hpp"

#include "pg/durability/lease_journal.hpp"
#include "pg/registry/registry.hpp"

extern "C" {
#include "access/xlog.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/fd.h"
#include "utils/memutils.h"
}

namespace pg_throttle::pg {
namespace {

constexpr const char* kCheckpointFile = "pg_throttle.checkpoint";
// Each writer (the background worker, a session calling throttle.checkpoint)
// writes a temporary file of its own, named by its process id, so that two
// writers never write into, or rename, each other's copy.
constexpr const char* kCheckpointTempPrefix = "pg_throttle.checkpoint.";
constexpr const char* kCheckpointTempSuffix = ".tmp";
constexpr const char* kTrancheName = "pg_throttle checkpoint";

int interval_seconds = 10;

struct CheckpointShared {
    // Bumped by every invalidation: a checkpoint whose copy began before
    // one is not moved into place.
    uint64 generation;
    // A resource was granted (or the registry restored, or a checkpoint
    // deleted) since the last checkpoint was copied.
    bool changed;
};
static_assert(std::is_trivially_copyable_v<CheckpointShared>);

CheckpointShared* shared = nullptr;
LWLock* file_lock = nullptr;  // orders renames and invalidations

// Bytes per record this process expects, from its last checkpoint: the
// buffer is sized (and touched) before the registry's locks are taken.
size_t bytes_per_record = 96;

void collect_resource(const RegistryEntry& entry, void* ctx) {
    if (static_cast<EntryKind>(entry.key.kind) == EntryKind::kResource) {
        record_buffer_add(static_cast<RecordBuffer*>(ctx), entry);
    }
}

struct RestoreCall {
    core::Micros restart;
    int64 restored;
};

void restore_if_open(const RegistryEntry& entry, void* ctx) {
    auto* call = static_cast<RestoreCall*>(ctx);
    if (entry.expires_at > call->restart && registry_restore(entry)) {
        call->restored++;
    }
}

// False (errno set) when the file is there and could not be removed.
bool remove_file_durably() {
    if (unlink(kCheckpointFile) != 0) {
        return errno == ENOENT;
    }
    fsync_fname(".", true);
    return true;
}

void temp_path(char* path, size_t size) {
    snprintf(path, size, "%s%d%s", kCheckpointTempPrefix, MyProcPid, kCheckpointTempSuffix);
}

void report_remove_failure(int elevel) {
    ereport(elevel,
            (errcode_for_file_access(), errmsg("could not remove \"%s\": %m", kCheckpointFile)));
}

}  // namespace

void checkpoint_define_guc() {
    DefineCustomIntVariable(
        "pg_throttle.checkpoint_interval", "How often the registry's resources are checkpointed.",
        "After a crash, resources granted before the last checkpoint come back exactly; 0 "
        "turns the checkpoint off.",
        &interval_seconds, 10, 0, 86400, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr, nullptr);
}

void checkpoint_register_worker() {
    BackgroundWorker worker{};
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS;
    worker.bgw_start_time = BgWorkerStart_PostmasterStart;
    worker.bgw_restart_time = 10;
    strlcpy(worker.bgw_library_name, "pg_throttle", BGW_MAXLEN);
    strlcpy(worker.bgw_function_name, "pg_throttle_checkpointer_main", BGW_MAXLEN);
    strlcpy(worker.bgw_name, "pg_throttle checkpointer", BGW_MAXLEN);
    strlcpy(worker.bgw_type, "pg_throttle checkpointer", BGW_MAXLEN);
    RegisterBackgroundWorker(&worker);
}

void checkpoint_request_shmem() {
    RequestAddinShmemSpace(MAXALIGN(sizeof(CheckpointShared)));
    RequestNamedLWLockTranche(kTrancheName, 1);
}

void checkpoint_attach_shmem() {
    bool found = false;
    shared = static_cast<CheckpointShared*>(
        ShmemInitStruct("pg_throttle checkpoint", sizeof(CheckpointShared), &found));
    if (!found) {
        shared->generation = 0;
        shared->changed = true;  // whatever the start restored is new to the checkpoint
    }
    file_lock = &GetNamedLWLockTranche(kTrancheName)[0].lock;
}

void checkpoint_note_resource_grant() {
    if (!__atomic_load_n(&shared->changed, __ATOMIC_RELAXED)) {
        __atomic_store_n(&shared->changed, true, __ATOMIC_RELEASE);
    }
}

int64 checkpoint_write(bool only_if_changed) {
    registry_notice_promotion();  // never a checkpoint of what a standby granted
    const bool changed = __atomic_exchange_n(&shared->changed, false, __ATOMIC_ACQ_REL);
    if (only_if_changed && !changed) {
        return -1;
    }
    const uint64 generation = __atomic_load_n(&shared->generation, __ATOMIC_ACQUIRE);
    const core::Micros now = GetCurrentTimestamp();
    // Sized before the locks are taken, with room for entries added meanwhile.
    const int64 count = registry_entry_count();
    RecordBuffer buffer{};
    record_buffer_init(&buffer, count + count / 8 + 64, bytes_per_record);
    const TimestampTz scan_started = GetCurrentTimestamp();
    registry_scan_all(now, collect_resource, &buffer);
    const TimestampTz copied = GetCurrentTimestamp();
    char temp[MAXPGPATH];
    temp_path(temp, sizeof temp);
    const bool written = checkpoint_file_write(temp, buffer, now);
    ereport(DEBUG1, (errmsg("pg_throttle checkpoint: %lld resources copied in %.1f ms (under the "
                            "registry's shared locks), %zu bytes written in %.1f ms",
                            static_cast<long long>(buffer.count), (copied - scan_started) / 1000.0,
                            buffer.used, (GetCurrentTimestamp() - copied) / 1000.0)));
    if (buffer.count > 0) {
        bytes_per_record = std::max<size_t>(64, buffer.used / buffer.count * 5 / 4);
    }
    if (buffer.left_out > 0) {
        // They fall under the crash rule until the next checkpoint, which has room.
        ereport(LOG, (errmsg("pg_throttle checkpoint left out %lld resources",
                             static_cast<long long>(buffer.left_out))));
        bytes_per_record *= 2;
        checkpoint_note_resource_grant();
    }
    pfree(buffer.data);
    if (!written) {
        checkpoint_note_resource_grant();  // try again next time
        return -1;
    }
    LWLockAcquire(file_lock, LW_EXCLUSIVE);
    if (__atomic_load_n(&shared->generation, __ATOMIC_ACQUIRE) == generation) {
        (void)durable_rename(temp, kCheckpointFile, LOG);
    } else {
        unlink(temp);  // invalidated while it was being written
    }
    LWLockRelease(file_lock);
    return buffer.count;
}

void checkpoint_begin_forget() {
    LWLockAcquire(file_lock, LW_EXCLUSIVE);
    if (!remove_file_durably()) {
        const int saved = errno;
        LWLockRelease(file_lock);
        errno = saved;
        report_remove_failure(ERROR);
    }
}

void checkpoint_end_forget() {
    __atomic_add_fetch(&shared->generation, 1, __ATOMIC_ACQ_REL);
    checkpoint_note_resource_grant();  // the deleted checkpoint's resources need a new one
    LWLockRelease(file_lock);
}

int64 checkpoint_restore(core::Micros restart) {
    RestoreCall call{restart, 0};
    core::Micros taken_at = 0;
    bool found = false;
    const char* problem =
        checkpoint_file_read(kCheckpointFile, restore_if_open, &call, &taken_at, &found);
    if (problem != nullptr) {
        ereport(WARNING,
                (errmsg("ignoring pg_throttle checkpoint \"%s\": %s", kCheckpointFile, problem)));
        return 0;
    }
    if (found) {
        ereport(LOG, (errmsg("pg_throttle restored %lld resources from its checkpoint of %s",
                             static_cast<long long>(call.restored), timestamptz_to_str(taken_at))));
    }
    return call.restored;
}

void checkpoint_remove_temporary_files() {
    DIR* dir = AllocateDir(".");
    const size_t prefix = strlen(kCheckpointTempPrefix);
    const size_t suffix = strlen(kCheckpointTempSuffix);
    struct dirent* de = nullptr;
    while ((de = ReadDir(dir, ".")) != nullptr) {
        const size_t len = strlen(de->d_name);
        if (len > prefix + suffix && strncmp(de->d_name, kCheckpointTempPrefix, prefix) == 0 &&
            strcmp(de->d_name + len - suffix, kCheckpointTempSuffix) == 0) {
            (void)unlink(de->d_name);  // a writer's, cut short by the crash or shutdown
        }
    }
    FreeDir(dir);
}

void checkpoint_discard() {
    if (!remove_file_durably()) {
        report_remove_failure(LOG);
    }
}

}  // namespace pg_throttle::pg

// The background worker: the checkpoint every pg_throttle.checkpoint_interval,
// and, every second, the lease journal's compaction when its log has grown.
void pg_throttle_checkpointer_main(Datum /*arg*/) {
    using namespace pg_throttle::pg;
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
    BackgroundWorkerUnblockSignals();
    constexpr Size kKiB = 1024;
    constexpr long kCompactionCheckMs = 1000;
    MemoryContext work = AllocSetContextCreate(TopMemoryContext, "pg_throttle checkpointer", 0,
                                               8 * kKiB, 8 * kKiB * kKiB);
    TimestampTz last_written = GetCurrentTimestamp();
    for (;;) {
        const long interval_ms = interval_seconds * 1000L;
        long timeout_ms = kCompactionCheckMs;
        if (interval_ms > 0) {
            const long since = static_cast<long>((GetCurrentTimestamp() - last_written) / 1000);
            timeout_ms = std::min(timeout_ms, std::max(1L, interval_ms - since));
        }
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
                        PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        if (ShutdownRequestPending != 0) {
            proc_exit(0);
        }
        if (ConfigReloadPending != 0) {
            ConfigReloadPending = 0;
            ProcessConfigFile(PGC_SIGHUP);
        }
        MemoryContext previous = MemoryContextSwitchTo(work);
        lease_journal_maybe_compact(false);
        const TimestampTz now = GetCurrentTimestamp();
        if (interval_seconds > 0 && now - last_written >= interval_seconds * 1000000L) {
            last_written = now;
            if (!RecoveryInProgress()) {
                (void)checkpoint_write(true);
            }
        }
        MemoryContextSwitchTo(previous);
        MemoryContextReset(work);
    }
}
