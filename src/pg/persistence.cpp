#include "pg/persistence.hpp"

// registry.hpp brings in src/core: before any PostgreSQL header.
#include "pg/registry.hpp"

#include "pg/fence.hpp"

extern "C" {
#include "port/pg_crc32c.h"
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
constexpr uint32 kMagic = 0x50475448;  // "PGTH"
constexpr uint32 kFormatVersion = 1;

struct StateHeader {
    uint32 magic;
    uint32 format_version;
    uint32 entry_size;
    uint32 reserved;
    int64 entries;
    int64 last_token;
};
static_assert(std::is_trivially_copyable_v<StateHeader>);

struct DumpState {
    FILE* file;
    pg_crc32c crc = 0;
    int64 written;
    core::Micros now;
    bool failed;
};

void write_bytes(DumpState* state, const void* data, size_t len) {
    if (!state->failed && fwrite(data, 1, len, state->file) != len) {
        state->failed = true;
    }
    COMP_CRC32C(state->crc, data, len);
}

bool worth_keeping(const RegistryEntry& entry, core::Micros now) {
    // Session locks die with their sessions; an expired entry is an absent one.
    if (static_cast<EntryKind>(entry.key.kind) == EntryKind::kLock && entry.of.lock.session) {
        return false;
    }
    return now < entry.expires_at;
}

void count_entry(const RegistryEntry& entry, void* ctx) {
    auto* state = static_cast<DumpState*>(ctx);
    if (worth_keeping(entry, state->now)) {
        state->written++;
    }
}

void write_entry(const RegistryEntry& entry, void* ctx) {
    auto* state = static_cast<DumpState*>(ctx);
    if (worth_keeping(entry, state->now)) {
        RegistryEntry copy = entry;
        if (static_cast<EntryKind>(entry.key.kind) == EntryKind::kLock) {
            copy.of.lock.waiters = 0;  // nobody waits across a restart
        }
        write_bytes(state, &copy, sizeof copy);
    }
}

// on_shmem_exit in the postmaster: code 0 is a clean shutdown.
void dump_at_shutdown(int code, Datum /*arg*/) {
    if (code != 0) {
        return;
    }
    DumpState state{nullptr, 0, 0, GetCurrentTimestamp(), false};
    registry_visit_all(count_entry, &state);
    state.file = AllocateFile(kStateTemp, PG_BINARY_W);
    if (state.file == nullptr) {
        ereport(LOG, (errcode_for_file_access(),
                      errmsg("could not write pg_throttle state file \"%s\": %m", kStateTemp)));
        return;
    }
    INIT_CRC32C(state.crc);
    const StateHeader header{kMagic, kFormatVersion, sizeof(RegistryEntry),
                             0,      state.written,  fence_last()};
    write_bytes(&state, &header, sizeof header);
    registry_visit_all(write_entry, &state);
    FIN_CRC32C(state.crc);
    if (!state.failed && fwrite(&state.crc, 1, sizeof state.crc, state.file) != sizeof state.crc) {
        state.failed = true;
    }
    if (FreeFile(state.file) != 0) {
        state.failed = true;
    }
    if (state.failed) {
        ereport(LOG, (errcode_for_file_access(),
                      errmsg("could not write pg_throttle state file \"%s\": %m", kStateTemp)));
        unlink(kStateTemp);
        return;
    }
    if (durable_rename(kStateTemp, kStateFile, LOG) == 0) {
        (void)durable_unlink(kRunningMarker, LOG);
    }
}

void warn_damaged(const char* why) {
    ereport(WARNING, (errmsg("ignoring pg_throttle state file \"%s\": %s", kStateFile, why),
                      errdetail("The registry starts empty.")));
}

// Reads the file into the empty registry. Only the postmaster runs now.
// Returns false when a state file was there but could not be used.
bool load_state() {
    FILE* file = AllocateFile(kStateFile, PG_BINARY_R);
    if (file == nullptr) {
        if (errno != ENOENT) {
            ereport(LOG, (errcode_for_file_access(),
                          errmsg("could not read pg_throttle state file \"%s\": %m", kStateFile)));
            return false;
        }
        return true;
    }
    pg_crc32c crc = 0;
    INIT_CRC32C(crc);
    StateHeader header{};
    const char* problem = nullptr;
    if (fread(&header, 1, sizeof header, file) != sizeof header) {
        problem = "it is truncated";
    } else if (header.magic != kMagic) {
        problem = "it is not a pg_throttle state file";
    } else if (header.format_version != kFormatVersion ||
               header.entry_size != sizeof(RegistryEntry)) {
        problem = "it was written by another version of pg_throttle";
    } else if (header.entries < 0) {
        problem = "it is damaged";
    }
    COMP_CRC32C(crc, &header, sizeof header);
    int64 loaded = 0;
    int64 dropped = 0;
    RegistryEntry entry;
    for (int64 i = 0; problem == nullptr && i < header.entries; i++) {
        if (fread(&entry, 1, sizeof entry, file) != sizeof entry) {
            problem = "it is truncated";
            break;
        }
        COMP_CRC32C(crc, &entry, sizeof entry);
    }
    pg_crc32c stored = 0;
    if (problem == nullptr) {
        FIN_CRC32C(crc);
        if (fread(&stored, 1, sizeof stored, file) != sizeof stored) {
            problem = "it is truncated";
        } else if (!EQ_CRC32C(stored, crc)) {
            problem = "its checksum does not match";
        }
    }
    if (problem == nullptr) {
        // Verified: read the entries again, this time into the registry.
        if (fseek(file, sizeof header, SEEK_SET) != 0) {
            problem = "it could not be re-read";
        }
        for (int64 i = 0; problem == nullptr && i < header.entries; i++) {
            if (fread(&entry, 1, sizeof entry, file) != sizeof entry) {
                problem = "it is truncated";
            } else if (registry_restore(entry)) {
                loaded++;
            } else {
                dropped++;
            }
        }
    }
    FreeFile(file);
    unlink(kStateFile);
    if (problem != nullptr) {
        warn_damaged(problem);
        return false;
    }
    fence_raise_to(header.last_token);
    ereport(LOG,
            (errmsg("pg_throttle restored %lld registry entries", static_cast<long long>(loaded)),
             dropped > 0 ? errdetail("%lld entries did not fit in pg_throttle.max_entries.",
                                     static_cast<long long>(dropped))
                         : 0));
    return true;
}

bool marker_exists() {
    return access(kRunningMarker, F_OK) == 0;
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
    const bool crashed = marker_exists();
    const bool restored = load_state();
    if (crashed || !restored) {
        registry_mark_unknown_since(GetCurrentTimestamp());
        ereport(LOG, (errmsg("pg_throttle lost its registry: entries not known since now count "
                             "as granted now"),
                      errdetail("Resources stay taken for their interval, buckets start empty and "
                                "locks stay held for pg_throttle.max_lease.")));
    }
    create_marker();
    on_shmem_exit(dump_at_shutdown, 0);
}

}  // namespace pg_throttle::pg
