// state_file.hpp brings in src/core: before any PostgreSQL header.
#include "pg/durability/state_file.hpp"

#include "pg/durability/checkpoint.hpp"
#include "pg/durability/fence.hpp"
#include "pg/durability/lease_journal.hpp"

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
// Present once pg_throttle has run on this data directory.
constexpr const char* kLeaseSnapshot = "pg_throttle.leases";

// Resources and buckets in force (leases live in the lease journal, session
// locks die with their sessions, queue groups live in the event table). Also a test clock's,
// whatever the real clock says (they may be in force on the test clock), and, while the kind's
// crash rule is in force, those known free (not born): dropped, they would
// come back in the rule's state (a reset name would be taken again).
bool worth_keeping(const RegistryEntry& entry, core::Micros now) {
    const auto kind = static_cast<EntryKind>(entry.key.kind);
    if (kind != EntryKind::kResource && !entry_kind_is_bucket(kind)) {
        return false;
    }
    const bool test_clock = entry.key.clock == static_cast<uint8>(EntryClock::kTest);
    return test_clock || now < entry.expires_at ||
           (!entry.born && registry_unknown_since(kind).has_value());
}

struct DumpScope {
    core::Micros now;
    // A standby's resources and buckets are its own, never the primary's:
    // none is kept.
    bool standby;
};

bool dumped(const RegistryEntry& entry, const DumpScope& scope) {
    return !scope.standby && worth_keeping(entry, scope.now);
}

struct DumpCount {
    DumpScope scope;
    int64 entries;
};

void count_entry(const RegistryEntry& entry, void* ctx) {
    auto* count = static_cast<DumpCount*>(ctx);
    if (dumped(entry, count->scope)) {
        count->entries++;
    }
}

struct DumpSource {
    DumpScope scope;
    EntryEmitter emit;
    void* file_ctx;
};

void emit_kept(const RegistryEntry& entry, void* ctx) {
    auto* source = static_cast<DumpSource*>(ctx);
    if (dumped(entry, source->scope)) {
        source->emit(entry, source->file_ctx);
    }
}

void emit_registry(EntryEmitter emit, void* file_ctx, void* source_ctx) {
    DumpSource source{*static_cast<DumpScope*>(source_ctx), emit, file_ctx};
    registry_visit_all(emit_kept, &source);
}

// on_shmem_exit in the postmaster: code 0 is a clean shutdown.
void dump_at_shutdown(int code, Datum /*arg*/) {
    if (code != 0) {
        return;
    }
    // A standby's registry (or a promoted one's that no call has told of its
    // promotion yet) never knew the primary's grants: whoever starts from
    // this file, as a primary, counts them as granted at that start. (Marked
    // from the shutdown instead, a standby restarted as a primary without a
    // promotion granted again what the old primary granted in between.)
    const DumpScope scope{GetCurrentTimestamp(), registry_awaiting_promotion()};
    DumpCount count{scope, 0};
    registry_visit_all(count_entry, &count);
    const StateFileInfo info{
        count.entries, fence_last(), scope.now,
        scope.standby ? kUnknownFromNextStart
                      : registry_unknown_since(EntryKind::kResource).value_or(0),
        scope.standby ? kUnknownFromNextStart
                      : registry_unknown_since(EntryKind::kBucket).value_or(0)};
    DumpScope source = scope;
    if (state_file_write(kStateTemp, info, emit_registry, &source) &&
        durable_rename(kStateTemp, kStateFile, LOG) == 0) {
        (void)durable_unlink(kRunningMarker, LOG);
    }
}

// Every entry the shutdown chose to keep (worth_keeping, judged then with
// the rules in force then; one that has expired since is reclaimed as usual).
bool restore_entry(const RegistryEntry& entry, void* ctx) {
    auto* counts = static_cast<int64*>(ctx);
    counts[registry_restore(entry) ? 0 : 1]++;
    return true;
}

