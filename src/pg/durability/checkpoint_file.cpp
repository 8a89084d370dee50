#include "pg/durability/checkpoint_file.hpp"

#include "pg/durability/durable_file.hpp"

extern "C" {
#include "port/pg_crc32c.h"
#include "storage/fd.h"
}

namespace pg_throttle::pg {
namespace {

constexpr uint32 kMagic = 0x50475443;  // "PGTC"
constexpr uint32 kFormatVersion = 1;

struct FileHeader {
    uint32 magic;
    uint32 format_version;
    int64 records;
    int64 bytes;
    int64 taken_at;
};
static_assert(std::is_trivially_copyable_v<FileHeader>);

// Followed by name_len name bytes and holder_len holder bytes, padded to 8.
struct Record {
    Oid dbid;
    uint8 name_len;
    uint8 holder_len;
    uint8 clock;  // the key's EntryClock; 0 (real) in files of before it
    // kBornFlag: born under a crash rule and not granted since
    // (RegistryEntry::born); 0 in files of before it.
    uint8 flags;
    int32 holder_pid;
    Oid owner;  // 0 in files of before owners: counted against the database only
    int64 granted_at;
    int64 expires_at;
};
static_assert(std::is_trivially_copyable_v<Record>);
static_assert(sizeof(Record) == 32);

constexpr uint8 kBornFlag = 1;

size_t record_size(size_t name_len, size_t holder_len) {
    return TYPEALIGN(8, sizeof(Record) + name_len + holder_len);
}

// Checks and decodes the record at `pos`; false when it runs past `end`.
bool decode(const char* pos, const char* end, RegistryEntry* entry, size_t* size) {
    if (end - pos < static_cast<ptrdiff_t>(sizeof(Record))) {
        return false;
    }
    Record record;
    memcpy(&record, pos, sizeof record);
    *size = record_size(record.name_len, record.holder_len);
    if (record.name_len == 0 || record.name_len > core::kMaxNameBytes ||
        record.holder_len > core::kMaxHolderBytes ||
        record.clock > static_cast<uint8>(EntryClock::kTest) || (record.flags & ~kBornFlag) != 0 ||
        end - pos < static_cast<ptrdiff_t>(*size)) {
        return false;
    }
    memset(entry, 0, sizeof *entry);
    entry->key.dbid = record.dbid;
    entry->key.kind = static_cast<uint8>(EntryKind::kResource);
    entry->key.name_len = record.name_len;
    entry->key.clock = record.clock;
    memcpy(entry->key.name, pos + sizeof record, record.name_len);
    memcpy(entry->holder, pos + sizeof record + record.name_len, record.holder_len);
    entry->holder_pid = record.holder_pid;
    entry->owner = record.owner;
    entry->granted_at = record.granted_at;
    entry->expires_at = record.expires_at;
    entry->born = (record.flags & kBornFlag) != 0;
    return true;
}

}  // namespace

void record_buffer_init(RecordBuffer* buffer, int64 entries, size_t bytes_per_record) {
    buffer->capacity = static_cast<size_t>(entries) * bytes_per_record + 65536;
    buffer->data =
        static_cast<char*>(palloc_extended(buffer->capacity, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO));
    buffer->used = 0;
    buffer->count = 0;
    buffer->left_out = 0;
}

void record_buffer_add(RecordBuffer* buffer, const RegistryEntry& entry) {
    const size_t holder_len = strnlen(entry.holder, core::kMaxHolderBytes);
    const size_t size = record_size(entry.key.name_len, holder_len);
    if (buffer->capacity - buffer->used < size) {
        buffer->left_out++;
        return;
    }
    char* pos = buffer->data + buffer->used;
    const Record record{entry.key.dbid,
                        entry.key.name_len,
                        static_cast<uint8>(holder_len),
                        entry.key.clock,
                        static_cast<uint8>(entry.born ? kBornFlag : 0),
                        entry.holder_pid,
                        entry.owner,
                        entry.granted_at,
                        entry.expires_at};
    memcpy(pos, &record, sizeof record);
    memcpy(pos + sizeof record, entry.key.name, entry.key.name_len);
    memcpy(pos + sizeof record + entry.key.name_len, entry.holder, holder_len);
    buffer->used += size;  // the padding was zeroed with the buffer
    buffer->count++;
}

bool checkpoint_file_write(const char* path, const RecordBuffer& buffer, core::Micros taken_at) {
    FILE* file = durable_file_create(path, LOG);
    if (file == nullptr) {
        return false;
    }
    const FileHeader header{kMagic, kFormatVersion, buffer.count, static_cast<int64>(buffer.used),
                            taken_at};
    pg_crc32c crc = 0;
    INIT_CRC32C(crc);
    COMP_CRC32C(crc, &header, sizeof header);
    COMP_CRC32C(crc, buffer.data, buffer.used);
    FIN_CRC32C(crc);
    const bool written = fwrite(&header, 1, sizeof header, file) == sizeof header &&
                         fwrite(buffer.data, 1, buffer.used, file) == buffer.used &&
                         fwrite(&crc, 1, sizeof crc, file) == sizeof crc;
    return durable_file_close(file, path, written, LOG);
}

const char* checkpoint_file_read(const char* path, void (*restore)(const RegistryEntry&, void*),
                                 void* ctx, core::Micros* taken_at, bool* found) {
    *found = false;
    FILE* file = AllocateFile(path, PG_BINARY_R);
    if (file == nullptr) {
        return errno == ENOENT ? nullptr : "it could not be opened";
    }
    *found = true;
    FileHeader header{};
    const char* problem = nullptr;
    char* data = nullptr;
    if (fread(&header, 1, sizeof header, file) != sizeof header) {
        problem = "it is truncated";
    } else if (header.magic != kMagic || header.format_version != kFormatVersion) {
        problem = "it is not a checkpoint of this version of pg_throttle";
    } else if (header.records < 0 || header.bytes < 0 ||
               header.bytes > static_cast<int64>(MaxAllocHugeSize)) {
        problem = "it is damaged";
    } else {
        data = static_cast<char*>(palloc_extended(static_cast<Size>(header.bytes) + 1,
                                                  MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM));
        pg_crc32c crc = 0;
        pg_crc32c stored = 0;
        INIT_CRC32C(crc);
        COMP_CRC32C(crc, &header, sizeof header);
        if (data == nullptr) {
            problem = "it is too large to read";
        } else if (fread(data, 1, header.bytes, file) != static_cast<size_t>(header.bytes) ||
                   fread(&stored, 1, sizeof stored, file) != sizeof stored) {
            problem = "it is truncated";
        } else {
            COMP_CRC32C(crc, data, header.bytes);
            FIN_CRC32C(crc);
            if (!EQ_CRC32C(crc, stored)) {
                problem = "its checksum does not match";
            }
        }
    }
    FreeFile(file);
    // Checked: decode every record before restoring any.
    const char* end = data == nullptr ? nullptr : data + header.bytes;
    for (int pass = 0; problem == nullptr && pass < 2; pass++) {
        const char* pos = data;
        for (int64 i = 0; i < header.records; i++) {
            RegistryEntry entry;
            size_t size = 0;
            if (!decode(pos, end, &entry, &size)) {
                problem = "it is damaged";
                break;
            }
            if (pass == 1) {
                restore(entry, ctx);
            }
            pos += size;
        }
    }
    if (data != nullptr) {
        pfree(data);
    }
    if (problem == nullptr) {
        *taken_at = header.taken_at;
    }
    return problem;
}

}  // namespace pg_throttle::pg
