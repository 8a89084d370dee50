#include "pg/durability/wal.hpp"

#include "pg/durability/fence.hpp"

extern "C" {
#include "access/xlog_internal.h"
#include "access/xloginsert.h"
#include "access/xlogreader.h"
}

namespace pg_throttle::pg {
namespace {

constexpr RmgrId kRmgrId = RM_EXPERIMENTAL_ID;
// Record types, in the high bits of xl_info.
constexpr uint8 kFenceLimit = 0x10;
constexpr uint8 kLease = 0x20;

uint8 info_of(XLogReaderState* record) {
    return XLogRecGetInfo(record) & ~XLR_INFO_MASK;
}

void redo(XLogReaderState* record) {
    const uint8 info = info_of(record);
    const uint32 len = XLogRecGetDataLen(record);
    if (info == kFenceLimit && len == sizeof(int64)) {
        int64 limit = 0;
        memcpy(&limit, XLogRecGetData(record), sizeof limit);
        fence_redo_limit(limit);
    } else if (LeaseRecord lease;
               info == kLease && lease_record_read(XLogRecGetData(record), len, &lease)) {
        lease_journal_redo(lease);  // a record of before owners has none
    } else {
        elog(PANIC, "pg_throttle redo: unknown record (info %u, %u bytes)", info, len);
    }
}

void desc(StringInfo buf, XLogReaderState* record) {
    const uint8 info = info_of(record);
    if (info == kFenceLimit && XLogRecGetDataLen(record) == sizeof(int64)) {
        int64 limit = 0;
        memcpy(&limit, XLogRecGetData(record), sizeof limit);
        appendStringInfo(buf, "limit " INT64_FORMAT, limit);
    } else if (LeaseRecord lease;
               info == kLease &&
               lease_record_read(XLogRecGetData(record), XLogRecGetDataLen(record), &lease)) {
        appendStringInfo(buf, "db %u name %.*s seq " INT64_FORMAT " token " INT64_FORMAT,
                         lease.dbid, static_cast<int>(lease.name_len), lease.name, lease.seq,
                         lease.token);
    }
}

const char* identify(uint8 info) {
    switch (info & ~XLR_INFO_MASK) {
        case kFenceLimit:
            return "RAISE_LIMIT";
        case kLease:
            return "LEASE";
        default:
            return nullptr;
    }
}

RmgrData rmgr = {"pg_throttle", redo, desc, identify, nullptr, nullptr, nullptr, nullptr};

XLogRecPtr insert(uint8 info, const void* data, size_t len) {
    XLogBeginInsert();
    XLogRegisterData(static_cast<char*>(const_cast<void*>(data)), static_cast<int>(len));
    return XLogInsert(kRmgrId, info);
}

}  // namespace

void wal_register() {
    RegisterCustomRmgr(kRmgrId, &rmgr);
}

XLogRecPtr wal_log_fence_limit(int64 limit) {
    return insert(kFenceLimit, &limit, sizeof limit);
}

XLogRecPtr wal_log_lease(const LeaseRecord& record) {
    return insert(kLease, &record, sizeof record);
}

}  // namespace pg_throttle::pg
