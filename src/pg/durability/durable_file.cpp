#include "pg/durability/durable_file.hpp"

extern "C" {
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

}  // namespace pg_throttle::pg
