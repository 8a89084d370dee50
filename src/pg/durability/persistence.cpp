#include "pg/durability/persistence.hpp"

// state_file.hpp brings in src/core: before any PostgreSQL header.
#include "pg/durability/state_file.hpp"

#include "pg/durability/checkpoint.hpp"
#include "pg/durability/fence.hpp"

extern "C" {
#include "storage/fd.h"
}

namespace pg_throttle::pg {
namespace {

constexpr const char* kStateFile = "pg_throttle.state";
constexpr const char* kStateTemp = "pg_throttle.state.tmp";
// Exists while the server runs; a clean shutdown removes it after writing
// the state. Found at startup (or at a reinitialisation after a backend
// crash), it means the registry was lost.
constexpr const char* kRunningMarker = "pg_throttle.running";

bool worth_keeping(const RegistryEntry& entry, core::Micros now) {
    // Session locks die with their sessions; an expired entry is an absent one.
    if (static_cast<EntryKind>(entry.key.kind) == EntryKind::kLock && entry.of.lock.session) {
        return false;
    }
    return now < entry.expires_at;
}

struct DumpCount {
    core::Micros now;
    int64 entries;
};

void count_entry(const RegistryEntry& entry, void* ctx) {
    auto* count = static_cast<DumpCount*>(ctx);
    if (worth_keeping(entry, count->now)) {
        count->entries++;
    }
}

struct DumpSource {
    core::Micros now;
    EntryEmitter emit;
    void* file_ctx;
};

void emit_kept(const RegistryEntry& entry, void* ctx) {
    auto* source = static_cast<DumpSource*>(ctx);
    if (worth_keeping(entry, source->now)) {
        RegistryEntry copy = entry;
        if (static_cast<EntryKind>(entry.key.kind) == EntryKind::kLock) {
            copy.of.lock.waiters = 0;  // nobody waits across a restart
        }
        source->emit(copy, source->file_ctx);
    }
}

void emit_registry(EntryEmitter emit, void* file_ctx, void* source_ctx) {
    DumpSource source{*static_cast<core::Micros*>(source_ctx), emit, file_ctx};
    registry_visit_all(emit_kept, &source);
}

// on_shmem_exit in the postmaster: code 0 is a clean shutdown.
void dump_at_shutdown(int code, Datum /*arg*/) {
    if (code != 0) {
        return;
    }
    DumpCount count{GetCurrentTimestamp(), 0};
    registry_visit_all(count_entry, &count);
    const StateFileInfo info{count.entries, fence_last(), count.now};
    if (state_file_write(kStateTemp, info, emit_registry, &count.now) &&
        durable_rename(kStateTemp, kStateFile, LOG) == 0) {
        (void)durable_unlink(kRunningMarker, LOG);
    }
}

bool restore_entry(const RegistryEntry& entry, void* ctx) {
    auto* counts = static_cast<int64*>(ctx);
    counts[registry_restore(entry) ? 0 : 1]++;
    return true;
}

// Reads the state file into the empty registry. Only the postmaster runs
// now. Returns false when a state file was there but could not be used.
bool load_state() {
    int64 counts[2] = {0, 0};  // loaded, dropped
    StateFileInfo info{};
    bool found = false;
    const char* problem = state_file_read(kStateFile, restore_entry, counts, &info, &found);
    if (found) {
        unlink(kStateFile);
    }
    if (problem != nullptr) {
        ereport(WARNING, (errmsg("ignoring pg_throttle state file \"%s\": %s", kStateFile, problem),
                          errdetail("The registry starts empty.")));
        return false;
    }
    if (found) {
        fence_raise_to(info.last_token);
        ereport(LOG,
                (errmsg("pg_throttle restored %lld registry entries",
                        static_cast<long long>(counts[0])),
                 counts[1] > 0 ? errdetail("%lld entries did not fit in pg_throttle.max_entries.",
                                           static_cast<long long>(counts[1]))
                               : 0));
    }
    return true;
}

bool file_exists(const char* name) {
    return access(name, F_OK) == 0;
}

void create_marker() {
    const int fd = OpenTransientFile(kRunningMarker, O_CREAT | O_WRONLY | PG_BINARY);
    if (fd < 0) {
        ereport(LOG,
                (errcode_for_file_access(), errmsg("could not create \"%s\": %m", kRunningMarker)));
        return;
    }
    (void)pg_fsync(fd);
    (void)CloseTransientFile(fd);
    fsync_fname(".", true);
}

}  // namespace

void persistence_startup() {
    if (IsUnderPostmaster) {
        return;  // a backend attaching (EXEC_BACKEND): nothing to load or dump
    }
    // A standby, or a restore from a backup, starts from files copied off
    // another server: a marker among them, perhaps, but nothing that says
    // what that server granted since. Its promotion counts as a crash.
    const bool from_backup = file_exists("standby.signal") || file_exists("recovery.signal");
    const bool crashed = file_exists(kRunningMarker) || from_backup;
    const bool restored = !from_backup && load_state();
    const bool lost = crashed || !restored;
    fence_startup(lost);
    if (from_backup) {
        checkpoint_discard();
        registry_await_promotion();
    }
    if (lost) {
        const core::Micros restart = GetCurrentTimestamp();
        registry_mark_unknown_since(restart);
        const int64 kept = from_backup ? 0 : checkpoint_restore(restart);
        ereport(LOG,
                (errmsg("pg_throttle lost its registry: entries not known since now count "
                        "as granted now"),
                 errdetail("Resources stay taken for their interval (%lld came back exactly from "
                           "the last checkpoint), buckets start empty and locks stay held for "
                           "pg_throttle.max_lease.",
                           static_cast<long long>(kept))));
    }
    create_marker();
    on_shmem_exit(dump_at_shutdown, 0);
}

}  // namespace pg_throttle::pg
