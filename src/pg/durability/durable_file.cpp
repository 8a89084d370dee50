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

namespace {

constexpr uint32 kValueFileVersion = 1;

struct ValueFileData {
    uint32 magic;
    uint32 version;
    int64 value;
    pg_crc32c crc;  // of the fields above
};
static_assert(std::is_trivially_copyable_v<ValueFileData>);

pg_crc32c value_crc(const ValueFileData& data) {
    return crc32c_of(&data, offsetof(ValueFileData, crc));
}

}  // namespace

bool durable_value_write(const char* path, const char* temp, uint32 magic, int64 value,
                         int elevel) {
    ValueFileData data{magic, kValueFileVersion, value, 0};
    data.crc = value_crc(data);
    FILE* file = durable_file_create(temp, elevel);
    return file != nullptr &&
           durable_file_close(file, temp, fwrite(&data, 1, sizeof data, file) == sizeof data,
                              elevel) &&
           durable_rename(temp, path, elevel) == 0;
}

ValueFile durable_value_read(const char* path, uint32 magic, int64* value) {
    const int fd = OpenTransientFile(path, O_RDONLY | PG_BINARY);
    if (fd < 0) {
        return errno == ENOENT ? ValueFile::kMissing : ValueFile::kDamaged;
    }
    ValueFileData data{};
    const bool read_all = read(fd, &data, sizeof data) == static_cast<ssize_t>(sizeof data);
    (void)CloseTransientFile(fd);
    if (!read_all || data.magic != magic || data.version != kValueFileVersion ||
        !EQ_CRC32C(data.crc, value_crc(data))) {
        return ValueFile::kDamaged;
    }
    *value = data.value;
    return ValueFile::kRead;
}

}  // namespace pg_throttle::pg