// Reads the state file into the empty registry. Only the postmaster runs
// now. Returns false when the registry is not complete: the file was there
// but could not be used, or some of its entries did not fit.
bool load_state() {
    int64 counts[2] = {0, 0};  // loaded, dropped
    StateFileInfo info{};
    bool found = false;
    const char* problem = state_file_read(kStateFile, restore_entry, counts, &info, &found);
    if (problem != nullptr) {
        ereport(WARNING, (errmsg("ignoring pg_throttle state file \"%s\": %s", kStateFile, problem),
                          errdetail("Resources and buckets count as granted at this start.")));
        return false;
    }
    if (found) {
        fence_raise_to(info.last_token);
        // A crash rule in force at the shutdown stays in force; a standby's
        // file puts one in force from this start.
        const core::Micros start = GetCurrentTimestamp();
        const auto keep_rule = [start](EntryKind kind, core::Micros since) {
            if (since != 0) {
                registry_mark_unknown_since(kind, since == kUnknownFromNextStart ? start : since);
            }
        };
        keep_rule(EntryKind::kResource, info.resources_unknown_since);
        keep_rule(EntryKind::kBucket, info.buckets_unknown_since);
        ereport(LOG, (errmsg("pg_throttle restored %lld resources and buckets",
                             static_cast<long long>(counts[0]))));
    }
    if (counts[1] > 0) {
        // The names dropped here were granted: the crash rule covers them,
        // and every name not restored, from now on.
        ereport(WARNING,
                (errmsg("pg_throttle could not restore %lld resources and buckets: the registry is "
                        "full",
                        static_cast<long long>(counts[1])),
                 errdetail("Resources and buckets not restored count as granted at this start."),
                 errhint("Increase pg_throttle.max_entries.")));
        return false;
    }
    return true;
}

bool file_exists(const char* name) {
    return access(name, F_OK) == 0;
}

// The marker must exist before the state file is gone: without it, a crash
// would later look like a clean start.
void create_marker() {
    const int fd = OpenTransientFile(kRunningMarker, O_CREAT | O_WRONLY | PG_BINARY);
    if (fd < 0 || pg_fsync(fd) != 0) {
        ereport(
            FATAL,
            (errcode_for_file_access(), errmsg("could not create \"%s\": %m", kRunningMarker),
             errdetail("pg_throttle could not tell a crash from a clean shutdown without it.")));
    }
    (void)CloseTransientFile(fd);
    fsync_fname(".", true);
}

void remove_durably(const char* name) {
    if (file_exists(name)) {
        (void)durable_unlink(name, LOG);
    }
}

}  // namespace

void persistence_startup() {
    if (IsUnderPostmaster) {
        return;  // a backend attaching (EXEC_BACKEND): nothing to load or dump
    }
    // A standby, or a restore from a backup, starts from files copied off
    // another server (or its own, from before it was made a standby): they
    // say nothing of what the primary granted since. Its resources and
    // buckets count as granted at its promotion. Its leases come from its
    // own lease journal (a base backup copies the primary's) and WAL.
    const bool from_backup = file_exists("standby.signal") || file_exists("recovery.signal");
    const bool crashed = file_exists(kRunningMarker);
    const bool ran_before = crashed || file_exists(kStateFile) || file_exists(kLeaseSnapshot);
    fence_startup(ran_before);
    // Leases first: they are the exact promise. Resources and buckets that
    // no longer fit fall under the crash rule, which costs little.
    const bool leases_complete = lease_journal_startup(fence_tokens_were_issued());
    // The state file is read only after this server's own clean shutdown;
    // otherwise it is stale (a crash came after it was read, or it was
    // copied) and removed, never left for a later start to read.
    const bool restored = !from_backup && !crashed && load_state();
    const bool lost = !restored;
    if (lost) {
        fence_continue_from_limit();
    }
    const core::Micros restart = GetCurrentTimestamp();
    checkpoint_remove_temporary_files();
    if (from_backup) {
        checkpoint_discard();
        registry_await_promotion();
    }
    if (lost) {
        registry_mark_unknown_since(EntryKind::kResource, restart);
        registry_mark_unknown_since(EntryKind::kBucket, restart);
        const int64 kept = from_backup ? 0 : checkpoint_restore(restart);
        ereport(LOG,
                (errmsg("pg_throttle lost its resources and buckets: those not known since now "
                        "count as granted now"),
                 errdetail("Resources stay taken for their interval (%lld came back exactly "
                           "from the last checkpoint) and buckets start empty.",
                           static_cast<long long>(kept))));
    }
    if (!leases_complete) {
        ereport(WARNING, (errmsg("pg_throttle could not read its lease journal whole: locks not "
                                 "known since now count as leased until pg_throttle.max_lease "
                                 "from now")));
    }
    create_marker();
    remove_durably(kStateFile);
    on_shmem_exit(dump_at_shutdown, 0);
}

}  // namespace pg_throttle::pg
