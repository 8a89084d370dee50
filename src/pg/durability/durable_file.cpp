#include "pg/durability/durable_file.hpp"

extern "C" {
#include "port/pg_crc32c.h"
#include "storage/fd.h"
}

namespace pg_throttle::pg {

FILE* durable_file_create(const char* path, int elevel) {
    FILE* file = AllocateFile(path, PG_BINARY_W);
    if (file == nullptr) {
        ereport(elevel, (errcode_for_file_access(), errmsg("could not create \"%s\": %m", path)));
    }
    return file;
}

bool durable_file_close(FILE* file, const char* path, bool written, int elevel) {
    bool ok = written && fflush(file) == 0 && pg_fsync(fileno(file)) == 0;
    int saved = errno;
    if (FreeFile(file) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (ok) {
        return true;
    }
    unlink(path);
    errno = saved == 0 ? ENOSPC : saved;  // a short write sets no errno: assume a full disk
    ereport(elevel, (errcode_for_file_access(), errmsg("could not write \"%s\": %m", path)));
    return false;
}

uint32 crc32c_of(const void* data, size_t len) {
    pg_crc32c crc = 0;
    INIT_CRC32C(crc);
    COMP_CRC32C(crc, data, len);
    FIN_CRC32C(crc);
    return crc;
}

}  // namespace pg_throttle::pg
