// The pure core first: it refuses to compile after PostgreSQL's headers.
#include "core/sync_standbys.hpp"

#include "pg/server/compat.hpp"
#include "pg/durability/sync_standbys.hpp"

extern "C" {
#include "access/xlog.h"
#include "replication/walsender.h"
#include "utils/wait_event.h"
}

namespace pg_throttle::pg {
namespace {

// The WAL position the synchronous standbys have confirmed as flushed.
XLogRecPtr confirmed_flush() {
    LWLockAcquire(SyncRepLock, LW_SHARED);
    const XLogRecPtr confirmed = WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH];
    LWLockRelease(SyncRepLock);
    return confirmed;
}

// Whether the walsenders wait for synchronous standbys, read the way the
// running server's minor version (server_version_num) says.
bool sync_standbys_defined() {
    const bool names_set = SyncRepStandbyNames != nullptr && SyncRepStandbyNames[0] != '\0';
    return core::sync_standbys_defined(
        compat_sync_standbys_byte(),
        core::server_has_sync_standbys_flags(compat_server_version_num()), names_set);
}

}  // namespace

void wait_for_sync_standbys(XLogRecPtr lsn) {
    XLogFlush(lsn);
    if (max_wal_senders == 0) {
        return;
    }
    // PostgreSQL's own SyncRepWaitForLSN serves commits: it follows the
    // session's synchronous_commit and turns a cancel into a WARNING (the
    // commit has happened). Here nothing has been promised yet, so the wait
    // is our own: poll the confirmed position, and let a cancel raise.
    for (;;) {
        if (!sync_standbys_defined() || confirmed_flush() >= lsn) {
            return;
        }
        CHECK_FOR_INTERRUPTS();
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 1,
                        WAIT_EVENT_SYNC_REP);
        ResetLatch(MyLatch);
    }
}

}  // namespace pg_throttle::pg
