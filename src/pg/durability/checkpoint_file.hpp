// The checkpoint's file, pg_throttle.checkpoint: the resources in force as
// compact records (database, name, holder, grant and end of the window, and
// whether the entry is still in the state a crash rule gave it), so
// that copying them under the registry's locks touches little memory and
// the file stays small. A header with a magic number, a format version, the
// record count and size, the time taken; a CRC-32C of it all.
#pragma once

// registry.hpp brings in src/core: before any PostgreSQL header.
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {

struct RecordBuffer {
    char* data;
    size_t used;
    size_t capacity;
    int64 count;     // records in data
    int64 left_out;  // resources that did not fit
};

// Allocates (and touches, so that no page is first touched under a lock)
// room for about `entries` records of `bytes_per_record` bytes on average.
void record_buffer_init(RecordBuffer* buffer, int64 entries, size_t bytes_per_record);

// Adds a resource; counts it as left out when there is no room. Allocates
// nothing and raises nothing: it runs under the registry's locks.
void record_buffer_add(RecordBuffer* buffer, const RegistryEntry& entry);

// Writes the records to `path` and fsyncs it; false (logged) on failure.
bool checkpoint_file_write(const char* path, const RecordBuffer& buffer, core::Micros taken_at);

// Reads `path` and calls `restore` for each resource once the whole file
// checked out. nullptr when read (or absent: `*found` false), else why not.
const char* checkpoint_file_read(const char* path, void (*restore)(const RegistryEntry&, void*),
                                 void* ctx, core::Micros* taken_at, bool* found);

}  // namespace pg_throttle::pg
