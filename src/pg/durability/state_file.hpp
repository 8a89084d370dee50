// The format of the registry's shutdown dump (pg_throttle.state): a header with a magic number, a
// format version, the entry size, the count, the fence counter, the time it was taken and the crash
// rules in force; the entries; a CRC-32C of all of it.
//
// The registry across clean restarts (persistence.cpp): written at postmaster shutdown, read once
// at startup (the pg_stat_statements pattern). The file is written under a temporary name and
// renamed into place durably, and removed once read, so a later crash never brings back state
// older than what shared memory held.
#pragma once

// registry.hpp brings in src/core: before any PostgreSQL header.
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {

struct StateFileInfo {
    int64 entries;
    int64 last_token;
    core::Micros taken_at;  // real clock
    // Since when resources and buckets fall under the crash rule (a crash
    // or a promotion before this clean shutdown), or 0: a clean restart
    // must not forget it. kUnknownFromNextStart: written by a standby, which
    // never knew the primary's grants; whoever starts from the file counts
    // them as granted at its own start, as at a promotion.
    core::Micros resources_unknown_since;
    core::Micros buckets_unknown_since;
};
inline constexpr core::Micros kUnknownFromNextStart = core::kNever;

// Writes `info.entries` entries, produced by `source` calling `emit` for
// each, to `path` and fsyncs it. Returns false (logged at LOG) on failure,
// leaving no file behind.
using EntryEmitter = void (*)(const RegistryEntry& entry, void* file_ctx);
using EntrySource = void (*)(EntryEmitter emit, void* file_ctx, void* source_ctx);
bool state_file_write(const char* path, const StateFileInfo& info, EntrySource source,
                      void* source_ctx);

// Reads `path`: checks the whole file first, then calls `restore` for each
// entry. Returns nullptr when the file was read (or is absent: `*found`
// false), or why it was not used.
const char* state_file_read(const char* path, bool (*restore)(const RegistryEntry&, void*),
                            void* ctx, StateFileInfo* info, bool* found);

// In shmem_startup_hook, in the postmaster: loads the file if there is one
// (a WARNING, not a failure, when it is damaged or from another version)
// and arranges for the registry to be written at shutdown.
void persistence_startup();

}  // namespace pg_throttle::pg
