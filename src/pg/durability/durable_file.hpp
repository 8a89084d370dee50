// Writing a file the way PostgreSQL writes its own state files: the caller
// creates it under a temporary name, writes it, closes it synced with
// durable_file_close and then renames it into place (durable_rename).
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// Creates `path` for writing; reports at `elevel` and returns nullptr when
// it cannot.
FILE* durable_file_create(const char* path, int elevel);

// Flushes, fsyncs and closes `file`, which holds everything when `written`.
// On any failure removes `path`, reports at `elevel` and returns false.
bool durable_file_close(FILE* file, const char* path, bool written, int elevel);

// The CRC-32C of `len` bytes: the check every pg_throttle file and record
// carries.
uint32 crc32c_of(const void* data, size_t len);

// A file that holds one 64-bit value (a magic number naming what it holds,
// a format version, the value, a CRC), written under `temp`, fsynced and
// renamed into place. Reports at `elevel` and returns false when it cannot.
bool durable_value_write(const char* path, const char* temp, uint32 magic, int64 value, int elevel);

enum class ValueFile { kRead, kMissing, kDamaged };

// Reads the value of a file durable_value_write wrote with `magic`.
ValueFile durable_value_read(const char* path, uint32 magic, int64* value);

}  // namespace pg_throttle::pg
