#include "pg/durability/state_file.hpp"

#include "pg/durability/durable_file.hpp"

extern "C" {
#include "port/pg_crc32c.h"
#include "storage/fd.h"
}

namespace pg_throttle::pg {
namespace {

constexpr uint32 kMagic = 0x50475448;  // "PGTH"
// 5: entries with their owner role. 6: a standby's file says so
// (kUnknownFromNextStart), which a reader of 5 would take for a rule in force
// until the end of time.
constexpr uint32 kFormatVersion = 6;
constexpr uint32 kOwnerFormatVersion = 5;  // still read

struct StateHeader {
    uint32 magic;
    uint32 format_version;
    uint32 entry_size;
    uint32 reserved;
    int64 entries;
    int64 last_token;
    int64 taken_at;
    int64 resources_unknown_since;
    int64 buckets_unknown_since;
};
static_assert(std::is_trivially_copyable_v<StateHeader>);

// A standby's file of format 5 set both rules to the time it was taken (a
// primary's name the crash or promotion before it): read as format 6 says.
bool written_by_a_standby(const StateHeader& header) {
    return header.format_version == kOwnerFormatVersion &&
           header.resources_unknown_since == header.taken_at &&
           header.buckets_unknown_since == header.taken_at;
}

struct WriteState {
    FILE* file;
    pg_crc32c crc;
    int64 left;  // entries the header promised and not yet written
    bool failed;
};

void write_bytes(WriteState* state, const void* data, size_t len) {
    if (!state->failed && fwrite(data, 1, len, state->file) != len) {
        state->failed = true;
    }
    COMP_CRC32C(state->crc, data, len);
}

void emit_entry(const RegistryEntry& entry, void* ctx) {
    auto* state = static_cast<WriteState*>(ctx);
    if (state->left <= 0) {
        state->failed = true;  // more entries than counted
        return;
    }
    state->left--;
    write_bytes(state, &entry, sizeof entry);
}

}  // namespace

bool state_file_write(const char* path, const StateFileInfo& info, EntrySource source,
                      void* source_ctx) {
    WriteState state{durable_file_create(path, LOG), 0, info.entries, false};
    if (state.file == nullptr) {
        return false;
    }
    INIT_CRC32C(state.crc);
    const StateHeader header{kMagic,
                             kFormatVersion,
                             sizeof(RegistryEntry),
                             0,
                             info.entries,
                             info.last_token,
                             info.taken_at,
                             info.resources_unknown_since,
                             info.buckets_unknown_since};
    write_bytes(&state, &header, sizeof header);
    source(emit_entry, &state, source_ctx);
    FIN_CRC32C(state.crc);
    if (!state.failed && fwrite(&state.crc, 1, sizeof state.crc, state.file) != sizeof state.crc) {
        state.failed = true;
    }
    return durable_file_close(state.file, path, !state.failed && state.left == 0, LOG);
}

const char* state_file_read(const char* path, bool (*restore)(const RegistryEntry&, void*),
                            void* ctx, StateFileInfo* info, bool* found) {
    *found = false;
    FILE* file = AllocateFile(path, PG_BINARY_R);
    if (file == nullptr) {
        return errno == ENOENT ? nullptr : "it could not be opened";
    }
    *found = true;
    pg_crc32c crc = 0;
    INIT_CRC32C(crc);
    StateHeader header{};
    const char* problem = nullptr;
    if (fread(&header, 1, sizeof header, file) != sizeof header) {
        problem = "it is truncated";
    } else if (header.magic != kMagic) {
        problem = "it is not a pg_throttle state file";
    } else if ((header.format_version != kFormatVersion &&
                header.format_version != kOwnerFormatVersion) ||
               header.entry_size != sizeof(RegistryEntry)) {
        problem = "it was written by another version of pg_throttle";
    } else if (header.entries < 0) {
        problem = "it is damaged";
    }
    COMP_CRC32C(crc, &header, sizeof header);
    RegistryEntry entry;
    for (int64 i = 0; problem == nullptr && i < header.entries; i++) {
        if (fread(&entry, 1, sizeof entry, file) != sizeof entry) {
            problem = "it is truncated";
            break;
        }
        COMP_CRC32C(crc, &entry, sizeof entry);
    }
    if (problem == nullptr) {
        FIN_CRC32C(crc);
        pg_crc32c stored = 0;
        if (fread(&stored, 1, sizeof stored, file) != sizeof stored) {
            problem = "it is truncated";
        } else if (!EQ_CRC32C(stored, crc)) {
            problem = "its checksum does not match";
        }
    }
    // Verified: read the entries again, this time into the registry (none
    // of a standby's: they were its own, never the primary's).
    const bool standby = written_by_a_standby(header);
    if (problem == nullptr && fseek(file, sizeof header, SEEK_SET) != 0) {
        problem = "it could not be re-read";
    }
    for (int64 i = 0; problem == nullptr && !standby && i < header.entries; i++) {
        if (fread(&entry, 1, sizeof entry, file) != sizeof entry) {
            problem = "it is truncated";
        } else {
            (void)restore(entry, ctx);
        }
    }
    FreeFile(file);
    if (problem == nullptr) {
        *info = StateFileInfo{header.entries, header.last_token, header.taken_at,
                              standby ? kUnknownFromNextStart : header.resources_unknown_since,
                              standby ? kUnknownFromNextStart : header.buckets_unknown_since};
    }
    return problem;
}

}  // namespace pg_throttle::pg
